"""``make gpu-check``: the real payload on a real GPU, beside what ``rentune plan`` predicts for the same job.

Builds random-weight models of real shapes (Qwen2.5 0.5B, 1.5B and 7B from the bundled catalog) with a tiny
tokenizer, trains each with ``python -m trainer_payload run job.json`` for a few dozen steps per method (QLoRA, LoRA,
full where the plan says it fits), reads peak memory and tokens/s from the payload's events, and its first measured
steps (the ``calibration`` event), and prints them beside the sizing core's prediction. Two jobs too big for the card
check the fit on the machine: one the payload must fit by itself (smaller micro-batches, the same effective batch,
then done), one that does not fit even at micro-batch 1 (an ``error`` of kind ``oom`` naming it, with a hint). On a GPU
the fitted setup is then started afresh: the peak the fit's calibration reports must be that run's (nothing of a failed
attempt still held). It also shows that the image's torch, transformers and peft are the ones in use after the carried
wheels were installed. On a machine with two GPUs or more, the FSDP pass (tests/gpu/fsdp_check.py) shows rank 0 alone
reading the weights, the other ranks starting empty and filled by FSDP, QLoRA's ranks each on their own GPU, and a
LoRA run under FSDP; with fewer GPUs the report says it was skipped and why. Where vLLM is installed, the serving
pass (tests/gpu/serve_check.py) serves a LoRA the payload trained with vLLM as the app's ``[serve]`` does, asks it
and stops it; elsewhere the report says it was skipped and why.

``--smoke`` runs the same logic on a tiny model for a few steps, so it can be tested on a CPU (the fit checks then run
under the payload's test memory limit); QLoRA is then reported as skipped. The report is Markdown, on stdout and in
``$OUT/gpu_check.md`` when ``OUT`` is set. Exit code: 0 when everything that ran behaved, 1 when a run failed or torch
was replaced, 2 when the payload's packages are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from desktop.core.sizing.architecture import Architecture, architecture_from_config
from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import GpuSpec, find_gpu, gpus_from_json
from desktop.core.sizing.plan import Workload, evaluate
from desktop.core.sizing.setup import Method, Objective, TrainingSetup
from tests.fixtures.chat_data import corpus_texts
from tests.gpu.fsdp_check import FSDP_GPUS, FsdpRow, cuda_count, probe_rows, render_fsdp, skip_reason
from tests.gpu.serve_check import NO_VLLM, ServeRow, render_serve, serve_adapter, vllm_installed
from tests.gpu.wheels import SITE_DIR
from trainer_payload.protocol import EVENTS_FILE_NAME, precomputes_reference, read_event_file

REPO = Path(__file__).resolve().parents[2]
# The smallest first (a broken setup fails cheaply, and it carries the OOM check), then the 7B, the most telling.
MODELS = ("qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-1.5b")
#: A method, or a method and an objective other than SFT (``lora+dpo``: DPO on preference pairs, with LoRA).
METHODS = ("qlora", "lora", "full", "lora+dpo")
SMOKE_MODEL = "tiny-llama"
LORA_R = 16
# Packages whose origin the report shows; the payload cannot start without the NEEDED ones.
PROBED = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "bitsandbytes", "pyarrow", "pandas")
NEEDED = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "pyarrow", "pandas")
IMAGE_OWNED = ("torch", "transformers", "peft")
NO_CUDA = "skipped (no CUDA)"


@dataclass(frozen=True)
class Shape:
    """Sequence length, micro-batch and steps of a training job."""

    seq_len: int
    micro_batch: int
    steps: int

    def describe(self) -> str:
        """``seq 2048 x batch 2, 24 steps``."""
        return f"seq {self.seq_len} x batch {self.micro_batch}, {self.steps} steps"


FULL_SHAPE = Shape(seq_len=2048, micro_batch=2, steps=20)
SMOKE_SHAPE = Shape(seq_len=64, micro_batch=2, steps=3)
# About a million tokens in one micro-batch: the logits alone of the 0.5B model need ~300 GB; one example fits.
FIT_SHAPE = Shape(seq_len=8192, micro_batch=128, steps=2)
# One example of 131,072 tokens: its logits alone need ~200 GB, more than any card has.
NO_FIT_SHAPE = Shape(seq_len=131_072, micro_batch=1, steps=1)
# On a CPU (--smoke) the payload's test limit plays the card: micro-batch 8 and 4 do not fit, 2 does (tiny model,
# hidden 64, sequence 64: 8 x 64 x 64 x 4 bytes per micro-batch); the second limit lets nothing fit.
SMOKE_FIT_SHAPE = Shape(seq_len=64, micro_batch=8, steps=2)
SMOKE_LIMITS = {"fit": 40_000, "no fit": 1_000}


@dataclass
class Outcome:
    """What one payload run did, read from its events.

    Attributes:
        status: ``ok``, ``failed: ...`` or ``skipped...``.
        peak_allocated_gb: Peak ``torch.cuda.max_memory_allocated`` over the training steps.
        peak_reserved_gb: Peak ``torch.cuda.max_memory_reserved`` over the training steps.
        tokens_per_s: Median training tokens/s after the first third of the steps.
        final_loss: Loss of the last step.
        steps: Steps reported.
        seconds: Wall time of the payload process.
        error_kind: ``kind`` of the error event, if any.
        hint: ``hint`` of the error event, if any.
        message: Message of the error event, or the log's tail when the payload died without one.
        calibration: The ``calibration`` event (the first steps measured), if any.
        fits: Each smaller setup the payload tried after an out-of-memory, in order.
    """

    status: str
    peak_allocated_gb: float | None = None
    peak_reserved_gb: float | None = None
    tokens_per_s: float | None = None
    final_loss: float | None = None
    steps: int = 0
    seconds: float = 0.0
    error_kind: str | None = None
    hint: str | None = None
    message: str | None = None
    calibration: dict[str, Any] | None = None
    fits: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Prediction:
    """What the sizing core says about a job on the plan's GPU."""

    total_gb: float
    context_gb: float
    fit: str
    tokens_per_s: float


