"""What every local tool shares: outputs that appear whole or not at all, and a clear word when the disk is full."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from desktop.services.local.common import (
    LocalToolError,
    finished_file,
    finished_folder,
    require_free_space,
    run_program,
)
from desktop.services.local.merge import merge_adapter
from tests.fixtures.adapters import TrainedAdapter


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


def test_a_failed_folder_leaves_the_last_good_one(tmp_path: Path) -> None:
    target = tmp_path / "merged"
    with finished_folder(target) as work:
        (work / "model.safetensors").write_text("good")
    with pytest.raises(RuntimeError), finished_folder(target) as work:
        (work / "model.safetensors").write_text("half")
        raise RuntimeError("the step failed")
    assert (target / "model.safetensors").read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]


def test_a_file_appears_only_when_written(tmp_path: Path) -> None:
    target = tmp_path / "model.gguf"
    with pytest.raises(LocalToolError, match=r"model\.gguf was not written"), finished_file(target):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_named_with_the_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: _Usage(10**10, 10**10 - 10**8, 10**8))
    with pytest.raises(
        LocalToolError, match=r"not enough disk space for the merged model: it needs 2\.00 GB, .* 0\.10 GB"
    ):
        require_free_space(tmp_path / "out", 2 * 10**9, "the merged model")


def test_a_merge_that_would_not_fit_on_disk_starts_nothing(
    pattern_adapter: TrainedAdapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: _Usage(10**6, 10**6 - 10, 10))
    with pytest.raises(LocalToolError, match="not enough disk space for the merged model"):
        asyncio.run(merge_adapter(pattern_adapter.base, pattern_adapter.path, tmp_path / "merged"))
    assert list(tmp_path.iterdir()) == []


_PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def test_child_processes_never_see_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RUNPOD_API_KEY", "VAST_API_KEY", "LAMBDA_API_KEY", "HF_TOKEN", "GITHUB_TOKEN", "MY_SECRET_FILE"):
        monkeypatch.setenv(name, f"value-of-{name.lower()}")
    monkeypatch.setenv("RENTUNE_CHILD_CHECK", "kept")
    inherited = json.loads(asyncio.run(run_program([sys.executable, "-c", _PRINT_ENV], what="printing env")))
    given = os.environ | {"HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "sk-given-to-the-child"}  # as merge and pip pass it
    passed = json.loads(asyncio.run(run_program([sys.executable, "-c", _PRINT_ENV], env=given, what="printing env")))
    for env in (inherited, passed):
        assert env["RENTUNE_CHILD_CHECK"] == "kept"
        assert not [name for name in env if name.endswith(("_API_KEY", "_TOKEN")) or "SECRET" in name]
        assert not [value for value in env.values() if value.startswith(("value-of-", "sk-given"))]
    assert passed["HF_HUB_OFFLINE"] == "1"
