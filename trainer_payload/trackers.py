"""The trackers a run reports to besides its event stream: TensorBoard, trackio and Weights & Biases.

TensorBoard's event files and trackio's database are written in the output folder and copied into every sealed
checkpoint and the adapter, so they come home verified with them; a resume on another machine puts the checkpoint's
copies back first, and the curves go on where they stopped. W&B's key reaches the trainer over stdin like the Hub
token (the launch shell exports it to this process only); :func:`prepare_trackers` takes it out of the environment
and hands it to wandb in memory, so wandb's service process, the trainer's other children and the machine's disk never
hold it. A W&B that cannot be reached costs the run its W&B curves, never the training: it goes on without it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

from trainer_payload.protocol import TENSORBOARD_DIR_NAME, TRACKER_DIR_NAMES, TRACKIO_DIR_NAME, JobSpec

#: Where the launch shell puts the W&B key it read from stdin (only when the run reports to W&B).
WANDB_KEY_VARIABLE = "WANDB_API_KEY"
#: Seconds the first contact with W&B may take before the run goes on without it (the GPU bills meanwhile).
WANDB_INIT_SECONDS = 30.0


def take_wandb_key() -> str:
    """The W&B key from this process's environment, removed from it (every child started later is without it)."""
    return os.environ.pop(WANDB_KEY_VARIABLE, "").strip()


def point_trackers_at(output_dir: Path) -> None:
    """Tells TensorBoard and trackio where to write (both read their folders from the environment only)."""
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(output_dir / TENSORBOARD_DIR_NAME)
    os.environ["TRACKIO_DIR"] = str(output_dir / TRACKIO_DIR_NAME)


def tracking_arguments(spec: JobSpec) -> dict[str, Any]:
    """The training arguments of the run's trackers: where they report, the project and the run's name.

    trackio's arguments only for a run reporting to it (a transformers before trackio has no such arguments).
    """
    arguments: dict[str, Any] = {"report_to": list(spec.report_to) or "none", "run_name": spec.run_name or None}
    if "trackio" in spec.report_to:
        arguments["project"] = spec.tracking_project  # W&B reads its project from WANDB_PROJECT instead
        arguments["trackio_static_space_id"] = False  # never publish a Space from the rented machine
    return arguments


def start_wandb(spec: JobSpec, key: str, output_dir: Path) -> str | None:
    """Opens the run's W&B run with ``key`` held in memory; returns why it could not (then the run goes on without).

    The run id is the Rentune run's name, so a resume on another machine continues the same W&B run.
    """
    if not key:
        return "W&B has no API key on this machine (the app sends it when the run starts); training goes on without it"
    import wandb

    # Never wandb.login(key=...): it writes the key into ~/.netrc. A key in the settings stays in this process.
    server = {"base_url": spec.wandb_url} if spec.wandb_url else {}  # else wandb's own default server
    settings = wandb.Settings(api_key=key, init_timeout=WANDB_INIT_SECONDS, quiet=True, **server)
    os.environ["WANDB_PROJECT"] = spec.tracking_project  # transformers' W&B callback reads the project from here
    wandb_dir = output_dir / "wandb-files"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    try:
        wandb.setup(settings=settings)
        wandb.init(
            project=spec.tracking_project,
            name=spec.run_name or None,
            id=spec.run_name or None,
            resume="allow",
            dir=str(wandb_dir),
        )
    except Exception as exc:  # noqa: BLE001 - any W&B failure leaves the training running
        return f"W&B could not start the run ({type(exc).__name__}: {str(exc)[:300]}); training goes on without it"
    return None


def finish_wandb(exit_code: int) -> None:
    """Marks the W&B run ended with the trainer's exit code (transformers' callback leaves it open)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)


def copy_tracker_logs(output_dir: Path, folder: Path) -> None:
    """Copies the trackers' logs so far into ``folder`` (a checkpoint or the adapter), before its seal.

    trackio's databases are copied with SQLite's backup, a consistent copy while trackio may be writing.
    """
    logs = output_dir / TENSORBOARD_DIR_NAME
    if logs.is_dir():
        shutil.copytree(logs, folder / TENSORBOARD_DIR_NAME, dirs_exist_ok=True)
    _flush_trackio()
    databases = sorted((output_dir / TRACKIO_DIR_NAME).glob("*.db"))
    if databases:
        (folder / TRACKIO_DIR_NAME).mkdir(exist_ok=True)
    for database in databases:
        _backup(database, folder / TRACKIO_DIR_NAME / database.name)


def restore_tracker_logs(checkpoint: Path, output_dir: Path) -> None:
    """Puts a checkpoint's tracker logs back in the output folder when this machine has none (a resume elsewhere)."""
    for name in TRACKER_DIR_NAMES.values():
        kept, live = checkpoint / name, output_dir / name
        if kept.is_dir() and not live.exists():
            shutil.copytree(kept, live)


def _flush_trackio() -> None:
    """Writes trackio's queued rows now (it writes every half second), so a checkpoint holds its steps' curves.

    trackio has no public flush; without its queue (another version) the copy is at most half a second behind.
    """
    trackio = sys.modules.get("trackio")
    run = trackio.context_vars.current_run.get() if trackio is not None else None
    flush, lock = getattr(run, "_flush_queues_inline", None), getattr(run, "_client_lock", None)
    if flush is not None and lock is not None:
        with lock:
            flush()


def _backup(source: Path, target: Path) -> None:
    with sqlite3.connect(source) as reading, sqlite3.connect(target) as writing:
        reading.backup(writing)
    reading.close()
    writing.close()
