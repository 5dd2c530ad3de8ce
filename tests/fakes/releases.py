"""A fake GitHub releases API: ``GET /repos/{owner}/{repo}/releases/latest`` as GitHub documents it.

The answer holds ``tag_name`` and ``html_url`` (what Rentune reads) among GitHub's other fields; a repository with no
release answers 404 ``{"message": "Not Found"}``.
"""

from __future__ import annotations

from pathlib import Path

from tests.fakes.http import FakeCloud, FakeRequest, FakeResponse


class FakeReleases(FakeCloud):
    """Serves the latest release of one repository (``latest`` None: it has none yet)."""

    def __init__(self, root: Path, latest: str | None = "v0.2.0") -> None:
        super().__init__(root)
        self.latest = latest

    def handle(self, request: FakeRequest) -> FakeResponse:
        """Answers the latest-release endpoint."""
        if request.method != "GET" or not request.path.endswith("/releases/latest") or self.latest is None:
            return FakeResponse(404, {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"})
        tag = self.latest
        return FakeResponse(
            200,
            {
                "tag_name": tag,
                "name": f"Rentune {tag}",
                "html_url": f"https://github.com/rentune/rentune/releases/tag/{tag}",
                "draft": False,
                "prerelease": False,
                "assets": [],
            },
        )
