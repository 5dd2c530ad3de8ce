"""[tracking]: the spec's trackers (TensorBoard, trackio, W&B), the job keys the machine reads, where a run's newest
logs are at home, rentune tensorboard's and rentune trackio's words when a run has none, the payload's tracker logs in
each checkpoint, its tracker locks, and the W&B key: refused before renting when missing, sent only to the trainer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from desktop.cli import main
from desktop.core.runs.spec import RunSpecError, run_spec_from_dict
from desktop.services.runs.snapshot import local_files
from desktop.services.runs.store import RunStore
from trainer_payload.protocol import CHECKPOINT_MARKER, JobSpec, JobSpecError

BASE: dict[str, Any] = {"model": {"base": "org/tiny"}, "data": {"train": "train.jsonl"}, "target": {"ssh": "ssh://u@h"}}


def test_tracking_sets_the_job_keys_and_refuses_what_the_payload_cannot_send_to(tmp_path: Path) -> None:
    table = {"report_to": ["tensorboard", "trackio", "wandb", "trackio"], "project": "support-bot"}
    spec = run_spec_from_dict({**BASE, "tracking": {**table, "wandb_url": "http://wandb.local:8080"}}, tmp_path)
    assert spec.training["report_to"] == ["tensorboard", "trackio", "wandb"]
    assert spec.training["tracking_project"] == "support-bot"
    assert spec.training["wandb_url"] == "http://wandb.local:8080"
    assert "report_to" not in run_spec_from_dict(BASE, tmp_path).training
    for table, words in [
        ({"report_to": ["mlflow"]}, "report_to 'mlflow': runs report to tensorboard, trackio, wandb"),
        ({"report_to": "tensorboard"}, 'must be a list, like report_to = ["tensorboard"]'),
        ({"entity": "x"}, "[tracking] does not know entity; it takes report_to, project, wandb_url"),
        ({"project": 3}, "[tracking] project = 3 must be a string"),
        ({"project": "my project"}, "tracking_project 'my project' must be 1 to 64 letters"),
        ({"wandb_url": "wandb.local"}, "wandb_url 'wandb.local' must be an http(s) address"),
    ]:
        with pytest.raises(RunSpecError, match=re.escape(words)):
            run_spec_from_dict({**BASE, "tracking": table}, tmp_path)
    with pytest.raises(RunSpecError, match=re.escape("[training] cannot set run_name")):
        run_spec_from_dict({**BASE, "training": {"run_name": "x"}}, tmp_path)
    job = {"base_model": "b", "train_file": "t", "output_dir": "o"}
    with pytest.raises(JobSpecError, match="report_to 'neptune'"):
        JobSpec.from_dict({**job, "report_to": ["neptune"]})
    with pytest.raises(JobSpecError, match=re.escape("run_name '../x' must be")):  # the machine names files by it
        JobSpec.from_dict({**job, "run_name": "../x"})


def test_the_newest_event_files_at_home_are_the_adapters_else_the_newest_checkpoints(tmp_path: Path) -> None:
    store = RunStore()
    record = store.create({"base_model": "b", "training": {}}, "ssh://u@h:22")
    folder = store.folder(record.id)
    assert local_files(store, record).tensorboard is None
    for step in (10, 20, 30):
        logs = folder / "checkpoints" / f"checkpoint-{step}" / "tensorboard"
        logs.mkdir(parents=True)
        if step != 30:  # the newest is still coming home: not complete, not shown
            (logs.parent / CHECKPOINT_MARKER).write_text("{}")
    assert local_files(store, record).tensorboard == folder / "checkpoints" / "checkpoint-20" / "tensorboard"
    adapter = folder / "adapter"
    (adapter / "tensorboard").mkdir(parents=True)
    record = store.update(record.id, adapter=str(adapter))
    assert local_files(store, record).tensorboard == adapter / "tensorboard"


def test_rentune_tensorboard_of_a_run_without_event_files_says_how_a_run_gets_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = RunStore().create({"base_model": "b", "training": {}}, "ssh://u@h:22").id
    assert main(["tensorboard", run_id]) == 2
    err = capsys.readouterr().err
    assert (
        f"run {run_id} has no TensorBoard event files here" in err and '[tracking] report_to = ["tensorboard"]' in err
    )


def test_rentune_trackio_of_a_run_without_a_database_or_of_no_run_says_what_to_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = RunStore().create({"base_model": "b", "training": {}}, "ssh://u@h:22").id
    assert main(["trackio", run_id]) == 2
    err = capsys.readouterr().err
    assert f"run {run_id} has no trackio database here" in err and '[tracking] report_to = ["trackio"]' in err
    assert main(["trackio", "no-such-run"]) == 2
    assert "or give a folder holding a trackio database" in capsys.readouterr().err
