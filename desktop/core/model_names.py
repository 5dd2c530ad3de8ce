"""A base model's name for people: a Hub id as it is, a model folder on this computer by the name it is known by.

A local folder's full path is too long for a table cell or a title (cut at its end, it keeps the least telling
part: "/home/alexandra/models/hugg…"), so lists and titles show :func:`model_name` and keep the full path for
a tooltip. A Hugging Face cache snapshot (``…/models--ORG--NAME/snapshots/<hash>``) is named by its Hub id.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath

_HUB_CACHE = re.compile(r"^models--(?P<org>[^/\\]+?)--(?P<name>[^/\\]+)$")
#: What follows the name of a model folder on this computer.
LOCAL_SUFFIX = " (local folder)"


def is_local_model(base: str) -> bool:
    """Whether ``base`` is a folder on this computer rather than a Hub id (``org/name``)."""
    if base.startswith(("/", "~", ".")) or "\\" in base or base.count("/") > 1:
        return True
    return re.match(r"^[A-Za-z]:", base) is not None  # a Windows drive


def model_name(base: str, *, mark_local: bool = True) -> str:
    """The name a model is known by: a Hub id unchanged; a folder by its last part, or a cache snapshot's Hub id.

    Args:
        base: A Hub id or a model folder's path.
        mark_local: Whether a folder's name says it is one (``SmolLM2-135M-Instruct (local folder)``).
    """
    if not is_local_model(base):
        return base
    path = PureWindowsPath(base) if "\\" in base else PurePosixPath(base)
    parts = [part for part in path.parts if part not in ("/", "\\")]
    for index in range(len(parts) - 1, -1, -1):
        found = _HUB_CACHE.match(parts[index])
        if found is not None:
            name = f"{found['org']}/{found['name']}"
            break
    else:
        name = path.name or base
    return name + (LOCAL_SUFFIX if mark_local else "")
