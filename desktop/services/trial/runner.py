"""A trial from start to end: the data slice, the training (MLX or the payload), the first answers, the run record.

Everything happens in ``trials/<time>/`` in the data folder; the adapter then moves into the folder of a finished
run recorded for it, so the Runs and Models pages list it like any run's and it exports and chats the same way.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from desktop.core.runs.spec import RunSpec
from desktop.core.runs.trial import Answer, TrialBackend, TrialPlan, TrialResult, TrialStep
from desktop.services.local.base_model import local_base
from desktop.services.local.common import LocalToolError, run_program
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.services.trial.data import HeldOut, TrialData, write_trial_data
from desktop.services.trial.errors import TrialError
from desktop.services.trial.mlx_trainer import train_with_mlx
from desktop.services.trial.payload_trainer import train_with_payload
from desktop.services.trial.planning import trial_job
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind, EventWriter

#: Tokens each first answer may take.
ANSWER_TOKENS = 48
#: What each backend's trainer needs importable in the Python that runs it.
NEEDED = {
    TrialBackend.MLX: ("mlx_lm",),
    TrialBackend.GPU: ("torch", "transformers", "peft", "trl", "accelerate", "datasets"),
    TrialBackend.CPU: ("torch", "transformers", "peft", "trl", "accelerate", "datasets"),
}


@dataclass(frozen=True)
class TrialWatch:
    """Where a trial reports: each step as it comes, and each phase in words (``training 50 steps on 16 rows``)."""

    on_step: Callable[[TrialStep], None] | None = None
    on_phase: Callable[[str], None] | None = None

    def phase(self, words: str) -> None:
        """Reports a phase."""
        if self.on_phase is not None:
            self.on_phase(words)


def trials_root() -> Path:
    """Where trials keep their data, logs and training output."""
    return app_paths().data_dir / "trials"


async def run_trial(
    spec: RunSpec,
    plan: TrialPlan,
    *,
    python: str,
    store: RunStore,
    watch: TrialWatch | None = None,
    folder: Path | None = None,
    secrets: SecretStore | None = None,
) -> TrialResult:
    """Trains ``plan`` on this computer, asks the adapter the held-out chats, records a finished run for it.

    Raises:
        TrialError: The plan cannot run here, the Python lacks the trainer, or training failed; the message says why.
        asyncio.CancelledError: The trial was stopped (its trainer is stopped; nothing is recorded).
    """
    watch, asked = watch or TrialWatch(), spec
    if plan.backend is None:
        raise TrialError(plan.reason)
    await check_python(python, plan.backend)
    folder = folder or new_trial_folder()
    started = time.time()
    data = await asyncio.to_thread(write_trial_data, spec, plan.rows, folder / "data")
    try:  # once here, for every trainer: the payload would download without the token, mlx-lm runs offline
        base = await local_base(spec.base_model, lambda text, _fraction: watch.phase(text), secrets)
    except LocalToolError as exc:
        raise TrialError(f"the trial needs the base model on this computer: {exc}") from exc
    spec = replace(spec, base_model=str(base))
    watch.phase(f"training {plan.steps} steps on {data.rows} chats with {plan.backend.label}")
    steps, seconds, peak, adapter = await _train(spec, plan, python, folder, data, watch=watch)
    watch.phase("asking the adapter the held-out chats")
    answers = await ask(python, spec.base_model, adapter, data.held_out)
    result = TrialResult(plan.backend, steps, seconds, peak, answers)
    times = (started, time.time() - seconds)
    record = await asyncio.to_thread(lambda: _record(store, asked, plan, result, adapter, times=times))
    return TrialResult(plan.backend, steps, seconds, peak, answers, record[1], record[0])


async def check_python(python: str, backend: TrialBackend) -> None:
    """Checks that ``python`` can import what ``backend`` trains with.

    Raises:
        TrialError: It cannot; the message names what is missing and where it comes from.
    """
    modules = NEEDED[backend]
    probe = "import importlib.util, sys; sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 3)"
    try:
        await run_program([python, "-c", probe, *modules], what="checking the trainer's libraries")
    except LocalToolError as exc:
        where = "mlx-lm (Apple Silicon)" if backend is TrialBackend.MLX else "the payload's trainer libraries"
        raise TrialError(
            f"{python} cannot import {', '.join(modules)}: a trial needs {where} on this computer; install the "
            "local tools (Models page, or rentune tools install: it adds what an earlier install lacks), or rent a "
            "machine for the run"
        ) from exc


def new_trial_folder() -> Path:
    """A new, empty ``trials/<UTC time>`` folder."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder, number = trials_root() / stamp, 1
    while folder.exists():
        number += 1
        folder = trials_root() / f"{stamp}-{number}"
    folder.mkdir(parents=True)
    return folder


