"""The monitor's words, kept out of the widget (pure: no Qt): card rows, progress line, banner and questions.

Everything here reads a :class:`~desktop.services.runs.snapshot.RunSnapshot` and a
:class:`~desktop.core.runs.progress.RunProgress` and returns text, so each sentence is tested on its own.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from desktop.core.model_names import model_name
from desktop.core.runs.bill_phases import BilledStretch, split_bill
from desktop.core.runs.progress import (
    Estimate,
    RewardPoint,
    RunProgress,
    format_duration,
    run_duration,
    stored_estimate,
)
from desktop.core.runs.spec import parse_ssh_url
from desktop.core.runs.states import RunState
from desktop.core.runs.timeline import MachineMark
from desktop.core.sizing.gpus import find_gpu
from desktop.core.units import memory_text
from desktop.services.billing.ledger import as_machines
from desktop.services.billing.rentals import compute_of, rental_of
from desktop.services.models.configs import load_gpus
from desktop.services.runs.actions import was_stopped_by_user
from desktop.services.runs.snapshot import LocalFiles, RunSnapshot
from desktop.services.runs.transfer import UploadProgress
from desktop.ui.app_words import app_sentence
from desktop.ui.cost_words import money, rate
from desktop.ui.run_words import is_rented, provider_word, resume_start, training_words
from trainer_payload.protocol import ErrorKind, JobState

#: The rows of the "Training" card: (key, label).
TRAINING_ROWS = (
    ("step", "Step"),
    ("eta", "Time left"),
    ("loss", "Loss"),
    ("preference", "Chosen wins"),
    ("perplexity", "Perplexity"),
    ("speed", "Throughput"),
    ("gpu_memory", "GPU memory"),
    ("gpu_util", "GPU use"),
    ("lr", "Learning rate"),
    ("checkpoints", "Checkpoints"),
    ("adapter", "Adapter"),
)
#: Rows of the "Training" card shown only when they have something to say (a preference run's rewards).
OPTIONAL_TRAINING_ROWS = frozenset({"preference", "perplexity"})
#: The rows of the "Machine and cost" card: (key, label).
MACHINE_ROWS = (
    ("machine", "Machine"),
    ("gpu", "GPU"),
    ("rate", "Rate"),
    ("cost", "Cost so far"),
    ("idle", "Paid idle"),
    ("estimate", "Estimate"),
    ("bucket", "Bucket"),
)
#: Rows of the "Machine and cost" card shown only when they have something to say (a run with a bucket).
OPTIONAL_MACHINE_ROWS = frozenset({"bucket"})
#: States after which nothing trains until the user acts.
OVER = frozenset({RunState.FINISHED, RunState.CANCELLED, RunState.FAILED})
#: What a run in a state is busy with (no measure of how far along it is).
BUSY_TEXT = {
    RunState.PLANNED: "Waiting to start…",
    RunState.PROVISIONING: "Renting the machine…",
    RunState.CONNECTING: "Connecting to the machine…",
    RunState.UPLOADING: "Uploading the trainer and the data…",
    RunState.BOOTSTRAPPING: "Setting up the machine: the trainer's packages and the model…",
    RunState.SYNCING: "Bringing the newest checkpoint home…",
    RunState.PULLING: "Bringing the adapter home and verifying it…",
    RunState.SERVING: "The adapter is home; the machine serves the tuned model…",
}
#: What the trainer is busy with before and after its steps.
JOB_TEXT = {
    JobState.INSTALLING: "Installing the trainer's packages…",
    JobState.DOWNLOADING: "Downloading the model…",
    JobState.PREPARING: "Loading the model and the data…",
    JobState.SAVING: "Saving the adapter…",
}
#: An ended run's progress line.
END_TEXT = {
    RunState.FINISHED: "Finished: the adapter is on this computer",
    RunState.PAUSED: "Paused: the machine could not be reached",
    RunState.FAILED: "Failed",
    RunState.CANCELLED: "Stopped",
}
#: A trainer error's kind in words, and what to do about it (the payload's own hints name command-line flags).
ERROR_WORDS: dict[str, tuple[str, str]] = {
    ErrorKind.OOM: (
        "Out of GPU memory",
        "Lower the sequence length or the micro-batch size, use QLoRA, or choose a GPU with more memory.",
    ),
    ErrorKind.DATA: ("A problem in the data", "Fix the rows named above in the dataset, then start again."),
    ErrorKind.DOWNLOAD: (
        "The model could not be downloaded",
        "Check the model's name, add a Hugging Face token in Settings for a gated model, and check the machine's "
        "network.",
    ),
    ErrorKind.DISK: ("The machine's disk is full", "Keep fewer checkpoints, or choose a machine with more disk."),
    ErrorKind.CONFIG: ("A training setting is not valid", "Change the setting named above and start again."),
    ErrorKind.INSTALL: (
        "The trainer's packages could not be installed",
        "Check the machine's network, disk and Python version; its setup log has the installer's last lines.",
    ),
    ErrorKind.INTERNAL: (
        "Something unexpected went wrong",
        "Resume the run to try again from its newest checkpoint; the machine's log has the details.",
    ),
}


@dataclass(frozen=True)
class Busy:
    """The progress line: its words and how far along it is (``maximum`` 0: busy, no measure)."""

    text: str
    value: int = 0
    maximum: int = 0


@dataclass(frozen=True)
class Notice:
    """The banner over the run: a severity (``success``, ``info``, ``warning``, ``danger``), a headline, details."""

    severity: str
    headline: str
    details: str = ""


# -- the header ------------------------------------------------------------------------------------------------------


def title_text(snapshot: RunSnapshot) -> str:
    """The run's title: its model (a folder by what it holds, see :func:`title_tip`), method and objective."""
    spec = snapshot.record.spec
    model = model_name(str(spec.get("base_model", "?")))
    return f"{model} · {training_words(spec)}"


