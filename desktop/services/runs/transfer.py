"""Sending a run to its machine: what travels, and the upload itself.

What travels: the payload, the data, a model folder from this computer, the job, and a checkpoint to resume from.
The machine's work folder is checked first (writable, room enough), so a full disk fails early in its own words.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from desktop.core.runs.states import RunState
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine
from desktop.services.runs.checkpoints import newest_local_checkpoint
from desktop.services.runs.context import RunContext
from trainer_payload.protocol import EVENTS_FILE_NAME, JOB_FILE_NAME

#: What the job names a model folder uploaded from this computer.
LOCAL_MODEL = "model"


async def upload(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Uploads everything the run needs to its remote folder and writes the job file (moves the run to uploading).

    Raises:
        RemoteError: The work folder cannot be made or written.
        PermanentError: The machine's disk is too small for the upload.
    """
    record = ctx.store.transition(run_id, RunState.UPLOADING)
    remote, spec, local = str(record.remote_dir), record.spec, ctx.folder(run_id)
    files: list[tuple[Path, str]] = [(Path(str(p)), f"payload/trainer_payload/{p.name}") for p in payload_files()]
    files.append((Path(spec["train_file"]), "data/train.jsonl"))
    if spec.get("eval_file"):
        files.append((Path(spec["eval_file"]), "data/eval.jsonl"))
    model_files = local_model_files(spec["base_model"])
    files += model_files
    job = {
        "base_model": LOCAL_MODEL if model_files else spec["base_model"],
        "train_file": "data/train.jsonl",
        "eval_file": "data/eval.jsonl" if spec.get("eval_file") else None,
        "output_dir": "out",
        **spec["training"],
    }
    (local / JOB_FILE_NAME).write_text(json.dumps(job, indent=2), encoding="utf-8")
    files.append((local / JOB_FILE_NAME, JOB_FILE_NAME))
    files += resume_files(ctx, run_id)
    await check_workdir(machine, remote, sum(path.stat().st_size for path, _ in files))
    for path, relative in files:
        await machine.upload(path, f"{remote}/{relative}", ctx.progress("upload"))
        ctx.made_progress(run_id)
    ctx.report(f"uploaded {len(files)} files to {record.target}")


async def check_workdir(machine: Machine, remote: str, needed: int) -> None:
    """Fails early, in the machine's words, when the work folder cannot be made or written or is too small.

    Raises:
        RemoteError: The folder cannot be made or written (classified as permanent by its message).
        PermanentError: Its disk has too little room for the upload.
    """
    folder, probe = shlex.quote(remote), shlex.quote(f"{remote}/.rentune-write-test")
    out = await machine.run(
        f"mkdir -p {folder} && : > {probe} && rm -f {probe} && df -Pk {folder} | tail -n 1 && du -sk {folder}"
    )
    lines = [line.split() for line in out.splitlines() if line.strip()]
    try:
        free, used = int(lines[0][3]) * 1024, int(lines[1][0]) * 1024
    except (IndexError, ValueError):
        return  # an unusual df: the copy itself will tell
    if free + used < needed:
        raise PermanentError(
            f"the machine has {free / 1e9:,.2f} GB free in {remote} but the upload needs {needed / 1e9:,.2f} GB; "
            "free space (or rent a machine with a larger disk), then resume the run"
        )


def resume_files(ctx: RunContext, run_id: str) -> list[tuple[Path, str]]:
    """On a new machine: the newest local checkpoint and the event history, so the payload resumes."""
    local = ctx.folder(run_id)
    files: list[tuple[Path, str]] = []
    newest = newest_local_checkpoint(local / "checkpoints")
    if newest is not None:
        files += [
            (p, f"out/checkpoints/{newest.name}/{p.relative_to(newest)}")
            for p in sorted(newest.rglob("*"))
            if p.is_file()
        ]
        ctx.report(f"resuming from local {newest.name}")
    if (local / EVENTS_FILE_NAME).exists():
        files.append((local / EVENTS_FILE_NAME, f"out/{EVENTS_FILE_NAME}"))
    return files


def local_model_files(base_model: str) -> list[tuple[Path, str]]:
    """A model folder on this computer travels with the run (to ``model/``); a Hub id is downloaded there."""
    folder = Path(base_model).expanduser()
    if not folder.is_dir():
        return []
    return [
        (path, f"{LOCAL_MODEL}/{path.relative_to(folder).as_posix()}")
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]


def model_from_hub(folder: Path, base_model: str) -> bool:
    """Whether the run's job downloads its model from the Hub (a local model folder is uploaded to ``model/``).

    The job file written at upload decides (the local folder may have moved since); without it, the spec does.
    """
    try:
        job = json.loads((folder / JOB_FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return not Path(base_model).expanduser().is_dir()
    return not isinstance(job, dict) or job.get("base_model") != LOCAL_MODEL


def payload_files() -> list[Any]:
    """The trainer payload's files, as the package resources that are uploaded to ``payload/``."""
    package = resources.files("trainer_payload")
    return sorted((p for p in package.iterdir() if p.name.endswith((".py", ".txt"))), key=lambda p: p.name)
