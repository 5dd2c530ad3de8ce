"""The opt-in update check against a fake GitHub releases API: newer, same, none, offline; nothing downloaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop import __version__
from desktop.cli import main
from desktop.services.platform.updates import RELEASES_URL_ENV, UpdateCheckError, check_for_update, version_key
from tests.fakes.releases import FakeReleases


@pytest.fixture
def releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeReleases]:
    fake = FakeReleases(tmp_path / "releases")
    monkeypatch.setenv(RELEASES_URL_ENV, fake.serve() + "/repos/rentune/rentune/releases/latest")
    yield fake
    fake.close()


def test_versions_sort_as_numbers() -> None:
    assert version_key("v0.10.0") > version_key("0.9.3") > version_key("0.9")
    with pytest.raises(UpdateCheckError, match="not a version number"):
        version_key("nightly")


async def test_a_newer_release_is_named_with_its_page(releases: FakeReleases) -> None:
    releases.latest = "v99.0.0"
    found = await check_for_update()
    assert found.newer and found.current == __version__ and found.newest == "99.0.0"
    assert found.words() == (
        f"Rentune 99.0.0 is available (you have {__version__}): https://github.com/rentune/rentune/releases/tag/v99.0.0"
    )
    assert [r.method for r in releases.requests] == ["GET"], "one request; nothing downloaded"


async def test_the_same_release_is_not_newer(releases: FakeReleases) -> None:
    releases.latest = f"v{__version__}"
    found = await check_for_update()
    assert not found.newer and found.words() == f"Rentune {__version__} is the newest release."


async def test_no_release_or_no_network_is_a_sentence(releases: FakeReleases, monkeypatch: pytest.MonkeyPatch) -> None:
    releases.latest = None
    with pytest.raises(UpdateCheckError, match="answered 404; try again later"):
        await check_for_update()
    monkeypatch.setenv(RELEASES_URL_ENV, "http://127.0.0.1:9/releases/latest")
    with pytest.raises(UpdateCheckError, match=r"could not reach .* check the connection"):
        await check_for_update()


def test_the_cli_says_it_in_one_line_or_json(releases: FakeReleases, capsys: pytest.CaptureFixture[str]) -> None:
    releases.latest = "v99.0.0"
    assert main(["update-check"]) == 0
    assert capsys.readouterr().out.startswith("Rentune 99.0.0 is available")
    assert main(["update-check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "current": __version__,
        "newest": "99.0.0",
        "newer": True,
        "url": "https://github.com/rentune/rentune/releases/tag/v99.0.0",
    }
    releases.latest = None
    assert main(["update-check"]) == 1
    assert capsys.readouterr().err.startswith("rentune: error: ")