def title_tip(snapshot: RunSnapshot) -> str:
    """The title's tooltip: a model folder's whole path ("" for a Hub id, which the title shows whole)."""
    base = str(snapshot.record.spec.get("base_model", "?"))
    return base if model_name(base) != base else ""


def subtitle_text(snapshot: RunSnapshot, following: bool) -> str:
    """Under the title: the run's id, when it started, how long it has taken, and who follows it."""
    record = snapshot.record
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.started))
    took = format_duration(run_duration(snapshot.transitions, snapshot.now))
    return f"Run {record.id} · started {started} · {took}" + (" · followed by this window" if following else "")


# -- the training card -----------------------------------------------------------------------------------------------


def training_rows(progress: RunProgress, snapshot: RunSnapshot) -> dict[str, str]:
    """The text of each row of the "Training" card."""
    state = snapshot.record.state
    return {
        "step": step_text(progress),
        "eta": eta_text(progress, state, snapshot.now),
        "loss": loss_text(progress),
        "preference": preference_text(progress),
        "perplexity": perplexity_text(progress, snapshot.record.spec),
        "speed": f"{progress.tokens_per_s:,.0f} tokens/s" if progress.tokens_per_s is not None else "—",
        "gpu_memory": gpu_memory_text(progress),
        "gpu_util": f"{progress.gpu_util:.0f} %" if progress.gpu_util is not None else "—",
        "lr": f"{progress.learning_rate:.2e}" if progress.learning_rate is not None else "—",
        "checkpoints": checkpoints_text(progress, snapshot.files, state),
        "adapter": adapter_text(progress, snapshot),
    }


def step_text(progress: RunProgress) -> str:
    """``80 of 100 · epoch 0.80``."""
    if not progress.step:
        return "—"
    total = f" of {progress.total_steps:,}" if progress.total_steps else ""
    return f"{progress.step:,}{total} · epoch {progress.epoch:.2f}"


