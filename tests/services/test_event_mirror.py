"""The local mirror of a run's events: each event once, in order, whatever a crash left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from desktop.cli import main
from desktop.services.runs.events import append_mirror, mirrored_events
from desktop.services.runs.store import RunStore
from trainer_payload.protocol import EVENTS_FILE_NAME


def step(seq: int) -> dict[str, Any]:
    return {"ts": 1_760_000_000.0 + seq, "seq": seq, "event": "step", "step": seq, "loss": 1.0 / seq}


def test_appending_events_the_mirror_already_holds_repeats_none(tmp_path: Path) -> None:
    assert append_mirror(tmp_path, [step(1), step(2), step(3)]) == 3
    # A crash after mirroring but before the offset was saved: the same events are read again.
    assert append_mirror(tmp_path, [step(2), step(3), step(4)]) == 4
    assert [e["seq"] for e in mirrored_events(tmp_path)] == [1, 2, 3, 4]
    lines = (tmp_path / EVENTS_FILE_NAME).read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3, 4]


def test_a_torn_last_line_is_cut_before_appending_and_skipped_when_reading(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE_NAME
    path.write_text(json.dumps(step(1)) + "\n" + json.dumps(step(2))[:25])  # this computer died mid-write
    assert [e["seq"] for e in mirrored_events(tmp_path)] == [1]
    assert append_mirror(tmp_path, [step(2), step(3)]) == 3
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_readers_skip_garbage_and_repeats_left_by_older_versions(tmp_path: Path) -> None:
    lines = [json.dumps(step(1)), "garbage", json.dumps(step(2)), json.dumps(step(2)), json.dumps(step(1)), "{"]
    (tmp_path / EVENTS_FILE_NAME).write_text("\n".join(lines) + "\n")
    assert [e["seq"] for e in mirrored_events(tmp_path)] == [1, 2]


@pytest.mark.parametrize("command", [["status"], ["logs"]])
def test_status_and_logs_show_a_run_whose_mirror_ends_in_a_torn_line(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    run_id = store.create({"base_model": "tiny", "training": {}}, "ssh://me@127.0.0.1:22").id
    (store.folder(run_id) / EVENTS_FILE_NAME).write_text(json.dumps(step(1)) + '\n{"ts": 2, "seq": 2, "ev')
    assert main([*command, run_id]) == 0
    assert "step 1: loss 1.0000" in capsys.readouterr().out
