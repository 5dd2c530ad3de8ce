"""Estimate, measure, correct: what sizing predicted for a run, what its machine measured, and what later plans learn.

A rented run stores the prediction for the GPU it got (peak memory, tokens/s, hours, dollars) once its machine is
up; the measurement comes from its step events and the ledger. Finished runs' speed ratios per GPU type then
calibrate later plans (:mod:`desktop.core.sizing.calibration`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop.core.runs.states import RunState
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.calibration import (
    Calibration,
    JobKind,
    Learned,
    MemorySample,
    SpeedSample,
    calibrate,
    calibrated,
    calibration_note,
    memory_corrections,
    memory_note,
)
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.plan import evaluate
from desktop.core.sizing.setup import DEFAULT_SETUP
from desktop.services.models.configs import ModelResolutionError, load_gpus, resolve_model
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunRecord, RunStore
from trainer_payload.protocol import EVENTS_FILE_NAME, EventKind

if TYPE_CHECKING:
    from desktop.services.billing.ledger import Rental

_log = get_logger("estimates")


def predict(
    spec: dict[str, Any], gpu_name: str, count: int, price_per_hour: float, gpus: Sequence[GpuSpec]
) -> dict[str, Any] | None:
    """What sizing predicts for the run's job on ``count`` x ``gpu_name`` at ``price_per_hour`` (blocking).

    Returns:
        ``gpu``, ``count``, ``peak_gb`` (per GPU), ``tokens_per_s``, ``hours``, ``usd`` and ``job`` (its
        :class:`JobKind`); None when the GPU type is unknown to the catalog or the model cannot be sized (the reason
        is logged).
    """
    # The data and sizing services load tokenizers' and keyring modules: only a prediction needs them, not a plan's
    # look at past runs.
    from desktop.services.data.prepare import manifest_tokens, read_manifest
    from desktop.services.models.sizing import SizingError, draft_workload, training_setup

    gpu = find_gpu(list(gpus), gpu_name)
    if gpu is None:
        _log.info("no estimate: %s is not in the GPU catalog", gpu_name)
        return None
    training = dict(spec.get("training") or {})
    try:
        setup = training_setup(str(training.get("method", DEFAULT_SETUP.method.value)), {**training, "num_gpus": count})
        arch = resolve_model(str(spec["base_model"]))
    except (SizingError, ModelResolutionError, ArchitectureError) as exc:
        _log.info("no estimate for %s: %s", spec.get("base_model"), exc)
        return None
    manifest = read_manifest(str(spec.get("train_file") or ""))
    workload, _ = draft_workload(training, setup, manifest_tokens(manifest) if manifest else None)
    option = evaluate(arch, setup, replace(gpu, list_price_usd_per_h=price_per_hour / count), workload)
    return {
        "gpu": gpu.id,
        "count": count,
        "peak_gb": round(option.memory.per_gpu_total, 2),
        "tokens_per_s": option.tokens_per_s,
        "hours": option.hours,
        "usd": round(option.hours * price_per_hour, 2),
        "job": JobKind.of(arch, setup).as_dict(),
    }


def measured_memory(spec: dict[str, Any], calibration: dict[str, Any]) -> dict[str, Any] | None:
    """The calibration's peak beside the memory model's peak for the setup it measured (blocking), for later plans.

    The model's peak leaves out the CUDA context (outside the framework's counters, like the measurement); the
    setup is the one measured (its micro-batch may have been made smaller to fit).

    Returns:
        ``peak_gb``, ``model_peak_gb``, ``gpu`` and ``job``; None without a measured GPU peak (a CPU) or a
        prediction for the run's GPU type (an own server), or when the model cannot be sized.
    """
    from desktop.services.models.sizing import SizingError, training_setup

    peak, predicted = calibration.get("peak_reserved_gb"), spec.get("predicted")
    if not isinstance(peak, int | float) or peak <= 0 or not isinstance(predicted, dict) or not predicted.get("gpu"):
        return None
    training = dict(spec.get("training") or {}) | {"num_gpus": int(predicted.get("count") or 1)}
    training |= {k: calibration[k] for k in ("micro_batch", "grad_accum", "gradient_checkpointing") if k in calibration}
    try:
        setup = training_setup(str(training.get("method", DEFAULT_SETUP.method.value)), training)
        arch = resolve_model(str(spec["base_model"]))
    except (SizingError, ModelResolutionError, ArchitectureError) as exc:
        _log.info("no memory model for %s: %s", spec.get("base_model"), exc)
        return None
    memory = estimate_memory(arch, setup)
    return {
        "peak_gb": round(float(peak), 3),
        "model_peak_gb": round(memory.counted_gb, 3),
        "gpu": str(predicted["gpu"]),
        "job": JobKind.of(arch, setup).as_dict(),
    }


def measure(folder: Path, rentals: Iterable[Rental], now: float | None = None) -> dict[str, Any]:
    """What the run's machines measured: median tokens/s of its steps, peak GPU memory, rented hours and dollars."""
    now = time.time() if now is None else now
    # Steps carry free fields (GPU readings) beside the declared ones: read them as plain mappings.
    steps: list[dict[str, Any]] = [dict(e) for e in mirrored_events(folder) if e["event"] is EventKind.STEP]
    speeds = [float(e["tokens_per_s"]) for e in steps if isinstance(e.get("tokens_per_s"), int | float)]
    peaks = [float(e["gpu_mem_reserved_gb"]) for e in steps if isinstance(e.get("gpu_mem_reserved_gb"), int | float)]
    rentals = list(rentals)
    seconds = sum(((r.stopped or now) - r.started) for r in rentals)
    return {
        "tokens_per_s": round(statistics.median(speeds), 1) if speeds else None,
        "peak_gb": max(peaks) if peaks else None,
        "hours": round(seconds / 3600, 4) if rentals else None,
        "usd": round(sum(r.usd(now) for r in rentals), 4) if rentals else None,
        "steps": int(steps[-1]["step"]) if steps else 0,
    }