def eta_text(progress: RunProgress, state: RunState, now: float) -> str:
    """Training time left at the recent step rate, counted down since the last step."""
    eta = progress.eta_seconds
    if state is not RunState.TRAINING or eta is None:
        return "—"
    since = now - progress.last_ts if progress.last_ts else 0.0
    return f"about {format_duration(max(0.0, eta - since))}"


def loss_text(progress: RunProgress) -> str:
    """The latest training loss, and the latest eval loss."""
    if not progress.losses:
        return "—"
    text = f"{progress.losses[-1]:.4f}"
    return text + (f" · eval {progress.eval_losses[-1]:.4f}" if progress.eval_losses else "")


def preference_text(progress: RunProgress) -> str:
    """A preference run's latest rewards: how often the chosen answer wins, by what margin; "" for other runs.

    ``72 %, margin +0.44 (chosen +0.21, rejected -0.23) · held-out 67 %, margin +0.31``
    """
    if not progress.rewards and not progress.eval_rewards:
        return ""
    parts = [_reward_words(progress.rewards[-1])] if progress.rewards else []
    if progress.eval_rewards:
        parts.append("held-out " + _reward_words(progress.eval_rewards[-1], sides=False))
    return " · ".join(parts)


def perplexity_text(progress: RunProgress, spec: dict[str, Any]) -> str:
    """Continued pre-training's held-out perplexity before training and now (or after); "" for other runs.

    ``473.8 before training · 280.6 after (-41 %)``: the machine measures the base at step 0 and reports both
    when it is done; while it trains, each evaluation's loss is the perplexity so far.
    """
    training = spec.get("training")
    if not isinstance(training, dict) or training.get("objective") != "cpt":
        return ""
    metrics = progress.done.metrics if progress.done is not None else {}
    base, latest = metrics.get("base_perplexity"), metrics.get("perplexity")
    starts_at_zero = bool(progress.eval_steps) and progress.eval_steps[0] == 0
    if not isinstance(base, int | float) and starts_at_zero:
        base = math.exp(min(progress.eval_losses[0], 50.0))
    when = "after"
    if not isinstance(latest, int | float) and progress.eval_steps and progress.eval_steps[-1] > 0:
        latest, when = math.exp(min(progress.eval_losses[-1], 50.0)), f"at step {progress.eval_steps[-1]:,}"
    if not isinstance(base, int | float):
        return ""
    text = f"{base:,.1f} before training"
    if isinstance(latest, int | float):
        text += f" · {latest:,.1f} {when} ({(latest - base) / base:+.0%})".replace("%)", " %)")
    return text


def _reward_words(point: RewardPoint, *, sides: bool = True) -> str:
    text = f"{point.accuracy:.0%}".replace("%", " %")
    if point.margin is not None:
        text += f", margin {point.margin:+.2f}"
    if sides and point.chosen is not None and point.rejected is not None:
        text += f" (chosen {point.chosen:+.2f}, rejected {point.rejected:+.2f})"
    return text


def gpu_memory_text(progress: RunProgress) -> str:
    """Peak allocated and reserved GPU memory."""
    if progress.gpu_mem_allocated_gb is None:
        return "—"
    reserved = progress.gpu_mem_reserved_gb
    return f"{memory_text(progress.gpu_mem_allocated_gb)} peak allocated" + (
        f" · {memory_text(reserved)} reserved" if reserved is not None else ""
    )


def checkpoints_text(progress: RunProgress, files: LocalFiles, state: RunState) -> str:
    """Checkpoints written and brought home; once the run is over, what it left on this computer."""
    home, written = files.checkpoint_steps, progress.checkpoints
    if state in OVER or state is RunState.PAUSED:
        if home:
            kept = "1 checkpoint was kept" if len(home) == 1 else f"{len(home)} checkpoints were kept"
            return f"{kept} on this computer · newest at step {home[-1]:,}"
        if written:
            return f"{len(written)} written on the machine; none came home"
        return "No checkpoint was written"
    if not written:
        return "None written yet"
    newest = written[-1]
    at_home = f" · {len(home)} at home" if home else ""
    return f"{len(written)} saved · newest at step {newest.step:,} ({newest.bytes / 1e6:,.1f} MB){at_home}"


