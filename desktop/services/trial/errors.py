"""The one error a trial raises: what went wrong and what to do, in words for the user."""

from __future__ import annotations


class TrialError(RuntimeError):
    """A trial could not start or did not finish; the message names the problem and the fix."""