def speed_samples(store: RunStore) -> list[SpeedSample]:
    """Predicted and measured speeds of the finished runs that have both."""
    samples = []
    for record in store.all():
        sample = _sample(store, record)
        if sample is not None:
            samples.append(sample)
    return samples


#: Each run's speed sample with what it was read from (state, prediction, events file size and time), by events
#: file: a finished run's events never change, so planning and the Costs page read each file once per process.
_SAMPLES: dict[Path, tuple[tuple[object, ...], SpeedSample | None]] = {}


def _sample(store: RunStore, record: RunRecord) -> SpeedSample | None:
    """The run's predicted and measured speed (None when either is missing).

    Measured: its first minutes' calibration (any run that got that far), else its steps' median once finished.
    """
    predicted = record.spec.get("predicted")
    if not isinstance(predicted, dict) or not predicted.get("tokens_per_s") or not predicted.get("gpu"):
        return None
    path = store.folder(record.id) / EVENTS_FILE_NAME
    try:
        stat = path.stat()
    except OSError:
        return None  # no events: nothing measured
    key = (record.state, tuple(sorted(map(str, predicted.items()))), stat.st_size, stat.st_mtime_ns)
    cached = _SAMPLES.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    sample = _read_sample(store, record, predicted)
    _SAMPLES[path] = (key, sample)
    return sample


def _read_sample(store: RunStore, record: RunRecord, predicted: dict[str, Any]) -> SpeedSample | None:
    """The sample of :func:`_sample`, read from the run's events."""
    events = mirrored_events(store.folder(record.id))
    calibration = next((e for e in events if e["event"] is EventKind.CALIBRATION), None)
    measured = calibration.get("tokens_per_s") if calibration is not None else None
    if not measured and record.state is RunState.FINISHED:
        measured = measure(store.folder(record.id), ())["tokens_per_s"]
    if not measured:
        return None
    kind = JobKind.from_dict(predicted.get("job"))
    return SpeedSample(str(predicted["gpu"]), float(predicted["tokens_per_s"]), float(measured), record.id, kind)


def memory_samples(store: RunStore) -> list[MemorySample]:
    """The measured and modelled peak memory of every run whose first minutes measured it on a known GPU type."""
    samples = []
    for record in store.all():
        measured = record.spec.get("measured")
        memory = measured.get("memory") if isinstance(measured, dict) else None
        kind = JobKind.from_dict(memory.get("job")) if isinstance(memory, dict) else None
        if isinstance(memory, dict) and kind is not None:
            modelled, peak = float(memory["model_peak_gb"]), float(memory["peak_gb"])
            samples.append(MemorySample(kind, str(memory["gpu"]), modelled, peak, record.id))
    return samples