def adapter_text(progress: RunProgress, snapshot: RunSnapshot) -> str:
    """Where the adapter is: its folder at home, on its way, or not yet made."""
    if snapshot.record.adapter:
        return snapshot.record.adapter
    if progress.done is not None:
        return "Saved on the machine; coming home…"
    return "—"


# -- the machine and cost card ---------------------------------------------------------------------------------------


def machine_rows(progress: RunProgress, snapshot: RunSnapshot) -> dict[str, str]:
    """The text of each row of the "Machine and cost" card: where it trains, at what rate, spent and expected."""
    rows = _rented_rows(snapshot) if is_rented(snapshot.record) else _own_server_rows(progress, snapshot)
    estimate = stored_estimate(snapshot.record.spec)
    rows["cost"] = cost_text(snapshot, estimate)
    rows["idle"] = idle_text(progress, snapshot)
    rows["estimate"] = estimate_text(estimate)
    rows["bucket"] = bucket_text(snapshot.record.spec)
    return rows


def bucket_text(spec: dict[str, Any]) -> str:
    """Where a run with a bucket keeps its data and checkpoints ("" for a run without one)."""
    bucket = spec.get("bucket")
    if not isinstance(bucket, dict) or not bucket.get("url"):
        return ""
    method = str(spec.get("training", {}).get("method", "qlora"))
    kept = "checkpoints go there and stay there" if method.startswith("full") else "checkpoints go there and home"
    return f"{bucket['url']}: the machine reads the data there; {kept}"


def idle_text(progress: RunProgress, snapshot: RunSnapshot) -> str:
    """Dollars paid while no machine trained, and what an hour of training really cost (rented runs)."""
    spend = snapshot.spend
    made = [rental for rental in spend.rentals if rental.made] if spend is not None and spend.rented else []
    if not made:
        return "Shown for rented machines" if not is_rented(snapshot.record) else "Nothing billed yet"
    stretches = [BilledStretch(r.started, r.end(snapshot.now), r.price_per_hour) for r in made]
    split = split_bill(stretches, snapshot.transitions, progress.bill_events)
    share = f" ({100 * split.idle_usd / split.usd:.0f} %)" if split.usd > 0 else ""
    text = f"{money(split.idle_usd)} of {money(split.usd)}{share}"
    hour = split.effective_usd_per_training_hour
    return text + (f" · {money(hour)} per hour of training" if hour is not None else " · no training yet")


#: A machine of a run across several, in the monitor's words for where it stands.
NODE_STATE_WORDS = {
    RunState.PLANNED: "waiting for its machine",
    RunState.PROVISIONING: "being rented",
    RunState.CONNECTING: "connecting",
    RunState.UPLOADING: "receiving the payload and data",
    RunState.BOOTSTRAPPING: "installing the trainer",
    RunState.TRAINING: "training",
    RunState.SYNCING: "finishing",
    RunState.PULLING: "finishing",
    RunState.SERVING: "finishing",
    RunState.FINISHED: "done, cleaned up",
    RunState.PAUSED: "stopped with the run (paused)",
    RunState.FAILED: "stopped (the run failed)",
    RunState.CANCELLED: "stopped",
}


def node_lines(snapshot: RunSnapshot) -> list[str]:
    """One line per machine of a run across several (the head first), or none for a run on one machine."""
    if not snapshot.nodes:
        return []
    lines = []
    for rank, record in enumerate((snapshot.record, *snapshot.nodes)):
        where = _login_words(record.target) if record.target else "no machine yet"
        role = "Head (rank 0)" if rank == 0 else f"Rank {rank}"
        lines.append(f"{role} · {where} · {NODE_STATE_WORDS.get(record.state, record.state.value)}")
    return lines


