"""The names Rentune gives the machines it rents, and who a name belongs to.

A machine is named ``rentune-<installation>-<run id>``: the installation id (8 hex digits, made once per Rentune
installation and kept in its settings) tells this computer's machines from those another computer rents on the same
account. A name from before installation ids (``rentune-<run id>``) counts as this installation's. Every label stays
within the shortest name limit of the providers (Vast's 64 characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The prefix of every machine Rentune rents.
MACHINE_PREFIX = "rentune-"
#: The shortest machine-name limit among the providers.
MAX_LABEL_LENGTH = 64

_INSTALLATION = r"[0-9a-f]{8}"
_RUN_ID = r"\d{8}-\d{6}-[0-9a-f]{4}"
_LABEL = re.compile(rf"rentune-(?:(?P<installation>{_INSTALLATION})-)?(?P<run_id>{_RUN_ID})")
INSTALLATION_ID = re.compile(rf"^{_INSTALLATION}$")


@dataclass(frozen=True)
class MachineLabel:
    """Who a machine named by Rentune belongs to.

    Attributes:
        installation: The installation that rented it (None: a name from before installation ids).
        run_id: The run it was rented for.
    """

    installation: str | None
    run_id: str

    def belongs_to(self, installation: str) -> bool:
        """Whether the machine is ``installation``'s (an old-style name counts as this installation's)."""
        return self.installation is None or self.installation == installation


def machine_label(installation: str, run_id: str) -> str:
    """The name of a machine rented by ``installation`` for ``run_id``.

    Raises:
        ValueError: The installation id or run id is not of Rentune's shape.
    """
    if not INSTALLATION_ID.match(installation):
        raise ValueError(f"installation id {installation!r} is not 8 hex digits")
    label = f"{MACHINE_PREFIX}{installation}-{run_id}"
    if _LABEL.fullmatch(label) is None or len(label) > MAX_LABEL_LENGTH:
        raise ValueError(f"run id {run_id!r} is not a Rentune run id")
    return label


def parse_label(name: str) -> MachineLabel | None:
    """Who a machine name belongs to; None for a name Rentune did not give."""
    match = _LABEL.fullmatch(name)
    if match is None:
        return None
    return MachineLabel(match["installation"], match["run_id"])