@dataclass
class Row:
    """One line of the training table."""

    model: str
    method: str
    shape: Shape
    prediction: Prediction | None
    outcome: Outcome


@dataclass
class Report:
    """Everything the Markdown report shows."""

    mode: str
    facts: dict[str, Any]
    plan_gpu: str
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    fit: Row | None = None
    fit_afresh: Row | None = None
    no_fit: Row | None = None
    oom_note: str = ""
    fsdp: list[FsdpRow] = field(default_factory=list)
    fsdp_note: str = ""
    serve: ServeRow | None = None
    problems: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


# --- the machine and its packages ------------------------------------------------------------------------------------

_PROBE = """
import importlib.metadata, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        dist = importlib.metadata.distribution(name)
        found[name] = {"version": dist.version, "where": str(dist.locate_file(""))}
    except importlib.metadata.PackageNotFoundError:
        found[name] = None
import torch
found["torch"] = {"version": torch.__version__, "where": torch.__file__}
print(json.dumps(found))
"""


def python_env(site: Path | None) -> dict[str, str]:
    """The environment of the payload: the carried site folder first (when given and present), then the repo."""
    paths = [str(site)] if site is not None and site.is_dir() else []
    paths.append(str(REPO))
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1"
    )
    return env


def probe_packages(site: Path | None) -> dict[str, Any]:
    """Version and location of each probed package (torch by import: its module file), with or without ``site``."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *PROBED],
        env=python_env(site),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def machine_facts() -> dict[str, Any]:
    """Python, torch, CUDA and the GPU, as this process sees them."""
    import torch

    facts: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": False}
    if not torch.cuda.is_available():
        return facts
    props = torch.cuda.get_device_properties(0)
    facts.update(
        cuda=True, cuda_version=torch.version.cuda, gpu=props.name, gpu_gib=round(props.total_memory / 2**30, 1)
    )
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False).stdout
        facts["driver"] = out.strip().splitlines()[0] if out.strip() else None
    return facts


def missing_packages(after: dict[str, Any]) -> list[str]:
    """The packages the payload needs that the environment lacks."""
    return [name for name in NEEDED if not after.get(name)]


# --- the sizing core's side ------------------------------------------------------------------------------------------


def load_resource(name: str) -> dict[str, Any]:
    """A bundled JSON resource, read from the repository the check runs in."""
    return dict(json.loads((REPO / "resources" / name).read_text(encoding="utf-8")))


def plan_gpu(facts: dict[str, Any], wanted: str | None) -> tuple[GpuSpec, str]:
    """The GPU the predictions are for: ``--gpu``, else the card found, else the H200; with a note on the choice."""
    gpus = gpus_from_json(load_resource("gpus.json"))
    for name, note in ((wanted, "asked with --gpu"), (facts.get("gpu"), "the card found")):
        if name:
            spec = find_gpu(gpus, str(name))
            if spec is not None:
                return spec, f"{spec.name} ({note})"
    fallback = find_gpu(gpus, "h200")
    assert fallback is not None, "resources/gpus.json lost its H200 entry"
    return fallback, f"{fallback.name} (no card in resources/gpus.json matched {facts.get('gpu') or 'a CPU'})"


def method_and_objective(name: str) -> tuple[str, str]:
    """``lora+dpo`` → (``lora``, ``dpo``); a plain method trains SFT."""
    method, _, objective = name.partition("+")
    return method, objective or "sft"


def predict(arch: Architecture, name: str, shape: Shape, gpu: GpuSpec) -> Prediction:
    """``rentune plan``'s memory, fit and speed for the payload's settings on one GPU."""
    method, objective = method_and_objective(name)
    setup = TrainingSetup(
        method=Method(method),
        lora_r=LORA_R,
        seq_len=shape.seq_len,
        micro_batch=shape.micro_batch,
        grad_accum=1,
        objective=Objective(objective),
        reference_precomputed=precomputes_reference(objective, method, shape.steps),
    )
    option = evaluate(arch, setup, gpu, Workload())
    memory = option.memory
    return Prediction(memory.per_gpu_total, memory.items["cuda_context"], option.fit.value, option.tokens_per_s)


# --- models and data -------------------------------------------------------------------------------------------------


def catalog_config(alias: str) -> dict[str, Any]:
    """The stored ``config.json`` fields of a catalog model."""
    data = load_resource("models.json")
    entry = ModelCatalog.from_json(data).entry(alias)
    if entry is None:
        raise SystemExit(f"{alias} is not in resources/models.json; pick a catalog alias")
    return dict(next(raw["config"] for raw in data["models"] if raw["id"] == entry.id))


def build_real_shape_model(alias: str, folder: Path) -> Architecture:
    """Saves a random-weight bf16 model of the catalog entry's shape, with the tiny tokenizer; returns its shape.

    The weights are created on the GPU (seconds even for 7B), then written as safetensors.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures.tiny_models import save_tokenizer

    raw = catalog_config(alias)
    model_type = raw.pop("model_type")
    ids = save_tokenizer(folder, "qwen2" if model_type == "qwen2" else "llama")
    config = AutoConfig.for_model(model_type, **raw, eos_token_id=ids.eos, pad_token_id=ids.pad, bos_token_id=None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return saved_architecture(folder, alias)


def build_smoke_model(folder: Path) -> Architecture:
    """The tests' tiny Llama (random weights, ~150k parameters)."""
    from tests.fixtures.tiny_models import build_tiny_model

    build_tiny_model(folder)
    return saved_architecture(folder, SMOKE_MODEL)


def saved_architecture(folder: Path, name: str) -> Architecture:
    """The sizing core's view of a saved model, from its ``config.json``."""
    return architecture_from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")), name)


def long_text(rng: random.Random, chars: int, words: list[str]) -> str:
    """Random words from the tokenizer's corpus, about ``chars`` characters."""
    picked: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(words)
        picked.append(word)
        length += len(word) + 1
    return " ".join(picked)


def write_dataset(path: Path, shape: Shape, rows: int, seed: int = 0) -> Path:
    """Chat rows whose assistant turn is longer than ``seq_len`` tokens, so every sequence is full after truncation.

    The tiny tokenizer makes about one token of 2.5 characters: four characters per token leaves a margin.
    """
    rng = random.Random(seed)
    words = sorted({word for text in corpus_texts() for word in text.split()})
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(rows):
            messages = [
                {"role": "user", "content": long_text(rng, 24, words)},
                {"role": "assistant", "content": long_text(rng, 4 * shape.seq_len, words)},
            ]
            handle.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_pairs(path: Path, shape: Shape, rows: int, seed: int = 0) -> Path:
    """Preference pairs whose answers are each longer than ``seq_len`` tokens: both sides of every pair are full."""
    rng = random.Random(seed)
    words = sorted({word for text in corpus_texts() for word in text.split()})
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(rows):
            prompt = [{"role": "user", "content": long_text(rng, 24, words)}]
            chosen, rejected = (long_text(rng, 4 * shape.seq_len, words) for _ in range(2))
            pair = {"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}]}
            handle.write(json.dumps(pair | {"rejected": [{"role": "assistant", "content": rejected}]}) + "\n")
    return path


# --- running the payload ---------------------------------------------------------------------------------------------


def write_job(folder: Path, model_dir: Path, method: str, shape: Shape, rows: int, **keys: Any) -> Path:
    """A job.json for the payload, with a dataset of ``rows`` examples beside it (the trainer cycles through it).

    ``keys`` are further job keys (``num_gpus``, ``strategy``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    method, objective = method_and_objective(method)
    (write_pairs if objective == "dpo" else write_dataset)(folder / "train.jsonl", shape, rows)
    job = {
        "base_model": str(model_dir),
        "train_file": "train.jsonl",
        "output_dir": "out",
        "method": method,
        "objective": objective,
        "lora_r": LORA_R,
        "seq_len": shape.seq_len,
        "micro_batch": shape.micro_batch,
        "grad_accum": 1,
        "max_steps": shape.steps,
        "learning_rate": 1e-5 if method == "full" else 1e-4,
        "warmup_ratio": 0.0,
        "checkpoint_steps": 0,
        "checkpoint_minutes": 0,
        "calibration_steps": max(1, shape.steps // 2),  # measured within the run, however short
        **keys,
    }
    (folder / "job.json").write_text(json.dumps(job, indent=1), encoding="utf-8")
    return folder / "job.json"


def run_payload(job: Path, env: dict[str, str], timeout: float) -> tuple[int | None, float, Path]:
    """Runs ``python -m trainer_payload run job.json``; returns the exit code (None on timeout), seconds and log."""
    log = job.parent / "payload.log"
    started = time.monotonic()
    with log.open("wb") as handle:
        try:
            code: int | None = subprocess.run(
                [sys.executable, "-m", "trainer_payload", "run", str(job)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=job.parent,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, round(time.monotonic() - started, 1), log


def _peak(steps: list[dict[str, Any]], key: str) -> float | None:
    values = [float(e[key]) for e in steps if e.get(key) is not None]
    return max(values) if values else None


def _median_rate(steps: list[dict[str, Any]]) -> float | None:
    rates = [float(e["tokens_per_s"]) for e in steps if e.get("tokens_per_s")]
    settled = rates[len(rates) // 3 :]  # the first steps pay for allocation and kernel selection
    return round(statistics.median(settled), 1) if settled else None


def log_tail(log: Path, lines: int = 15) -> str:
    """The last lines of a payload log."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def outcome_of(events: list[dict[str, Any]], code: int | None, seconds: float, log: Path) -> Outcome:
    """Turns a run's events into an :class:`Outcome`."""
    steps = [e for e in events if e["event"] == "step"]
    error = next((e for e in events if e["event"] == "error"), None)
    done = next((e for e in events if e["event"] == "done"), None)
    outcome = Outcome(
        status="ok",
        peak_allocated_gb=_peak(steps, "gpu_mem_allocated_gb") or (error or {}).get("peak_gpu_gb"),
        peak_reserved_gb=_peak(steps, "gpu_mem_reserved_gb"),
        tokens_per_s=_median_rate(steps),
        final_loss=steps[-1]["loss"] if steps else None,
        steps=len(steps),
        seconds=seconds,
        calibration=next((e for e in events if e["event"] == "calibration"), None),
        fits=[
            f"micro-batch {e['micro_batch']} x grad-accum {e['grad_accum']}"
            + (", checkpointing on" if e.get("gradient_checkpointing") else "")
            for e in events
            if e["event"] == "fit"
        ],
    )
    if error is not None:
        outcome.status = f"failed: {error.get('kind')}"
        outcome.error_kind, outcome.hint, outcome.message = error.get("kind"), error.get("hint"), error.get("message")
    elif done is None:
        outcome.status = "failed: timed out" if code is None else f"failed: exit {code} without a done event"
        outcome.message = log_tail(log)
    return outcome


def judge_fit(outcome: Outcome) -> str:
    """The job too big as asked: the payload must make it fit (smaller micro-batches) and finish."""
    if outcome.status == "ok" and outcome.fits:
        return f"ok: fitted to {outcome.fits[-1]} and finished"
    if outcome.status == "ok":
        return "failed: trained without running out of memory"
    return outcome.status


def judge_fit_peak(fitted: Outcome, afresh: Outcome, weights_gb: float) -> str:
    """The peak the fitted run's calibration reports beside the fitted setup started afresh.

    Both runs allocate the same tensors, so their peaks agree; a failed attempt's model still held while the smaller
    one loads or trains adds at least its weights. The fitted peak must be within half the weights of the fresh one.
    """
    if not afresh.status.startswith("ok"):
        return afresh.status
    if afresh.fits:
        return "failed: the fitted setup ran out of memory when started afresh"
    fitted_peak = (fitted.calibration or {}).get("peak_allocated_gb")
    afresh_peak = (afresh.calibration or {}).get("peak_allocated_gb")
    if fitted_peak is None or afresh_peak is None:
        return "failed: no calibration peak to compare"
    said = f"{fitted_peak:,.2f} GB after the fit, {afresh_peak:,.2f} GB afresh"
    if abs(fitted_peak - afresh_peak) > weights_gb / 2:
        return f"failed: {said}, apart by more than half the model's {weights_gb:,.2f} GB of weights"
    return f"ok: {said}"


def judge_no_fit(outcome: Outcome) -> str:
    """The job too big even at micro-batch 1: an ``error`` of kind ``oom`` saying so, with a hint."""
    if outcome.error_kind == "oom" and "micro-batch 1" in (outcome.message or ""):
        return "ok: ended as error kind oom at micro-batch 1, with a hint" if outcome.hint else "failed: no hint"
    if outcome.error_kind == "oom":
        return "failed: oom without trying micro-batch 1"
    if outcome.status == "ok":
        return "failed: trained without running out of memory"
    return outcome.status


def job_rows(shape: Shape) -> int:
    """How many examples a job of ``shape`` trains on (the trainer cycles through them)."""
    return shape.micro_batch * min(shape.steps, 4) if shape.micro_batch < 64 else shape.micro_batch


def train(
    model_dir: Path,
    method: str,
    shape: Shape,
    folder: Path,
    env: dict[str, str],
    timeout: float,
    rows: int | None = None,
    **keys: Any,
) -> Outcome:
    """Writes the job, runs the payload and reads its events; drops the trained output (disk), keeps the events.

    ``rows`` is the dataset's size (default :func:`job_rows`, another for the fitted job started afresh) and ``keys``
    are further job keys (a fitted job's ``grad_accum``, ``num_gpus``, ``strategy``).
    """
    job = write_job(folder, model_dir, method, shape, job_rows(shape) if rows is None else rows, **keys)
    code, seconds, log = run_payload(job, env, timeout)
    events = read_event_file(folder / "out" / EVENTS_FILE_NAME).events
    for heavy in ("model", "adapter", "checkpoints"):
        shutil.rmtree(folder / "out" / heavy, ignore_errors=True)
    return outcome_of(events, code, seconds, log)


# --- the check -------------------------------------------------------------------------------------------------------


@dataclass
class Check:
    """One run of the GPU check: its options, the environment and the report it fills."""

    smoke: bool
    site: Path
    workdir: Path
    budget_s: float
    run_timeout_s: float
    gpu: GpuSpec
    report: Report
    out: Path | None
    started: float = field(default_factory=time.monotonic)

    @property
    def cuda(self) -> bool:
        """Whether the machine has a CUDA GPU."""
        return bool(self.report.facts.get("cuda"))

    def elapsed(self) -> float:
        """Seconds since the check started."""
        return time.monotonic() - self.started

    def skip_reason(self, name: str, prediction: Prediction | None) -> str | None:
        """Why a run is not attempted, or None."""
        method, _ = method_and_objective(name)
        if method == "qlora" and not self.cuda:
            return NO_CUDA
        if method == "qlora" and not self.report.after.get("bitsandbytes"):
            return "skipped: bitsandbytes is not installed (carry its wheel: make gpu-wheels)"
        if prediction is not None and prediction.fit == "does not fit":
            return f"skipped: plan predicts it does not fit ({prediction.total_gb:.1f} GB)"
        if self.elapsed() > self.budget_s:
            return f"skipped: time budget of {self.budget_s:.0f} s spent"
        return None

    def run_case(self, model_dir: Path, arch: Architecture, method: str, shape: Shape) -> Row:
        """Predicts, then trains (or says why not) one model with one method."""
        prediction = predict(arch, method, shape, self.gpu)
        reason = self.skip_reason(method, prediction)
        if reason is not None:
            return Row(arch.name, method, shape, prediction, Outcome(status=reason))
        folder = self.workdir / f"{arch.name}-{method}"
        timeout = max(90.0, min(self.run_timeout_s, self.budget_s + 90 - self.elapsed()))
        outcome = train(model_dir, method, shape, folder, python_env(self.site), timeout)
        self.keep_log(folder / "payload.log", f"{arch.name}-{method}", outcome)
        return Row(arch.name, method, shape, prediction, outcome)

    def keep_log(self, log: Path, name: str, outcome: Outcome) -> None:
        """Copies the payload log of a failed run next to the report."""
        if self.out is not None and outcome.status.startswith("failed") and log.exists():
            logs = self.out.parent / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"{name}.log").write_text(log_tail(log, 200), encoding="utf-8")

    def run_fits(self, model_dir: Path, arch: Architecture) -> None:
        """Two full fine-tunes too big for the card: one the payload fits by itself, one it cannot fit at all."""
        fit, no_fit = (SMOKE_FIT_SHAPE, SMOKE_FIT_SHAPE) if self.smoke else (FIT_SHAPE, NO_FIT_SHAPE)
        self.report.fit = self._too_big(model_dir, arch, "fit", fit, judge_fit)
        self.save()
        if self.cuda and not self.smoke and self.report.fit.outcome.status.startswith("ok"):
            self.report.fit_afresh = self._fitted_afresh(model_dir, arch, self.report.fit)
            self.save()
        self.report.no_fit = self._too_big(model_dir, arch, "no fit", no_fit, judge_no_fit)

    def _too_big(self, model_dir: Path, arch: Architecture, name: str, shape: Shape, judge: Any) -> Row:
        env = python_env(self.site)
        if self.smoke:
            env["RENTUNE_TEST_MEMORY_LIMIT_BYTES"] = str(SMOKE_LIMITS[name])
        folder = self.workdir / f"{arch.name}-{name.replace(' ', '-')}"
        outcome = train(model_dir, "full", shape, folder, env, self.run_timeout_s)
        outcome.status = judge(outcome)
        self.keep_log(folder / "payload.log", f"{arch.name}-{name}", outcome)
        return Row(arch.name, "full", shape, predict(arch, "full", shape, self.gpu), outcome)

    def _fitted_afresh(self, model_dir: Path, arch: Architecture, fitted: Row) -> Row:
        """The setup the payload fitted to, started afresh on the same data: its peak is what the fit must report.

        Only on a GPU: a CPU has no peak to compare, and the tiny model's weights are below the peaks' rounding.
        """
        measured = fitted.outcome.calibration or {}
        shape = replace(fitted.shape, micro_batch=int(measured.get("micro_batch", fitted.shape.micro_batch)))
        setup = {key: measured[key] for key in ("grad_accum", "gradient_checkpointing") if key in measured}
        folder = self.workdir / f"{arch.name}-fit-afresh"
        rows = job_rows(fitted.shape)  # the fitted run's data, so each step is the same
        outcome = train(model_dir, "full", shape, folder, python_env(self.site), self.run_timeout_s, rows, **setup)
        outcome.status = judge_fit_peak(fitted.outcome, outcome, weights_gb=arch.total_params * 2 / 1e9)  # bf16
        self.keep_log(folder / "payload.log", f"{arch.name}-fit-afresh", outcome)
        return Row(arch.name, "full", shape, None, outcome)

    def run_fsdp(self, model_dir: Path, arch: Architecture, shape: Shape) -> None:
        """The FSDP pass (tests/gpu/fsdp_check.py) on two GPUs: rank-0 loading and sharding, then a LoRA run."""
        reason = skip_reason(cuda_count())
        if reason is None and self.elapsed() > self.budget_s:
            reason = f"skipped: time budget of {self.budget_s:.0f} s spent"
        if reason is not None:
            self.report.fsdp_note = reason
            return
        env = python_env(self.site)
        self.report.fsdp = probe_rows(self.workdir / f"{arch.name}-fsdp-probe", model_dir, env, self.run_timeout_s)
        self.save()
        folder, name = self.workdir / f"{arch.name}-lora-fsdp", f"lora (fsdp, {FSDP_GPUS} GPUs)"
        outcome = train(model_dir, "lora", shape, folder, env, self.run_timeout_s, num_gpus=FSDP_GPUS, strategy="fsdp")
        self.keep_log(folder / "payload.log", f"{arch.name}-lora-fsdp", outcome)
        self.report.rows.append(Row(arch.name, name, shape, None, outcome))

    def run_serve(self, model_dir: Path, arch: Architecture, shape: Shape) -> None:
        """The serving pass (tests/gpu/serve_check.py): a LoRA trained here, served by vLLM, asked, stopped."""
        env = python_env(self.site)
        reason = NO_CUDA if not self.cuda else None if vllm_installed(env) else NO_VLLM
        if reason is None and self.elapsed() > self.budget_s:
            reason = f"skipped: time budget of {self.budget_s:.0f} s spent"
        if reason is not None:
            self.report.serve = ServeRow(reason)
            return
        folder = self.workdir / f"{arch.name}-lora-served"
        job = write_job(folder, model_dir, "lora", shape, job_rows(shape))
        code, _seconds, log = run_payload(job, env, self.run_timeout_s)
        if code != 0:
            self.report.serve = ServeRow(f"failed: training the adapter to serve exited {code}: {log_tail(log, 3)}")
            return
        try:
            self.report.serve = serve_adapter(job, env, self.run_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failed request is the pass's verdict, not the check's crash
            self.report.serve = ServeRow(f"failed: {type(exc).__name__}: {exc}")
        self.keep_log(folder / "serve-wrapper.log", f"{arch.name}-served", Outcome(status=self.report.serve.status))

    def save(self) -> None:
        """Writes the report so far (a check cut short still leaves what it measured)."""
        self.report.elapsed_s = round(self.elapsed(), 1)
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(render(self.report), encoding="utf-8")
            self.out.with_suffix(".json").write_text(json.dumps(asdict(self.report), indent=1, default=str))


def run_model(check: Check, model: str, methods: tuple[str, ...], shape: Shape, oom: bool, fsdp: bool) -> None:
    """Builds one model, runs its methods (and the OOM check and the FSDP pass when asked), then deletes it."""
    folder = check.workdir / "models" / model
    try:
        arch = build_smoke_model(folder) if check.smoke else build_real_shape_model(model, folder)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be built is a row of the report, not a crash
        check.report.problems.append(f"building {model} failed: {type(exc).__name__}: {exc}")
        return
    for method in methods:
        check.report.rows.append(check.run_case(folder, arch, method, shape))
        check.save()
    if oom:
        check.run_fits(folder, arch)
        check.save()
    if fsdp:
        check.run_fsdp(folder, arch, shape)
        check.save()
        check.run_serve(folder, arch, shape)
        check.save()
    shutil.rmtree(folder, ignore_errors=True)


def run_all(check: Check, models: tuple[str, ...], methods: tuple[str, ...], shape: Shape) -> None:
    """Every model and method in order; the fit checks (on a CPU: under the test limit), the FSDP pass (two GPUs or
    more) and the vLLM serving pass (vLLM and a GPU) ride on the first model."""
    oom_wanted = check.cuda or check.smoke
    if not oom_wanted:
        check.report.oom_note = NO_CUDA
    for index, model in enumerate(models):
        if check.elapsed() > check.budget_s:
            skipped = Outcome(status=f"skipped: time budget of {check.budget_s:.0f} s spent")
            check.report.rows += [Row(model, method, shape, None, skipped) for method in methods]
            continue
        run_model(check, model, methods, shape, oom=oom_wanted and index == 0, fsdp=index == 0)


def exit_code(report: Report) -> int:
    """1 when a run failed, the OOM, FSDP or serving check failed, a model could not be built or torch was replaced;
    else 0."""
    rows = [*report.rows, *(row for row in (report.fit, report.fit_afresh, report.no_fit) if row)]
    failed = any(row.outcome.status.startswith("failed") for row in rows)
    failed = failed or any(row.status.startswith("failed") for row in report.fsdp)
    failed = failed or (report.serve is not None and report.serve.status.startswith("failed"))
    return 1 if failed or report.problems or replaced(report) else 0


def replaced(report: Report) -> list[str]:
    """The image-owned packages whose version or location changed once the carried wheels are on the path."""
    return [name for name in IMAGE_OWNED if report.before.get(name) != report.after.get(name)]


# --- the report ------------------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _gb(value: float | None) -> str:
    """GB with two decimals, or three significant digits below 1 GB (the smoke model needs a few MB)."""
    if value is None:
        return "n/a"
    return f"{value:,.2f}" if value >= 1 else f"{value:.3g}"


def _ratio(measured: float | None, predicted: float | None) -> str:
    if not measured or predicted is None:
        return "n/a"
    return f"{(predicted - measured) / measured:+.0%}"


def _package_cell(info: dict[str, Any] | None) -> str:
    return "absent" if not info else f"{info['version']} (`{info['where']}`)"


def render_packages(report: Report) -> list[str]:
    """The packages before and after the carried wheels, and the torch verdict."""
    lines = ["## Packages: the image's torch stays in place", ""]
    lines += ["| package | image alone | with the carried wheels |", "|---|---|---|"]
    for name in PROBED:
        before, after = report.before.get(name), report.after.get(name)
        same = "same" if before == after and before else _package_cell(after)
        lines.append(f"| {name} | {_package_cell(before)} | {same} |")
    changed = replaced(report)
    torch = report.after.get("torch") or {}
    verdict = (
        f"REPLACED: {', '.join(changed)} changed once the carried wheels are on the path."
        if changed
        else f"torch unchanged: {torch.get('version')} from `{torch.get('where')}` before and after."
    )
    return [*lines, "", verdict, ""]


def render_training(report: Report) -> list[str]:
    """The training table: measured beside the plan."""
    lines = [
        f"## Training: measured beside `rentune plan` ({report.plan_gpu}, 1 GPU)",
        "",
        f"LoRA r {LORA_R} on all linear layers, dropout 0.05, gradient checkpointing, grad-accum 1, the payload's "
        "precision (bf16 on the GPU). Memory: the peak `torch.cuda.max_memory_reserved` over the steps beside the "
        "plan's total without its CUDA context term (not in torch's counters); error = (plan - measured) / measured. "
        "tokens/s: median over the steps after the first third.",
        "",
        "| model | method | shape | status | reserved GB | allocated GB | plan GB | plan fit | memory error "
        "| tokens/s | plan tokens/s | speed error | final loss | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    compare = bool(report.facts.get("cuda"))  # a CPU's memory and speed say nothing about a GPU's prediction
    lines += [_training_line(row, compare) for row in report.rows]
    failed = [row for row in report.rows if row.outcome.status.startswith("failed")]
    if failed:
        lines += ["", "Failures (payload logs in `logs/` beside this report):", ""]
        lines += [f"- {row.model} {row.method}: {_one_line(row.outcome.message)}" for row in failed]
    return [*lines, ""]


def _one_line(message: str | None, limit: int = 300) -> str:
    text = " ".join((message or "no message").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _training_line(row: Row, compare: bool) -> str:
    o, p = row.outcome, row.prediction
    plan_gb = None if p is None else p.total_gb - p.context_gb
    cells = [
        row.model,
        row.method,
        row.shape.describe(),
        o.status,
        _gb(o.peak_reserved_gb),
        _gb(o.peak_allocated_gb),
        _gb(plan_gb),
        p.fit if p else "n/a",
        _ratio(o.peak_reserved_gb, plan_gb) if compare else "n/a",
        _num(o.tokens_per_s, 0),
        _num(p.tokens_per_s if p else None, 0),
        _ratio(o.tokens_per_s, p.tokens_per_s if p else None) if compare else "n/a",
        _num(o.final_loss, 3),
        _num(o.seconds, 0) if o.seconds else "",
    ]
    return "| " + " | ".join(cells) + " |"


def render_fits(report: Report) -> list[str]:
    """The jobs too big for the card: what the plan said, what the payload tried, and how it ended."""
    lines = ["## Fitting on the machine: jobs too big for the card", ""]
    if report.fit is None and report.no_fit is None:
        return [*lines, report.oom_note or "not run", ""]
    limit = " (on this CPU, under the payload's test memory limit)" if "smoke" in report.mode else ""
    lines += [
        f"A full fine-tune that must be made to fit by halving its micro-batch, and one that cannot fit{limit}. On a "
        "GPU the fitted setup is also started afresh: the peak the fit's calibration reports must match that run's "
        "within half the model's weights (a failed attempt's model still held adds all of them).",
        "",
        "| job | shape | plan | outcome | tried | error kind | peak allocated GB | message |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in (("fit", report.fit), ("fitted setup afresh", report.fit_afresh), ("no fit", report.no_fit)):
        if row is None:
            continue
        o, p = row.outcome, row.prediction
        plan = f"{p.fit} ({p.total_gb:,.0f} GB)" if p else "n/a"
        lines.append(
            f"| {name}: {row.model} {row.method} | {row.shape.describe()} | {plan} | {o.status} "
            f"| {'; '.join(o.fits) or 'nothing'} | {o.error_kind or 'none'} | {_num(o.peak_allocated_gb, 2)} "
            f"| {_one_line(o.message, 160) if o.message else ''} |"
        )
    return [*lines, ""]


def render_calibration(report: Report) -> list[str]:
    """The first measured steps of each run (what the app re-estimates from) beside the plan's speed."""
    lines = [
        "## First measured steps (the calibration event the app re-estimates from)",
        "",
        "| model | method | measured as | steps | seconds/step | tokens/s | plan tokens/s | peak reserved GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in [*report.rows, *(r for r in (report.fit, report.fit_afresh) if r)]:
        c = row.outcome.calibration
        if c is None:
            continue
        setup = f"seq {c.get('seq_len')} x micro-batch {c.get('micro_batch')} x grad-accum {c.get('grad_accum')}"
        lines.append(
            f"| {row.model} | {row.method} | {setup} | {c.get('steps')} | {_num(c.get('seconds_per_step'), 3)} "
            f"| {_num(c.get('tokens_per_s'), 0)} | {_num(row.prediction.tokens_per_s if row.prediction else None, 0)} "
            f"| {_gb(c.get('peak_reserved_gb'))} |"
        )
    return [*lines, ""]


def render(report: Report) -> str:
    """The whole report as Markdown."""
    facts = report.facts
    device = (
        f"{facts['gpu']} ({facts['gpu_gib']} GiB), driver {facts.get('driver')}, CUDA {facts.get('cuda_version')}"
        if facts.get("cuda")
        else "CPU (no CUDA)"
    )
    lines = [
        "# Rentune GPU check",
        "",
        f"- mode: {report.mode}",
        f"- device: {device}; Python {facts['python']}, torch {facts['torch']}",
        f"- predictions for: {report.plan_gpu}",
        f"- elapsed: {report.elapsed_s:.0f} s",
        "",
    ]
    lines += [f"**Problem:** {problem}" for problem in report.problems]
    lines += [""] if report.problems else []
    sections = [*render_packages(report), *render_training(report), *render_calibration(report), *render_fits(report)]
    sections += [*render_fsdp(report.fsdp, report.fsdp_note), *render_serve(report.serve)]
    return "\n".join([*lines, *sections])


# --- command line ----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The check's options."""
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few steps: tests the logic on a CPU")
    parser.add_argument(
        "--models", default=",".join(MODELS), help="catalog aliases; the first also runs the fit checks"
    )
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="qlora,lora,full,lora+dpo (a method, or a method+objective)"
    )
    parser.add_argument("--steps", type=int, help=f"training steps per run (default {FULL_SHAPE.steps})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per example (default {FULL_SHAPE.seq_len})")
    parser.add_argument("--micro-batch", type=int, help=f"examples per step (default {FULL_SHAPE.micro_batch})")
    parser.add_argument("--gpu", help="GPU of resources/gpus.json to predict for (default: the card found)")
    parser.add_argument("--site", type=Path, default=SITE_DIR, help="where make gpu-install put the wheels")
    parser.add_argument("--workdir", type=Path, help="scratch folder for models and runs (default: a temp folder)")
    parser.add_argument("--out", type=Path, help="report file (default: $OUT/gpu_check.md when OUT is set)")
    parser.add_argument("--budget-s", type=float, default=380.0, help="start no new run after this many seconds")
    parser.add_argument("--run-timeout-s", type=float, default=240.0, help="limit of one payload run")
    return parser.parse_args(argv)


def training_shape(args: argparse.Namespace) -> Shape:
    """The shape of the training runs: the mode's default with the options' overrides."""
    base = SMOKE_SHAPE if args.smoke else FULL_SHAPE
    return Shape(
        seq_len=args.seq_len or base.seq_len,
        micro_batch=args.micro_batch or base.micro_batch,
        steps=args.steps or base.steps,
    )


def report_path(args: argparse.Namespace) -> Path | None:
    """``--out``, else ``$OUT/gpu_check.md``, else nothing (stdout only)."""
    if args.out:
        return Path(args.out)
    return Path(os.environ["OUT"]) / "gpu_check.md" if os.environ.get("OUT") else None


def start(args: argparse.Namespace, workdir: Path) -> Check:
    """Reads the machine and the packages, and sets up the check."""
    facts = machine_facts()
    gpu, gpu_note = plan_gpu(facts, args.gpu)
    mode = "smoke (tiny model, logic check)" if args.smoke else "full (real shapes)"
    report = Report(mode, facts, gpu_note, before=probe_packages(None), after=probe_packages(args.site))
    return Check(args.smoke, args.site, workdir, args.budget_s, args.run_timeout_s, gpu, report, report_path(args))


def main(argv: list[str] | None = None) -> int:
    """Runs the check; prints the report and returns the exit code."""
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rentune-gpu-check-"))
    try:
        check = start(args, workdir)
        missing = missing_packages(check.report.after)
        if missing:
            check.report.problems.append(
                f"the payload cannot start: {', '.join(missing)} missing (see make gpu-wheels)"
            )
        else:
            models = (SMOKE_MODEL,) if args.smoke else tuple(m for m in args.models.split(",") if m)
            run_all(check, models, tuple(m for m in args.methods.split(",") if m), training_shape(args))
        check.save()
        print(render(check.report))
        return 2 if missing else exit_code(check.report)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