def _login_words(target: str) -> str:
    user, host, port = parse_ssh_url(target)
    return f"{user}@{host}" + (f":{port}" if port != 22 else "")


def _rented_rows(snapshot: RunSnapshot) -> dict[str, str]:
    record, spend = snapshot.record, snapshot.spend
    rentals = as_machines(spend.rentals) if spend else []  # a cluster's machines were rented as one
    current = rental_of(record)
    compute = compute_of(record)
    count = f"{compute.count}x " if compute and compute.count > 1 and compute.nodes == 1 else ""
    if current is not None:
        kind = "spot" if current.spot else "on-demand"
        number = f" · machine {len(rentals)} of this run" if len(rentals) > 1 else ""
        machine, gpu = f"{provider_word(current.provider.value)} · {kind}{number}", f"{count}{current.gpu}"
    elif rentals:
        last = rentals[-1]
        machine = f"None rented now ({len(rentals)} so far, the last at {provider_word(last.provider)})"
        gpu = f"{count}{last.gpu}"
    else:
        wanted = provider_word(compute.provider) if compute else "?"
        machine, gpu = f"Not rented yet (at {wanted})", f"{count}{compute.gpu if compute and compute.gpu else 'any'}"
        if compute and compute.nodes > 1:
            gpu = f"{compute.nodes} machines x {compute.count}x {compute.gpu or 'any'}"
    now = rate(spend.rate_per_hour) if spend is not None and spend.billing else "Not billing now"
    return {"machine": machine, "gpu": gpu, "rate": now}


def _own_server_rows(progress: RunProgress, snapshot: RunSnapshot) -> dict[str, str]:
    record = snapshot.record
    machine = "No server yet"
    if record.target and snapshot.nodes:
        machine = f"Your {1 + len(snapshot.nodes)} servers as one, the head {_login_words(record.target)}"
    elif record.target:
        user, host, port = parse_ssh_url(record.target)
        machine = f"Your server {user}@{host}" + (f":{port}" if port != 22 else "")
    stated = float(record.spec.get("hourly_rate_usd") or 0.0)
    return {
        "machine": machine,
        "gpu": gpus_text(progress.gpus, ended=record.state in OVER),
        "rate": f"{rate(stated)}, as you stated" if stated > 0 else "No hourly rate set",
    }


def gpus_text(gpus: list[str] | None, ended: bool = False) -> str:
    """The GPUs the machine's driver listed (``2x NVIDIA A100-SXM4-80GB``), before or without any."""
    if gpus is None:
        return "Not recorded for this run" if ended else "Not known until the machine is set up"
    if not gpus:
        return "No NVIDIA GPU found"
    names = [line.split(",")[0].strip() for line in gpus]
    distinct = list(dict.fromkeys(names))
    return ", ".join(f"{names.count(name)}x {name}" if names.count(name) > 1 else name for name in distinct)


def cost_text(snapshot: RunSnapshot, estimate: Estimate | None) -> str:
    """Dollars so far (the one count the status bar and the tray show), against the estimate when there is one."""
    spend = snapshot.spend
    if spend is None:
        return f"Not known now ({snapshot.spend_problem})"
    if not spend.rented and not float(snapshot.record.spec.get("hourly_rate_usd") or 0.0):
        return "Not metered: no hourly rate set"
    text = money(spend.usd)
    if estimate is not None and estimate.usd:
        text += f" of about {money(estimate.usd)} expected ({100 * spend.usd / estimate.usd:,.0f} %)"
    return text


def gpu_display_name(gpu: str) -> str:
    """A GPU as people name it (``RTX 3090``), from a catalog id (``rtx3090``) or any name the catalog knows."""
    known = find_gpu(list(load_gpus()), gpu)
    return known.name if known is not None else gpu


