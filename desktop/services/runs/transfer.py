"""Sending a run to its machine: what travels, and the upload itself.

What travels: the payload, the data, a model folder from this computer, the job, and a checkpoint to resume from.
The machine's work folder is checked first (writable, room enough), so a full disk fails early in its own words.
Small files travel together as one archive (one verified transfer and one unpack instead of a transfer and a remote
hash per file: a few seconds of paid time per upload on a distant machine); large ones travel one by one, each
verified and resumable.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tarfile
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from desktop.core.runs.states import RunState
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.machine import Machine, Progress
from desktop.services.runs.bucket_checkpoints import fetch_newest_checkpoint
from desktop.services.runs.bucket_data import BUCKET_KEY, send_data_through_bucket
from desktop.services.runs.checkpoints import newest_local_checkpoint
from desktop.services.runs.cluster import checkpoints_from, node_job_keys
from desktop.services.runs.context import RunContext
from trainer_payload.protocol import EVENTS_FILE_NAME, JOB_FILE_NAME

#: What the job names a model folder uploaded from this computer.
LOCAL_MODEL = "model"
#: In the run's local folder: how far the latest upload got, for whoever shows the run (any process).
UPLOAD_PROGRESS_NAME = "upload.json"
#: Seconds between two writes of the upload's progress.
PROGRESS_EVERY_S = 1.0
#: Files up to this size travel in the upload's archive; larger ones on their own (resumable).
SMALL_FILE_BYTES = 1 << 20
#: The archive of the small files: written in the run's local folder, unpacked and deleted in the remote one.
UPLOAD_ARCHIVE_NAME = "upload.tar"


@dataclass(frozen=True)
class UploadProgress:
    """How far an upload got: bytes and files sent (or found already there and verified) out of all.

    Attributes:
        bytes_done: Bytes sent or verified so far.
        bytes_total: Bytes of every file of the upload.
        files_done: Files complete on the machine.
        files_total: Files of the upload.
        ts: When this was measured (epoch seconds).
    """

    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    ts: float

    @property
    def fraction(self) -> float:
        """The part done, from 0 to 1 (1 for an empty upload)."""
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total > 0 else 1.0


class UploadMeter:
    """Adds an upload's files up into one measure, written to the run folder about once a second.

    Its :meth:`on_file` is the per-file progress callback (and passes each call on to ``report``); call
    :meth:`file_done` after each file.
    """

    def __init__(self, path: Path, files: list[int], report: Progress | None = None) -> None:
        self.path, self._report = path, report
        self._sizes, self._before, self._current, self._files = files, 0, 0, 0
        self._written = 0.0
        self._write(force=True)

    def on_file(self, name: str, done: int, total: int) -> None:
        """The progress of the file being sent."""
        self._current = done
        if self._report is not None:
            self._report(name, done, total)
        self._write()

    def file_done(self) -> None:
        """The file being sent is complete on the machine (sent now, or found there already)."""
        self._before += self._sizes[self._files]
        self._files, self._current = self._files + 1, 0
        self._write(force=self._files == len(self._sizes))

    def progress(self) -> UploadProgress:
        """The measure now."""
        total = sum(self._sizes)
        done = min(total, self._before + self._current)
        return UploadProgress(done, total, self._files, len(self._sizes), time.time())

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < PROGRESS_EVERY_S:
            return
        self._written = now
        partial = self.path.with_suffix(".partial")
        try:
            partial.write_text(json.dumps(asdict(self.progress())), encoding="utf-8")
            partial.replace(self.path)  # readers see the old measure or the new one, never half of one
        except OSError:
            return  # the measure is for show: a full or read-only disk must not stop the upload


def read_upload_progress(folder: Path) -> UploadProgress | None:
    """How far the run's latest upload got (None when it never uploaded or the measure cannot be read)."""
    try:
        data = json.loads((folder / UPLOAD_PROGRESS_NAME).read_text(encoding="utf-8"))
        return UploadProgress(**{key: data[key] for key in UploadProgress.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remote_data_name(source: Path, role: str) -> str:
    """Where a data file goes in the run's folder: ``data/train.jsonl``, or ``data/train.txt`` for raw text.

    The trainer reads a ``.txt`` file as one document, a ``.jsonl`` file row by row.
    """
    return f"data/{role}{'.txt' if source.suffix.lower() == '.txt' else '.jsonl'}"


async def upload(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Uploads everything the run needs to its remote folder and writes the job file (moves the run to uploading).

    Raises:
        RemoteError: The work folder cannot be made or written.
        PermanentError: The machine's disk is too small for the upload.
    """
    record = ctx.store.transition(run_id, RunState.UPLOADING)
    remote, spec, local = str(record.remote_dir), record.spec, ctx.folder(run_id)
    files: list[tuple[Path, str]] = [(Path(str(p)), f"payload/trainer_payload/{p.name}") for p in payload_files()]
    train_name = remote_data_name(Path(spec["train_file"]), "train")
    eval_name = remote_data_name(Path(spec["eval_file"]), "eval") if spec.get("eval_file") else None
    data = [(Path(spec["train_file"]), train_name)]
    if eval_name:
        data.append((Path(spec["eval_file"]), eval_name))
    files += data
    model_files = local_model_files(spec["base_model"])
    files += model_files
    job = {
        "base_model": LOCAL_MODEL if model_files else spec["base_model"],
        "train_file": train_name,
        "eval_file": eval_name,
        "output_dir": "out",
        **spec["training"],
        "run_name": run_id,  # the trackers' name for the run (a resume elsewhere continues the same one)
        **node_job_keys(spec),
    }
    (local / JOB_FILE_NAME).write_text(json.dumps(job, indent=2), encoding="utf-8")
    files.append((local / JOB_FILE_NAME, JOB_FILE_NAME))
    files += resume_files(ctx, run_id)
    sizes = [path.stat().st_size for path, _ in files]
    small_bytes = sum(size for size in sizes if size <= SMALL_FILE_BYTES)  # twice, while the archive unpacks
    if node_job_keys(spec):
        await clear_checkpoints(machine, remote)
    await check_workdir(machine, remote, sum(sizes) + small_bytes)
    if spec.get(BUCKET_KEY):  # the payload first: the machine reads the data from the bucket with it
        rest = [item for item in files if item not in data]
        await send_files(ctx, run_id, machine, remote, rest)
        over_ssh = await send_data_through_bucket(ctx, run_id, machine, remote, data)
        if over_ssh:
            await send_files(ctx, run_id, machine, remote, over_ssh)
        files = rest + over_ssh
        await fetch_newest_checkpoint(ctx, run_id, machine, remote, home_step(ctx, run_id))
    else:
        await send_files(ctx, run_id, machine, remote, files)
    ctx.report(f"uploaded {len(files)} files to {record.target}")


async def clear_checkpoints(machine: Machine, remote: str) -> None:
    """Deletes a machine's checkpoints, before the newest one at home is sent: on a run across several machines.

    Each machine resumes from the newest complete checkpoint on its own disk. One that holds a newer one than the
    others (sealed there before another machine was lost), or only its own part of a sharded one, would start its
    ranks at another step than the rest, or fail to load it: with the home's alone, every machine starts from it.
    """
    await machine.run(f"rm -rf {shlex.quote(f'{remote}/out/checkpoints')}")


async def align_checkpoints(ctx: RunContext, run_id: str, machine: Machine) -> None:
    """Puts the newest checkpoint at home, and no other, on one machine of a run across several (a relaunch)."""
    remote = str(ctx.store.get(run_id).remote_dir)
    await clear_checkpoints(machine, remote)
    files = home_checkpoint_files(ctx, run_id)
    if files:
        await send_files(ctx, run_id, machine, remote, files)


async def send_files(
    ctx: RunContext, run_id: str, machine: Machine, remote: str, files: list[tuple[Path, str]]
) -> None:
    """Sends (local path, path in ``remote``) pairs: the small ones as one archive, unpacked there."""
    local = ctx.folder(run_id)
    small: list[tuple[Path, str]] = []
    items: list[tuple[Path, str]] = []  # what travels on its own: the archive first, then the large files
    for item in files:
        (small if item[0].stat().st_size <= SMALL_FILE_BYTES else items).append(item)
    archive = local / UPLOAD_ARCHIVE_NAME
    if small:
        await asyncio.to_thread(write_archive, archive, small)
        items.insert(0, (archive, UPLOAD_ARCHIVE_NAME))
    sizes = [path.stat().st_size for path, _ in items]
    meter = UploadMeter(local / UPLOAD_PROGRESS_NAME, sizes, ctx.progress("upload", run_id))
    for path, relative in items:
        await machine.upload(path, f"{remote}/{relative}", meter.on_file)
        if path == archive:
            await unpack_archive(machine, remote)
        meter.file_done()
        ctx.made_progress(run_id)
    archive.unlink(missing_ok=True)


def write_archive(archive: Path, files: list[tuple[Path, str]]) -> None:
    """Writes the files into one tar under their remote relative paths, the same bytes for the same files.

    Fixed times, owners and modes make it reproducible, so an upload cut short continues the copy already there.
    """
    partial = archive.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, relative in files:
            info = tarfile.TarInfo(relative)
            info.size, info.mode, info.mtime = path.stat().st_size, 0o644, 0
            with path.open("rb") as data:
                tar.addfile(info, data)
    partial.replace(archive)


async def unpack_archive(machine: Machine, remote: str) -> None:
    """Unpacks the verified archive in the remote folder (tar, which every Linux image has) and deletes it.

    Raises:
        RemoteError: tar failed (its words).
    """
    folder = shlex.quote(remote)
    await machine.run(f"cd {folder} && tar -xf {UPLOAD_ARCHIVE_NAME} && rm -f {UPLOAD_ARCHIVE_NAME}")


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
    """On a new machine: the newest local checkpoint and the event history, so the payload resumes.

    Every machine of a run across several gets the head's newest checkpoint (each rank reads its own disk); the
    events are the head's alone.
    """
    local = ctx.folder(run_id)
    files = home_checkpoint_files(ctx, run_id)
    if (local / EVENTS_FILE_NAME).exists():
        files.append((local / EVENTS_FILE_NAME, f"out/{EVENTS_FILE_NAME}"))
    return files


def home_step(ctx: RunContext, run_id: str) -> int | None:
    """The step of the newest complete checkpoint at home (None without one)."""
    newest = newest_local_checkpoint(ctx.folder(checkpoints_from(ctx.store.get(run_id))) / "checkpoints")
    return int(newest.name.split("-")[1]) if newest is not None else None


def home_checkpoint_files(ctx: RunContext, run_id: str) -> list[tuple[Path, str]]:
    """The newest complete checkpoint at home (the head's, on every machine of a run), as files to send."""
    newest = newest_local_checkpoint(ctx.folder(checkpoints_from(ctx.store.get(run_id))) / "checkpoints")
    if newest is None:
        return []
    ctx.report(f"resuming from local {newest.name}")
    return [
        (p, f"out/checkpoints/{newest.name}/{p.relative_to(newest)}") for p in sorted(newest.rglob("*")) if p.is_file()
    ]


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
