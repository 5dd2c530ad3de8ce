from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer_payload.bootstrap import (
    bootstrap,
    install_command,
    missing_requirements,
    pinned_requirements,
)
from trainer_payload.protocol import read_events


def test_requirements_are_pinned_and_never_include_torch() -> None:
    pins = pinned_requirements()
    names = {name.lower() for name, _ in pins}
    assert {"transformers", "peft", "trl", "accelerate", "bitsandbytes"} <= names
    assert "torch" not in names


def test_test_environment_has_every_pinned_package() -> None:
    assert missing_requirements(pinned_requirements()) == []
    assert missing_requirements([("surely-not-installed-pkg", "1.0")]) == ["surely-not-installed-pkg==1.0"]


def test_install_uses_this_interpreter() -> None:
    command = install_command(["x==1"])
    assert sys.executable in command and command[-1] == "x==1"


def test_bootstrap_on_a_ready_machine_reports_and_is_quick(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "job.json").write_text(
        json.dumps({"base_model": "model", "train_file": "t.jsonl", "output_dir": "out"})
    )
    assert bootstrap(tmp_path / "job.json") == 0
    events, _ = read_events(tmp_path / "out" / "events.jsonl")
    states = [e["state"] for e in events if e["event"] == "state"]
    assert states == ["installing", "downloading", "preparing"]
    assert events[0]["missing"] == [] and events[0]["torch"]
    assert events[-1]["detail"] == "machine ready"