def estimate_text(estimate: Estimate | None) -> str:
    """What the run was expected to take and cost."""
    if estimate is None:
        return "None stored for this run"
    on = f" on {gpu_display_name(estimate.gpu)}" if estimate.gpu else ""
    cost = f"{money(estimate.usd)} for " if estimate.usd is not None else ""
    speed = f" at {estimate.tokens_per_s:,.0f} tokens/s" if estimate.tokens_per_s else ""
    return f"{cost}about {format_duration(estimate.hours * 3600)}{on}{speed}"


def machine_marks(snapshot: RunSnapshot) -> list[MachineMark]:
    """The machines rented for the run, oldest first, each with why it was let go (from the run's history).

    A cluster is one mark (its machines together), as it was rented and let go.
    """
    if snapshot.spend is None:
        return []
    history = snapshot.record.spec.get("machines") or []
    whys = {str(m.get("instance_id")): str(m.get("why") or "") for m in history if isinstance(m, dict)}
    return [
        MachineMark(number, r.provider, r.gpu, r.price_per_hour, r.started, r.stopped, whys.get(r.machine_id or "", ""))
        for number, r in enumerate(as_machines(snapshot.spend.rentals), start=1)
    ]


# -- the progress line -----------------------------------------------------------------------------------------------


def busy(progress: RunProgress, snapshot: RunSnapshot) -> Busy:
    """What the run is doing now, with a measure where one is known (upload, model download, steps)."""
    state = snapshot.record.state
    if state is RunState.UPLOADING and snapshot.upload is not None:
        return upload_busy(snapshot.upload)
    if state is RunState.PLANNED and is_rented(snapshot.record):
        return Busy("Renting a machine and waiting for it to come up…")
    if state is RunState.BOOTSTRAPPING or (state is RunState.TRAINING and progress.job_state != JobState.TRAINING):
        measured = download_busy(progress)
        if measured is not None:
            return measured
    if state is RunState.TRAINING:
        return training_busy(progress)
    if state in BUSY_TEXT:
        return Busy(BUSY_TEXT[state])
    return end_busy(progress, state)


def end_busy(progress: RunProgress, state: RunState) -> Busy:
    """A run that ended or waits: a full bar once finished, else how far it got before it stopped, failed or paused."""
    words = END_TEXT.get(state, state.value.capitalize())
    if state is RunState.FINISHED:
        return Busy(words, 1, 1)
    if progress.total_steps <= 0 or progress.step <= 0:
        return Busy(words, 0, 1)
    step, total = min(progress.step, progress.total_steps), progress.total_steps
    head, _, tail = words.partition(":")
    text = f"{head} at step {step:,} of {total:,} ({100 * step / total:.0f} %)" + (f":{tail}" if tail else "")
    return Busy(text, step, total)


def upload_busy(upload: UploadProgress) -> Busy:
    """``Uploading the trainer and the data: 12.3 of 200.0 MB (6 %)``."""
    text = (
        f"Uploading the trainer and the data: {upload.bytes_done / 1e6:,.1f} of {upload.bytes_total / 1e6:,.1f} MB "
        f"({100 * upload.fraction:.0f} %)"
    )
    return Busy(text, round(1000 * upload.fraction), 1000)


def download_busy(progress: RunProgress) -> Busy | None:
    """The model's download on the machine, while it goes on (None when nothing is measured)."""
    if progress.job_state != JobState.DOWNLOADING or progress.download_bytes is None:
        return Busy(JOB_TEXT[JobState(progress.job_state)]) if progress.job_state in JOB_TEXT else None
    done, total = progress.download_bytes
    if not total:
        return Busy(f"Downloading the model: {done / 1e9:,.2f} GB so far…")
    fraction = min(1.0, done / total)
    text = f"Downloading the model: {done / 1e9:,.2f} of {total / 1e9:,.2f} GB ({100 * fraction:.0f} %)"
    return Busy(text, round(1000 * fraction), 1000)


