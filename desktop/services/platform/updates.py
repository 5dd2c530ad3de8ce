"""The opt-in update check: the newest release tag against the running version, said, never downloaded.

Asked only when the user turned it on (Settings, ``check_for_updates``) or runs ``rentune update-check``. It reads
GitHub's "latest release" endpoint (``GET /repos/{owner}/{repo}/releases/latest``: ``tag_name``, ``html_url``);
``RENTUNE_RELEASES_URL`` points it elsewhere (a mirror, or a test's server).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import httpx

from desktop import __version__

#: The releases of the Rentune repository, GitHub's latest-release endpoint.
RELEASES_URL = "https://api.github.com/repos/rentune/rentune/releases/latest"
RELEASES_URL_ENV = "RENTUNE_RELEASES_URL"
_VERSION = re.compile(r"^v?(\d+(?:\.\d+){0,3})")


class UpdateCheckError(Exception):
    """The newest release could not be read; the message says why and what to do."""


@dataclass(frozen=True)
class UpdateCheck:
    """What the check found.

    Attributes:
        current: The running version.
        newest: The newest release's version (from its tag).
        url: The release's page, where the user downloads it.
    """

    current: str
    newest: str
    url: str

    @property
    def newer(self) -> bool:
        """Whether the newest release is newer than the running version."""
        return version_key(self.newest) > version_key(self.current)

    def words(self) -> str:
        """One sentence for the status bar or the terminal."""
        if self.newer:
            return f"Rentune {self.newest} is available (you have {self.current}): {self.url}"
        return f"Rentune {self.current} is the newest release."


def version_key(text: str) -> tuple[int, ...]:
    """``1.2.10`` (or the tag ``v1.2.10``) as a tuple that sorts as versions do.

    Raises:
        UpdateCheckError: It does not start with a version number.
    """
    found = _VERSION.match(text.strip())
    if not found:
        raise UpdateCheckError(f"the release tag {text!r} is not a version number")
    return tuple(int(part) for part in found.group(1).split("."))


async def check_for_update(*, transport: httpx.AsyncBaseTransport | None = None, wait_s: float = 10.0) -> UpdateCheck:
    """Asks for the newest release and compares it with the running version.

    Raises:
        UpdateCheckError: Offline, refused, or an answer without a tag; the message names the address.
    """
    url = os.environ.get(RELEASES_URL_ENV) or RELEASES_URL
    headers = {"Accept": "application/vnd.github+json", "User-Agent": f"rentune/{__version__}"}
    try:
        async with httpx.AsyncClient(transport=transport, timeout=wait_s, headers=headers) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise UpdateCheckError(f"could not reach {url} ({type(exc).__name__}); check the connection") from exc
    if response.status_code != 200:
        raise UpdateCheckError(f"{url} answered {response.status_code}; try again later")
    try:
        release = response.json()
        tag, page = str(release["tag_name"]), str(release.get("html_url") or url)
    except (ValueError, KeyError, TypeError) as exc:
        raise UpdateCheckError(f"{url} sent no release tag; try again later") from exc
    version_key(tag)
    return UpdateCheck(__version__, tag.removeprefix("v"), page)
