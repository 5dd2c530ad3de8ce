"""The monitor's words on their own (no Qt): every event and transition in readable sentences, the progress line's
measures, the cost against the estimate, the questions before Stop and Resume.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from desktop.core.runs.progress import RunProgress
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Rental
from desktop.services.billing.spend import RunSpend
from desktop.services.runs.snapshot import LocalFiles, RunSnapshot
from desktop.services.runs.store import RunRecord
from desktop.services.runs.transfer import UploadProgress
from desktop.ui.pages import monitor_log, monitor_text
from desktop.ui.run_words import resume_question, state_badge

RAW = ("=", "[", "{", "--", "SIGTERM", "stopped_by")
RENTED = {"provider": "runpod", "gpu": "RTX 4090", "count": 1, "spot": True}


def record(state: RunState = RunState.TRAINING, **spec: Any) -> RunRecord:
    fields = {"base_model": "org/model", "training": {"method": "qlora"}, **spec}
    ids = {"id": "20261202-000000-abcd", "target": "ssh://me@gpu.example:22", "pid": 42}
    blank = {"host_key": None, "fingerprint": None, "remote_dir": None, "adapter": None, "error": None}
    counts = {"events_offset": 0, "last_seq": 0, "relaunches": 0, "started": 1000.0, "updated": 1000.0}
    return RunRecord(state=state, spec=fields, **ids, **blank, **counts)  # type: ignore[arg-type]


def snapshot(run: RunRecord, spend: RunSpend | None = None, **extra: Any) -> RunSnapshot:
    defaults: dict[str, Any] = {"transitions": [], "spend_problem": "", "files": LocalFiles((), None), "upload": None}
    values = {**defaults, **extra}
    return RunSnapshot(
        run, values["transitions"], spend, values["spend_problem"], values["files"], values["upload"], 1e9
    )


def event(event_kind: str, /, **fields: Any) -> dict[str, Any]:
    return {"ts": 1.0, "seq": 1, "event": event_kind, **fields}


@pytest.mark.parametrize(
    ("shown", "words"),
    [
        (
            event(
                "state",
                state="installing",
                step="check",
                python="3.11.7",
                gpus=["NVIDIA A100, 550, 80 GB"],
                detail="every package is installed",
            ),
            "Machine checked: NVIDIA A100, Python 3.11.7; every package is installed",
        ),
        (event("state", state="installing", step="check", detail="ready"), "Machine checked: no NVIDIA GPU; ready"),
        (
            event("state", state="installing", step="environment", detail="x"),
            "Creating the trainer's own Python environment",
        ),
        (
            event("state", state="installing", step="packages", detail="installing torch, trl"),
            "Installing the trainer's packages",
        ),
        (event("state", state="installing", step="packages", detail="Collecting torch"), None),
        (
            event("state", state="downloading", model="org/m", install_seconds=42.0),
            "Packages ready after 42 s; downloading the model org/m",
        ),
        (
            event("state", state="preparing", detail="machine ready", ready=True, ready_seconds=0.0),
            "Machine ready after 0 s",
        ),
        (event("state", state="preparing", detail="loading x"), "Loading the model and the data"),
        (
            event("state", state="training", examples=64, resume_from="checkpoint-20"),
            "Training on 64 examples, continuing from checkpoint-20",
        ),
        (
            event(
                "state",
                state="training",
                examples=8,
                tracking="W&B could not start the run (CommError: no); training goes on without it",
            ),
            "Training on 8 examples. W&B could not start the run (CommError: no); training goes on without it",
        ),
        (event("state", state="saving"), "Saving the adapter"),
        (event("state", state="done"), None),
        (event("state", state="failed", reason="oom"), None),
        (
            event("state", state="failed", reason="stopped by SIGTERM", stopped_by="signal", checkpoint_step=30),
            "The trainer saved a checkpoint at step 30 and stopped",
        ),
        (event("state", state="warming up"), "The trainer reports: warming up"),
        (event("step", step=21, total_steps=60, loss=2.5), "First step of this session: step 21 of 60, loss 2.5000"),
        (event("eval", step=10, eval_loss=1.25), "Eval loss 1.2500 at step 10"),
        (
            event("checkpoint", step=20, path="checkpoints/checkpoint-20", bytes=2_500_000, sha256={}),
            "Checkpoint at step 20 saved on the machine (2.5 MB)",
        ),
        (
            event("done", adapter_path="adapter", files={}, train_seconds=125.0, metrics={"final_loss": 0.5}),
            "Training done in 2 min 05 s: final loss 0.5000",
        ),
        (
            event("hold", step=1200, held=True),
            "Every GPU holds at step 1,200 while you decide (the machine bills meanwhile)",
        ),
        (
            event("hold", step=1200, held=False, outcome="continue", seconds=42.4),
            "Held 42 s: training goes on from step 1,200 on every GPU",
        ),
        (
            event("hold", step=30, held=False, outcome="stop", seconds=5.0),
            "Held 5 s: every GPU saves step 30 and stops",
        ),
        (
            event("hold", step=30, held=False, outcome="no_answer", seconds=720.0),
            "Held 720 s: no answer came in time: every GPU saves step 30 and stops",
        ),
        (
            event("error", kind="oom", message="CUDA out of memory", hint="reduce --seq-len"),
            "Out of GPU memory: CUDA out of memory. What to do: Lower the sequence length or the micro-batch size, "
            "use QLoRA, or choose a GPU with more memory.",
        ),
    ],
)
def test_every_event_reads_as_a_sentence(shown: dict[str, Any], words: str | None) -> None:
    assert monitor_log.event_text(shown) == words
    assert words is None or not any(raw in words for raw in RAW)


def row(state: str, note: str = "", ts: float = 100.0, from_state: str | None = None) -> dict[str, Any]:
    return {"ts": ts, "from_state": from_state, "to_state": state, "note": note}


NOBODY = monitor_log.StopContext(by_user=False, budget="", stop_steps=())


@pytest.mark.parametrize(
    ("transition", "stops", "last", "words"),
    [
        (row("planned", "created"), NOBODY, False, "Run created"),
        (row("bootstrapping"), NOBODY, False, "Setting up the machine: the trainer's packages and the model"),
        (
            row("training", "following the trainer already running (pid 7)"),
            NOBODY,
            False,
            "Following the trainer already running on the machine",
        ),
        (row("paused", "machine unreachable for 120 s"), NOBODY, False, "Paused: machine unreachable for 120 s"),
        (
            row("paused", "resumed from the newest checkpoint", from_state="cancelled"),
            NOBODY,
            False,
            "Resumed by you: continuing from the newest checkpoint",
        ),
        (
            row("finished", "adapter at /home/me/adapter"),
            NOBODY,
            False,
            "Finished: the adapter is on this computer, in /home/me/adapter",
        ),
        (
            row("cancelled", "stopped by SIGTERM (checkpoint saved at step 30)"),
            monitor_log.StopContext(True, "", ((99.5, 30),)),
            True,
            "Stopped by you — checkpoint at step 30 kept",
        ),
        (
            row("cancelled", "budget reached"),
            monitor_log.StopContext(False, "budget of $5.00 reached", ((99.0, 12),)),
            True,
            "Stopped at its budget — checkpoint at step 12 kept",
        ),
        (
            row("cancelled", "stopped before the trainer started"),
            monitor_log.StopContext(True, "", ()),
            True,
            "Stopped by you before training began",
        ),
        (
            row("cancelled", "stopped by SIGTERM (before training started)"),
            monitor_log.StopContext(True, "", ((99.0, None),)),
            True,
            "Stopped by you — no checkpoint had been written",
        ),
        (
            row("cancelled", "x", ts=50.0),
            monitor_log.StopContext(True, "", ((99.0, 30),)),
            False,
            "Stopped — no checkpoint had been written",
        ),
    ],
)
def test_every_transition_reads_as_a_sentence(
    transition: dict[str, Any], stops: monitor_log.StopContext, last: bool, words: str
) -> None:
    assert monitor_log.transition_text(transition, stops, last_stop=last) == words


def test_the_log_is_in_time_order_with_the_day_written_once() -> None:
    day = time.mktime((2026, 12, 2, 10, 0, 0, 0, 0, -1))
    entries = [monitor_log.LogEntry(day + 5, "second"), monitor_log.LogEntry(day, "first")]
    entries.append(monitor_log.LogEntry(day + 86_400, "next day"))
    lines = monitor_log.log_lines(entries)
    assert lines == [
        "— Wednesday 02 December 2026 —",
        "10:00:00  first",
        "10:00:05  second",
        "— Thursday 03 December 2026 —",
        "10:00:00  next day",
    ]


def test_the_stop_steps_come_from_the_field_or_the_checkpoint_before() -> None:
    milestones = [
        {"ts": 1.0, "seq": 1, "event": "checkpoint", "step": 10},
        {"ts": 2.0, "seq": 2, "event": "state", "state": "failed", "stopped_by": "signal"},
        {"ts": 3.0, "seq": 3, "event": "state", "state": "failed", "stopped_by": "signal", "checkpoint_step": 15},
    ]
    assert monitor_log.stop_steps(milestones) == ((2.0, 10), (3.0, 15))


def test_the_progress_line_measures_uploads_downloads_and_steps() -> None:
    uploading = record(RunState.UPLOADING)
    upload = UploadProgress(12_300_000, 200_000_000, 1, 7, 0.0)
    busy = monitor_text.busy(RunProgress(), snapshot(uploading, upload=upload))
    assert (busy.text, busy.value, busy.maximum) == (
        "Uploading the trainer and the data: 12.3 of 200.0 MB (6 %)",
        62,
        1000,
    )
    downloading = RunProgress(job_state="downloading", download_bytes=(1.2e9, 15e9))
    busy = monitor_text.busy(downloading, snapshot(record(RunState.BOOTSTRAPPING)))
    assert busy.text == "Downloading the model: 1.20 of 15.00 GB (8 %)" and busy.maximum == 1000
    unknown_size = RunProgress(job_state="downloading", download_bytes=(1.2e9, None))
    busy = monitor_text.busy(unknown_size, snapshot(record(RunState.BOOTSTRAPPING)))
    assert (busy.text, busy.maximum) == ("Downloading the model: 1.20 GB so far…", 0), "no made-up percentage"
    training = RunProgress(job_state="training", step=20, total_steps=60)
    assert monitor_text.busy(training, snapshot(record())).text == "Training: step 20 of 60 (33 %)"
    assert monitor_text.busy(RunProgress(), snapshot(record(RunState.PLANNED, compute=RENTED))).text.startswith(
        "Renting a machine"
    )


def rental(provider: str, price: float, started: float, stopped: float | None) -> Rental:
    return Rental(1, "r", provider, f"{provider}-1", "RTX 4090", price, started, stopped)


def test_a_rented_runs_machine_and_cost_against_its_estimate() -> None:
    current = {
        "provider": "vast",
        "instance_id": "vast-1",
        "gpu": "RTX 4090",
        "price_per_hour": 0.41,
        "spot": True,
        "offer_id": "o",
        "created": 0.0,
    }
    predicted = {"gpu": "rtx4090", "hours": 0.5, "usd": 0.2, "tokens_per_s": 5000.0}  # the catalog's id
    run = record(compute=RENTED, rental=current, predicted=predicted)
    rentals = (rental("runpod", 0.34, 0.0, 600.0), rental("vast", 0.41, 700.0, None))
    spend = RunSpend(run.id, 0.1, 0.41, billing=True, rented=True, rentals=rentals)
    rows = monitor_text.machine_rows(RunProgress(), snapshot(run, spend))
    assert rows.pop("idle").endswith("· no training yet")  # no history: every billed second went to waiting
    assert rows == {
        "machine": "Vast.ai · spot · machine 2 of this run",
        "gpu": "RTX 4090",
        "rate": "$0.41/h",
        "cost": "$0.10 of about $0.20 expected (50 %)",
        "estimate": "$0.20 for about 30 min 00 s on RTX 4090 at 5,000 tokens/s",
        "bucket": "",  # no bucket: the row stays hidden
    }
    marks = monitor_text.machine_marks(snapshot(run, spend))
    assert [(m.number, m.provider, m.stopped) for m in marks] == [(1, "runpod", 600.0), (2, "vast", None)]


def test_paid_idle_is_what_the_machines_billed_while_the_run_did_not_train_and_a_hold_counts_as_idle() -> None:
    run = record(compute=RENTED)
    now = 1e9  # the snapshot's moment
    history = [
        {"ts": now - 3600, "to_state": "provisioning"},
        {"ts": now - 3240, "to_state": "training"},  # 6 minutes to rent, set up and upload
    ]
    spend = RunSpend(run.id, 0.0, 0.0, billing=True, rented=True, rentals=(rental("runpod", 10.0, now - 3600, None),))
    progress = RunProgress()
    progress.apply({"seq": 1, "ts": now - 600, "event": "hold", "held": True})
    progress.apply({"seq": 2, "ts": now - 300, "event": "hold", "held": False, "outcome": "continue"})
    rows = monitor_text.machine_rows(progress, snapshot(run, spend, transitions=history))
    # $10 an hour: 6 min waiting and 5 min held are $1.83 of $10.00; 49 min of training for $10.00
    assert rows["idle"] == "$1.83 of $10.00 (18 %) · $12.24 per hour of training"
    own = monitor_text.machine_rows(RunProgress(), snapshot(record(hourly_rate_usd=2.4), spend=None))
    assert own["idle"] == "Shown for rented machines"


def test_a_rented_cluster_is_one_machine_of_the_run_in_the_timeline_though_each_machine_bills() -> None:
    current = {
        "provider": "runpod",
        "instance_id": "cluster:c1",
        "gpu": "2 machines x 8x H100 SXM",
        "price_per_hour": 40.0,
        "spot": False,
        "offer_id": "o",
        "created": 0.0,
    }
    run = record(compute={**RENTED, "provider": "runpod", "nodes": 2, "count": 8}, rental=current)
    rows = tuple(
        Rental(n + 1, "r", "runpod", f"cluster:c1/{n}", f"8x H100 SXM, machine {n + 1} of 2", 20.0, 10.0, None,
               cluster="cluster:c1", node=n)
        for n in range(2)
    )  # fmt: skip
    spend = RunSpend(run.id, 10.0, 40.0, billing=True, rented=True, rentals=rows)
    assert "machine 2 of this run" not in monitor_text.machine_rows(RunProgress(), snapshot(run, spend))["machine"]
    assert "Every rented machine of the cluster is terminated" in monitor_text.stop_question(snapshot(run))[1]
    (mark,) = monitor_text.machine_marks(snapshot(run, spend))
    assert (mark.number, mark.gpu, mark.price_per_hour, mark.started) == (1, "2 machines x 8x H100 SXM", 40.0, 10.0)


def test_an_own_servers_machine_and_cost() -> None:
    run = record(hourly_rate_usd=2.4)
    spend = RunSpend(run.id, 1.5, 2.4, billing=True, rented=False)
    progress = RunProgress(gpus=["NVIDIA A100-SXM4-80GB, 550, 81920 MiB"] * 2)
    rows = monitor_text.machine_rows(progress, snapshot(run, spend))
    assert rows["machine"] == "Your server me@gpu.example"
    assert rows["gpu"] == "2x NVIDIA A100-SXM4-80GB"
    assert (rows["rate"], rows["cost"], rows["estimate"]) == (
        "$2.40/h, as you stated",
        "$1.50",
        "None stored for this run",
    )
    unmetered = monitor_text.machine_rows(RunProgress(), snapshot(record(), RunSpend(run.id, 0, 0, False, False)))
    assert unmetered["cost"] == "Not metered: no hourly rate set" and unmetered["rate"] == "No hourly rate set"


def test_checkpoints_say_what_the_run_left_once_it_is_over() -> None:
    progress = RunProgress()
    files = LocalFiles((20, 40, 60), None)
    assert monitor_text.checkpoints_text(progress, files, RunState.FINISHED) == (
        "3 checkpoints were kept on this computer · newest at step 60"
    )
    assert monitor_text.checkpoints_text(progress, LocalFiles((), None), RunState.CANCELLED) == (
        "No checkpoint was written"
    )
    assert monitor_text.checkpoints_text(progress, LocalFiles((), None), RunState.TRAINING) == "None written yet"


def test_stop_and_resume_say_what_they_will_do() -> None:
    assert monitor_text.stop_question(snapshot(record()))[1] == (
        "The trainer saves a checkpoint, it is brought home, and the run stops. Resume continues from that checkpoint "
        "later. Stop now?"
    )
    rented = record(compute=RENTED)
    assert "The rented machine is terminated, so it stops billing." in monitor_text.stop_question(snapshot(rented))[1]
    stopped = record(RunState.CANCELLED, compute=RENTED)
    spend = RunSpend(stopped.id, 0.1, 0.0, False, True, (rental("runpod", 0.34, 0.0, 600.0),))
    question = resume_question(snapshot(stopped, spend, files=LocalFiles((20,), None)))
    assert question == (
        "Rent a machine to resume?",
        "Resuming rents a new machine (the last one cost $0.34/h) and continues from the checkpoint at step 20 on "
        "this computer. Resume now?",
    )
    assert resume_question(snapshot(record(RunState.CANCELLED))) is None, "an own server's resume rents nothing"


def test_the_badge_names_a_budget_stop() -> None:
    assert state_badge(record(RunState.CANCELLED)) == ("Stopped", "warning")
    assert state_badge(record(RunState.CANCELLED, budget_stop="budget reached")) == ("Stopped at budget", "warning")
    assert state_badge(record(RunState.FINISHED)) == ("Finished", "success")
    assert state_badge(record(RunState.PLANNED, compute=RENTED)) == ("Renting", "info")


def test_an_ended_runs_progress_line_says_how_far_it_got() -> None:
    progress = RunProgress(step=120, total_steps=300)
    stopped = monitor_text.busy(progress, snapshot(record(RunState.CANCELLED)))
    assert (stopped.text, stopped.value, stopped.maximum) == ("Stopped at step 120 of 300 (40 %)", 120, 300)
    paused = monitor_text.busy(progress, snapshot(record(RunState.PAUSED)))
    assert paused.text == "Paused at step 120 of 300 (40 %): the machine could not be reached"
    finished = monitor_text.busy(progress, snapshot(record(RunState.FINISHED)))
    assert (finished.value, finished.maximum) == (1, 1)
    assert monitor_text.busy(RunProgress(), snapshot(record(RunState.FAILED))).text == "Failed"


#: The first 20 steps measured after one fit: the events the two tests below read.
CALIBRATION = {
    "event": "calibration",
    "step": 21,
    "steps": 20,
    "micro_batch": 1,
    "grad_accum": 8,
    "seq_len": 2048,
    "seconds_per_step": 1.84,
    "tokens_per_s": 5120.4,
    "peak_allocated_gb": 14.23,
}
FIT = {"event": "fit", "micro_batch": 1, "grad_accum": 8, "gradient_checkpointing": True, "reason": "oom"}


def test_the_calibration_and_a_fit_are_said_in_the_log() -> None:
    from desktop.ui.pages.monitor_log import calibration_text, fit_text

    assert calibration_text(CALIBRATION) == (
        "Measured over the first 20 steps (micro-batch 1 x 8 accumulated, 2,048 tokens long): 1.84 s a step, "
        "5,120 tokens/s, peak 13.3 GiB"  # 14.23 decimal GB, said in GiB as every memory figure is
    )
    assert fit_text(FIT) == (
        "Out of memory in the first steps: trying again with micro-batch 1 x 8 accumulated, activation "
        "checkpointing on (the same effective batch, the same data)"
    )


def test_the_first_measure_a_fit_and_the_export_on_the_machine_reach_the_runs_log() -> None:
    """The words above are only worth something if the run's progress keeps those events for the log."""
    exported = {"files": {"export/model-Q8_0.gguf": "0" * 64}, "outputs": {"gguf:Q8_0": "export/model-Q8_0.gguf"}}
    events = [
        {"seq": 1, "ts": 1e9, "event": "state", "state": "training"},
        {"seq": 2, "ts": 1e9 + 1, **FIT},
        {"seq": 3, "ts": 1e9 + 2, **CALIBRATION},
        {"seq": 4, "ts": 1e9 + 3, "event": "export", "phase": "merging: loading the base model", "fraction": 0.0},
        {"seq": 5, "ts": 1e9 + 4, "event": "exported", **exported},
        {"seq": 6, "ts": 1e9 + 5, "event": "exported", "files": {}, "error": "RuntimeError: out of disk"},
    ]
    progress = RunProgress()
    progress.apply_all(events)
    lines = [entry.text for entry in monitor_log.event_entries(progress.milestones)]
    assert lines[1].startswith("Out of memory in the first steps: trying again with micro-batch 1 x 8")
    assert lines[2].startswith("Measured over the first 20 steps")
    assert lines[3] == "On the machine: merging: loading the base model"
    assert lines[4] == "The machine made GGUF Q8_0 (1 file, each hashed for the download)"
    assert lines[5] == "The export on the machine failed: RuntimeError: out of disk"


def test_the_title_names_a_model_folder_by_what_it_holds_and_keeps_its_path_for_the_tooltip() -> None:
    from desktop.ui.pages.monitor_text import title_text, title_tip

    folder = "/home/alexandra/models/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/12fd25f7"
    run = snapshot(record(base_model=folder, training={"method": "lora"}))
    assert (title_text(run), title_tip(run)) == ("HuggingFaceTB/SmolLM2-135M-Instruct (local folder) · LoRA", folder)
    hub = snapshot(record(base_model="Qwen/Qwen2.5-7B-Instruct", training={"method": "lora"}))
    assert (title_text(hub), title_tip(hub)) == ("Qwen/Qwen2.5-7B-Instruct · LoRA", "")