def training_busy(progress: RunProgress) -> Busy:
    """``Training: step 20 of 60 (33 %)``, or what the trainer does before its first step."""
    if progress.job_state in JOB_TEXT and progress.job_state != JobState.TRAINING:
        return Busy(JOB_TEXT[JobState(progress.job_state)])
    if progress.total_steps <= 0:
        return Busy("Training is starting…")
    step = min(progress.step, progress.total_steps)
    percent = 100 * step / progress.total_steps
    return Busy(f"Training: step {step:,} of {progress.total_steps:,} ({percent:.0f} %)", step, progress.total_steps)


# -- the banner ------------------------------------------------------------------------------------------------------


def notice(progress: RunProgress, snapshot: RunSnapshot) -> Notice | None:
    """What the user must know about the run now: how it ended, why it waits, what failed and what to do."""
    record = snapshot.record
    if record.state is RunState.FINISHED:
        return Notice("success", "Finished: the adapter is on this computer", finished_details(snapshot))
    if record.state is RunState.PAUSED:
        return Notice(
            "warning",
            "Paused: the machine could not be reached",
            f"{app_sentence(record.error or 'The connection was lost.')} Resume tries again; a run on your own "
            "server can also continue elsewhere, from the newest checkpoint on this computer.",
        )
    if record.state is RunState.CANCELLED:
        return stopped_notice(progress, snapshot)
    if record.state is RunState.SERVING:
        return serving_notice(record.spec)
    if record.state is RunState.FAILED or progress.errors:
        return failure_notice(
            progress, record.error, record.spec.get("oom_advice"), machine_log=record.spec.get("machine_log")
        )
    return None


def serving_notice(spec: dict[str, Any]) -> Notice:
    """While the machine serves the tuned model: where programs reach it, what it answered, and when it stops."""
    serving, serve = spec.get("serving") or {}, spec.get("serve") or {}
    idle = f"{float(serve.get('idle_minutes', 0)):g} min"
    if not serving.get("url"):
        return Notice("info", "Starting the server on the machine", f"The adapter is home. {SERVE_BILLS.format(idle)}")
    count = int(serving.get("requests", 0))
    answered = f"{count} request{'' if count == 1 else 's'} answered so far."
    return Notice(
        "info",
        f"Serving {serving.get('model', '')} at {serving['url']}",
        f"OpenAI-compatible ({serving.get('backend', '')} on the machine; the model name is "
        f"{serving.get('model', '')}). {answered} {SERVE_BILLS.format(idle)}",
    )


#: What serving costs, said wherever it is shown.
SERVE_BILLS = "The machine bills while it serves: it stops after {} without a request, or when you press Stop."


def served_words(spec: dict[str, Any]) -> str:
    """How serving after training ended ("" when the run did not serve)."""
    if spec.get("serve_error"):
        return f" Serving from the machine failed ({app_sentence(str(spec['serve_error'])).rstrip('.')})."
    served = spec.get("served")
    if not isinstance(served, dict):
        return ""
    count = int(served.get("requests", 0))
    why = str(served.get("reason", "")).rstrip(".")
    return f" The machine served {count} request{'' if count == 1 else 's'}, then stopped ({why})."


def finished_details(snapshot: RunSnapshot) -> str:
    """Where the adapter is, the checkpoints kept beside it, and what the machine made after training."""
    where = f"It is in {snapshot.record.adapter}." if snapshot.record.adapter else ""
    kept = len(snapshot.files.checkpoint_steps)
    checkpoints = {0: " No checkpoint was kept.", 1: " 1 checkpoint was kept."}.get(
        kept, f" {kept} checkpoints were kept."
    )
    spec = snapshot.record.spec
    return (where + checkpoints + machine_export_words(spec) + served_words(spec)).strip()


def machine_export_words(spec: dict[str, Any]) -> str:
    """What the machine made after training (on the Models page now), or why it could not; "" when none was asked."""
    if spec.get("export_error"):
        return (
            f" The export on the machine failed ({app_sentence(str(spec['export_error'])).rstrip('.')}): export the "
            "adapter on the Models page."
        )
    made = spec.get("exported_on_machine")
    if isinstance(made, dict) and made:
        names = " and ".join("the merged model" if k == "merged" else f"a {k.removeprefix('gguf:')} GGUF" for k in made)
        return f" The machine made {names}; they came home verified and are on the Models page."
    return ""


