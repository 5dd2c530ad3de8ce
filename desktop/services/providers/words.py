"""A provider's failure in words for the app's pages: the provider's own reason, without command-line advice.

Provider errors carry fixes for the terminal ("run rentune keys set runpod"); a page gives its own fix instead.
"""

from __future__ import annotations

import re

from desktop.services.providers.base import ProviderError

# A clause that tells the user to run a command or set a variable: "; run rentune keys set runpod (or set X)".
_TERMINAL_ADVICE = re.compile(
    r"[;,]?\s*(?:run |see |with |or )?(?:rentune|RENTUNE_)[^;]*|[;,]?\s*\(or set [A-Z_]+\)|;\s*store a valid one[^;]*"
)


def without_terminal_advice(text: str) -> str:
    """``text`` without the clauses that tell the user to run a command or set a variable."""
    return _TERMINAL_ADVICE.sub("", text).strip(" ;,.")


def plain_reason(exc: ProviderError) -> str:
    """The provider's reason for ``exc``, without advice meant for the terminal; never empty."""
    return without_terminal_advice(exc.reason) or "no reason given"