async def _train(
    spec: RunSpec, plan: TrialPlan, python: str, folder: Path, data: TrialData, *, watch: TrialWatch
) -> tuple[tuple[TrialStep, ...], float, float | None, Path]:
    job = trial_job(spec, plan)
    if plan.backend is TrialBackend.MLX:
        mlx = await train_with_mlx(
            python,
            Path(spec.base_model),
            data.folder,
            folder / "out",
            steps=plan.steps,
            seq_len=int(job["seq_len"]),
            rank=int(job.get("lora_r", 16)),
            learning_rate=float(job.get("learning_rate", 2e-4)),
            batch_size=1,
            lora_alpha=float(job.get("lora_alpha", 32)),  # the payload's default
            on_step=watch.on_step,
        )
        return mlx.steps, mlx.seconds, mlx.peak_memory_gb, mlx.adapter
    trained = await train_with_payload(python, folder, job, on_step=watch.on_step)
    return trained.steps, trained.seconds, trained.peak_memory_gb, trained.adapter


async def ask(python: str, base_model: str, adapter: Path, held_out: tuple[HeldOut, ...]) -> tuple[Answer, ...]:
    """The adapter's greedy answers to the held-out chats (in a child process that loads the model).

    Raises:
        TrialError: The model could not be loaded or answer.
    """
    if not held_out:
        return ()
    request = adapter.parent / "answers-request.json"
    chats = [list(chat.messages) for chat in held_out]
    payload = {"base_model": base_model, "adapter": str(adapter), "chats": chats, "max_tokens": ANSWER_TOKENS}
    request.write_text(json.dumps(payload), encoding="utf-8")
    try:
        output = await run_program(
            [python, "-m", "desktop.services.trial.answers", str(request)], what="asking the trial's adapter"
        )
        texts = json.loads(output.strip().splitlines()[-1])
    except (LocalToolError, ValueError, IndexError) as exc:
        raise TrialError(f"the trial trained, but its adapter could not answer: {exc}") from exc
    return tuple(
        Answer(_prompt_text(chat.messages), chat.expected, str(text))
        for chat, text in zip(held_out, texts, strict=False)
    )


def _prompt_text(messages: tuple[dict[str, str], ...]) -> str:
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else (messages[-1]["content"] if messages else "")


def _record(
    store: RunStore,
    spec: RunSpec,
    plan: TrialPlan,
    result: TrialResult,
    adapter: Path,
    *,
    times: tuple[float, float],
) -> tuple[str, str]:
    """Records the finished trial as a run and moves its adapter into the run's folder: (run id, adapter path)."""
    trial: dict[str, Any] = result.as_dict() | {"rows": plan.rows}
    trial["achieved_tflops"] = result.achieved_tflops(plan.flops_per_token)
    trial["memory_gb"] = plan.memory_gb
    trial.pop("losses")
    described = {"base_model": spec.base_model, "train_file": str(spec.train_file), **spec.training, "trial": trial}
    if spec.eval_file is not None:
        described["eval_file"] = str(spec.eval_file)
    started, trained_from = times
    record = store.record_finished(described, started=started, trained=(trained_from, time.time()))
    home = store.folder(record.id) / "adapter"
    shutil.move(str(adapter), str(home))
    events = EventWriter(store.folder(record.id) / EVENTS_FILE_NAME)  # the monitor draws the trial's loss
    for step in result.steps:
        events.emit(
            EventKind.STEP, step=step.step, loss=step.loss, total_steps=plan.steps, tokens_per_s=step.tokens_per_s
        )
    store.update(record.id, adapter=str(home))
    return record.id, str(home)