def learned_for(kind: JobKind | None, store: RunStore | None = None) -> Learned:
    """What the runs on this computer teach a plan for ``kind``: measured speeds per GPU type, measured peaks.

    Speed: runs of the same kind on a GPU type when there are any, else every run on it. Memory: runs of the same
    kind only.
    """
    catalog = list(load_gpus())
    if store is None and not (app_paths().data_dir / "runs.db").exists():
        return Learned(catalog, {})  # no run yet: nothing to learn from, and nothing is created just to look
    try:
        store = store or RunStore()
        speeds = calibrate(speed_samples(store), kind)
        memory = memory_corrections(memory_samples(store), kind) if kind else {}
    except OSError as exc:
        _log.warning("cannot read past runs to learn from: %s", exc)
        return Learned(catalog, {})
    notes = tuple(note for note in (calibration_note(speeds, catalog), memory_note(memory, catalog)) if note)
    return Learned(calibrated(catalog, speeds), memory, notes)


def load_calibrations(store: RunStore | None = None) -> dict[str, Calibration]:
    """Per GPU type, how its measured speed compares with the estimate (from the finished runs on this computer)."""
    if store is None and not (app_paths().data_dir / "runs.db").exists():
        return {}  # no run yet: nothing to learn from, and nothing is created just to look
    try:
        return calibrate(speed_samples(store or RunStore()))
    except OSError as exc:
        _log.warning("cannot read past runs for calibration: %s", exc)
        return {}


def calibrated_gpus(store: RunStore | None = None) -> tuple[list[GpuSpec], dict[str, Calibration]]:
    """The GPU catalog with measured speeds applied, and the calibrations used."""
    calibrations = load_calibrations(store)
    return calibrated(load_gpus(), calibrations), calibrations


def paid_idle(
    record: RunRecord, transitions: Sequence[dict[str, Any]], rentals: Sequence[Rental], folder: Path
) -> dict[str, float | None]:
    """Seconds paid for nothing: machines' creation to their first step, and the adapter's arrival to termination.

    Returns:
        ``create_to_first_step_s`` (summed over the run's machines) and ``adapter_to_terminate_s`` (None until the
        run finished and its machines are terminated).
    """
    steps = sorted(float(e["ts"]) for e in mirrored_events(folder) if e["event"] is EventKind.STEP)
    before_steps = 0.0
    for rental in rentals:
        end = rental.stopped or time.time()
        first = next((ts for ts in steps if rental.started <= ts <= end), None)
        before_steps += (first if first is not None else end) - rental.started
    after_adapter = None
    if record.state is RunState.FINISHED and rentals and all(r.stopped for r in rentals):
        finished = max((float(t["ts"]) for t in transitions if t["to_state"] == RunState.FINISHED.value), default=None)
        last_stop = max(float(r.stopped or 0) for r in rentals)
        after_adapter = max(0.0, last_stop - finished) if finished is not None else None
    return {
        "create_to_first_step_s": round(before_steps, 1) if rentals else None,
        "adapter_to_terminate_s": round(after_adapter, 1) if after_adapter is not None else None,
    }


def run_money(
    record: RunRecord, transitions: Sequence[dict[str, Any]], rentals: Sequence[Rental], folder: Path
) -> dict[str, Any]:
    """A run's renting as ``rentune runs --json`` shows it: machines, prediction, measurement, paid idle."""
    return {
        "machines": [
            {
                "provider": r.provider,
                "instance_id": r.instance_id,
                "gpu": r.gpu,
                "price_per_hour": r.price_per_hour,
                "started": r.started,
                "stopped": r.stopped,
                **({"cluster": r.machine_id, "node": r.node} if r.cluster else {}),
            }
            for r in rentals
        ],
        "predicted": record.spec.get("predicted"),
        "measured": measure(folder, rentals),
        "paid_idle": paid_idle(record, transitions, rentals, folder),
    }