def stop_headline(progress: RunProgress, snapshot: RunSnapshot) -> str:
    """``Stopped by you — checkpoint at step 30 kept`` (or at the budget, or before training began)."""
    record = snapshot.record
    step = progress.stopped.checkpoint_step if progress.stopped else None
    home = snapshot.files.checkpoint_steps
    step = step if step is not None else (home[-1] if home else None)
    who = "Stopped by you" if was_stopped_by_user(record) else "Stopped at its budget"
    if step is not None:
        return f"{who} — checkpoint at step {step:,} kept"
    if progress.step == 0 and not progress.checkpoints:
        return f"{who} before training began"
    return f"{who} — no checkpoint had been written"


def stopped_notice(progress: RunProgress, snapshot: RunSnapshot) -> Notice:
    """How a stopped run ended and what Resume does with it."""
    record = snapshot.record
    headline = stop_headline(progress, snapshot)
    if record.spec.get("budget_stop"):
        return Notice("warning", headline, f"{record.spec['budget_stop']}. A resumed run would stop again at once.")
    where = "rents a new machine and continues" if is_rented(record) else "continues"
    written = progress.stopped.checkpoint_step if progress.stopped else None
    written = written if written is not None else (progress.checkpoints[-1].step if progress.checkpoints else None)
    return Notice("info", headline, f"Resume {where} {resume_start(snapshot, written)}.")


def failure_notice(
    progress: RunProgress, run_error: str | None, oom_advice: object = None, *, machine_log: object = None
) -> Notice:
    """The trainer's last error in words with what to do, or the run's own error.

    An out-of-memory error says what would fit with the memory the run measured, when that was worked out. A
    machine's log brought home (``machine_log``) is named with the trainer's error: the machine may be gone.
    """
    if progress.errors:
        error = progress.errors[-1]
        headline, fix = ERROR_WORDS.get(error.kind, ("The trainer failed", error.hint))
        if error.kind == ErrorKind.OOM and isinstance(oom_advice, str) and oom_advice:
            fix = oom_advice
        where = f"\nThe machine's log is on this computer: {machine_log}" if isinstance(machine_log, str) else ""
        return Notice("danger", headline, f"{error.message}\nWhat to do: {fix}{where}")
    return Notice("danger", "The run failed", app_sentence(run_error or "The trainer stopped without saying why."))


# -- the questions ---------------------------------------------------------------------------------------------------


def stop_question(snapshot: RunSnapshot) -> tuple[str, str]:
    """The Stop dialog's title and text: what stopping does, and what Resume can do afterwards."""
    record = snapshot.record
    if record.pid is None:
        return "Stop this run?", "Nothing has been trained yet: the run stops now. Resume starts it again later."
    compute = compute_of(record)
    cluster = compute is not None and compute.nodes > 1
    machine = " The rented machine is terminated, so it stops billing." if is_rented(record) else ""
    resume = "rents a new machine and continues" if is_rented(record) else "continues"
    if cluster:
        machine = " Every rented machine of the cluster is terminated, so none bills."
        resume = "rents a new cluster and continues"
    if record.state is RunState.SERVING:
        return (
            "Stop serving?",
            "The adapter is already home. Serving ends and the machine is terminated, so it stops billing. Stop now?",
        )
    if record.state is RunState.PAUSED:
        return (
            "Stop this run?",
            "The machine cannot be reached now. If it answers, the trainer saves a checkpoint and it comes home; if "
            f"not, the run stops with the newest checkpoint on this computer.{machine} Resume {resume} from that "
            "checkpoint later. Stop now?",
        )
    return (
        "Stop this run?",
        "The trainer saves a checkpoint, it is brought home, and the run stops."
        f"{machine} Resume {resume} from that checkpoint later. Stop now?",
    )
