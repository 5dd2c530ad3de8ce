"""Atomic writes and Windows text encodings, on real files: a failed write never leaves a file that looks complete."""

from __future__ import annotations

import codecs
import errno
import os
from pathlib import Path

import pytest

from desktop.core.runs.draft import RunDraft
from desktop.services.platform.files import atomic_write_text, read_text
from desktop.services.runs.drafts import load_draft, save_draft, write_spec_toml


def disk_full(_fd: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old\n")
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.txt"
    path.write_text("old\n")
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_failed_spec_toml_write_keeps_the_previous_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "SPEC.toml"
    write_spec_toml(RunDraft(base_model="org/first"), path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        write_spec_toml(RunDraft(base_model="org/second"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["SPEC.toml"]


def test_a_failed_draft_save_keeps_the_previous_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "wizard_draft.json"
    save_draft(RunDraft(base_model="org/first"), path)
    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        save_draft(RunDraft(base_model="org/second"), path)
    assert load_draft(path).base_model == "org/first"
    assert [p.name for p in tmp_path.iterdir()] == ["wizard_draft.json"]


@pytest.mark.parametrize(
    "data",
    [
        "[model]\nbase = 'é'\n".encode(),
        codecs.BOM_UTF8 + "[model]\nbase = 'é'\n".encode(),
        codecs.BOM_UTF16_LE + "[model]\nbase = 'é'\n".encode("utf-16-le"),
        codecs.BOM_UTF16_BE + "[model]\nbase = 'é'\n".encode("utf-16-be"),
    ],
    ids=["utf-8", "utf-8-bom", "utf-16-le", "utf-16-be"],
)
def test_read_text_understands_windows_encodings(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "SPEC.toml"
    path.write_bytes(data)
    assert read_text(path) == "[model]\nbase = 'é'\n"
