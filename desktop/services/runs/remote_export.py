"""Export on the machine: after training, the rented machine makes the merged model and GGUF files, and they come home.

A model whose merge does not fit this computer (a 70 B merge needs about 140 GB of memory) is merged where the memory
is: ``[export] on_machine`` asks for it. Once the adapter is safe at home, llama.cpp's converters (the same cached
copy the local export runs) are uploaded, ``python -m trainer_payload export`` runs detached (a dropped connection
does not stop it), its ``export`` events say what it does, and its ``exported`` event names every file with its
SHA-256. Each comes home verified into the run's export folder (where the Models page finds it); only then does the
run finish and a rented machine go. A failed export never fails the run: the adapter is home, and the reason is said.
The same job judges base against tuned on the held-out rows first when ``[judge] on_machine`` asks (its answers are
scored at home: :mod:`desktop.services.runs.machine_judgement`), with or without an export.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

from desktop.core.runs.spec import RunSpec
from desktop.services.local.common import LocalToolError, Progress, no_progress
from desktop.services.local.inventory import exports_folder
from desktop.services.machines.machine import Machine
from desktop.services.runs.checkpoints import inside
from desktop.services.runs.context import RunContext
from desktop.services.runs.errors import RunError
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.machine_judgement import score_machine_answers
from desktop.services.runs.monitor import read_events
from trainer_payload.protocol import (
    ADAPTER_DIR_NAME,
    EXPORT_DIR_NAME,
    EXPORT_JOB_FILE_NAME,
    JOB_FILE_NAME,
    QUANTIZE_GGUF_TYPES,
    VENV_PYTHON,
    Event,
    EventKind,
)

#: Where the converters, and the source the quantise tool is built from, go on the machine (under the run's folder).
REMOTE_CONVERTERS = "tools/llama.cpp"
REMOTE_BUILD_SOURCES = "tools/llama.cpp-src"
#: The export's pid and output on the machine, relative to the run's folder.
EXPORT_PID_FILE = "out/export.pid"
EXPORT_LOG = "out/export.log"
#: The hidden folder the outputs are pulled into before they take their places (the Models page skips it).
PARTIAL_FOLDER = ".from-machine"
#: The most notes of the machine's that are kept (one per output could not be made: a handful).
MAX_NOTES = 10


class ExportOnMachineError(RuntimeError):
    """The export on the machine failed; the message says why (the adapter is home either way)."""


async def check_before_renting(spec: RunSpec, progress: Progress = no_progress) -> None:
    """Refuses, before anything is rented, an on-machine GGUF that llama.cpp's converter would refuse.

    The converter runs here on the base's config and tokenizer alone (``--vocab-only``: seconds, a Hub model's small
    files only), as the local export checks before its download: the paid machine never finds out after training.

    Raises:
        RunError: The converter refuses the base; the message says why and what still works.
    """
    if not any(item.startswith("gguf:") for item in spec.export_on_machine):
        return
    from desktop.services.local.base_model import base_description
    from desktop.services.local.gguf import check_vocabulary

    try:
        await check_vocabulary(await base_description(spec.base_model, progress), progress)
    except LocalToolError as exc:
        raise RunError(
            f"[export] on_machine asks for a GGUF, and {exc}. Nothing was rented: remove the gguf outputs from "
            "[export] on_machine (the merged model can still be made there), or choose another base model"
        ) from exc


async def export_on_machine(ctx: RunContext, run_id: str, machine: Machine) -> Path | None:
    """Makes the outputs the run's ``[export] on_machine`` asks for on its machine and brings them home, verified.

    Returns:
        The run's export folder, or None when nothing was asked for or the export failed (said, and stored as the
        run's ``export_error``).

    Raises:
        RemoteError: The connection was lost (the engine reconnects; a running export is followed, not restarted).
    """
    spec = ctx.store.get(run_id).spec
    asked = [str(item) for item in spec.get("export_on_machine") or []]
    judge = spec.get("judge_on_machine")
    if not asked and not judge:
        return None
    try:
        ended = await _ended_export(ctx, run_id) or await _run_export(ctx, run_id, machine, asked, judge)
        if ended.get("error"):
            raise ExportOnMachineError(str(ended["error"]))
        folder = await _pull_outputs(ctx, run_id, machine, ended)
    except ExportOnMachineError as exc:
        what, fix = ("the export", "export it") if asked else ("judging", "compare it with its base")
        ctx.report(f"{what} on the machine failed: {exc}; the adapter is home, {fix} on the Models page")
        ctx.set_spec(run_id, export_error=str(exc))
        return None
    await score_machine_answers(ctx, run_id, folder)
    await _arrived(ctx, run_id, machine, ended, folder)
    return folder


async def _arrived(ctx: RunContext, run_id: str, machine: Machine, ended: dict[str, Any], folder: Path) -> None:
    """Says and records what came home (and what could not be made), then frees the machine's disk of it."""
    outputs = {name: path for name, path in dict(ended.get("outputs") or {}).items() if name != "judge"}
    said = [str(note)[:500] for note in (ended.get("notes") or [])[:MAX_NOTES]]  # the machine's words, bounded
    notes = said + await _fallbacks(folder, outputs)
    ctx.set_spec(run_id, exported_on_machine=outputs, export_notes=notes, export_error=None)
    if outputs:
        ctx.report(f"made on the machine and verified at home: {', '.join(outputs)} in {folder}")
    for note in notes:
        ctx.report(note)
    remote = shlex.quote(str(ctx.store.get(run_id).remote_dir))
    # Home and verified: an own server's disk gets back the outputs' room (a 70 B merge is 140 GB), and the tools'.
    await machine.run(f"rm -rf {remote}/out/{EXPORT_DIR_NAME} {remote}/tools", check=False)


async def _fallbacks(folder: Path, outputs: dict[str, str]) -> list[str]:
    """The tensors each quantised GGUF wrote in another type than asked (read at home, as the local export says it)."""
    from desktop.services.local.gguf import QUANT_TYPES, fallbacks_of

    notes = []
    for output, path in outputs.items():
        qtype = output.removeprefix("gguf:")
        if output.startswith("gguf:") and qtype in QUANT_TYPES and qtype != "F16":
            try:
                notes += [f"{qtype}: {line}" for line in await fallbacks_of(folder / Path(path).name, qtype)]
            except LocalToolError as exc:
                notes.append(f"{qtype}: its tensor types could not be read ({exc})")
    return notes


def _after_done(events: list[Event]) -> list[Event]:
    """The events after the trainer's ``done``: the export's."""
    done = max((i for i, e in enumerate(events) if e["event"] is EventKind.DONE), default=None)
    return events[done + 1 :] if done is not None else []


async def _ended_export(ctx: RunContext, run_id: str) -> dict[str, Any] | None:
    """The ``exported`` event already mirrored (the app was closed while the export ran), if any."""
    events = await asyncio.to_thread(mirrored_events, ctx.folder(run_id))
    ended = next((e for e in _after_done(events) if e["event"] is EventKind.EXPORTED), None)
    return dict(ended) if ended is not None else None


async def _run_export(
    ctx: RunContext, run_id: str, machine: Machine, asked: list[str], judge: dict[str, Any] | None
) -> dict[str, Any]:
    """Starts the export on the machine (unless it runs, or ended, already) and follows it to its ``exported`` event."""
    remote = shlex.quote(str(ctx.store.get(run_id).remote_dir))
    running = await _running_export(machine, remote)  # asked before the events: its last words are read next
    ended = _exported(ctx, await read_events(ctx, run_id, machine) or [])
    if ended is not None:
        return ended
    if running is None:
        await _start_export(ctx, run_id, machine, asked, judge)
    while True:
        await asyncio.sleep(ctx.options.poll_seconds)
        running = await _running_export(machine, remote)
        ended = _exported(ctx, await read_events(ctx, run_id, machine) or [])
        if ended is not None:
            return ended
        if running is None:
            log = await machine.run(f"tail -n 5 {remote}/{EXPORT_LOG} 2>/dev/null; true")
            tail = " | ".join(line.strip() for line in log.splitlines() if line.strip())[-600:]
            raise ExportOnMachineError(f"the export ended without a result ({tail or 'no output'})")


def _exported(ctx: RunContext, events: list[Event]) -> dict[str, Any] | None:
    """Says the export's progress; returns its ``exported`` event when it is among ``events``."""
    for event in events:
        if event["event"] is EventKind.EXPORT:
            ctx.report(f"on the machine: {event['phase']}")
        elif event["event"] is EventKind.EXPORTED:
            return dict(event)
    return None


async def _running_export(machine: Machine, remote: str) -> int | None:
    """The pid of the export running in the run's folder, or None."""
    command = (
        f"cd {remote} 2>/dev/null || exit 0; pid=$(cat {EXPORT_PID_FILE} 2>/dev/null); "
        'case $pid in ""|*[!0-9]*) exit 0 ;; esac; '
        '[ -d "/proc/$pid" ] && ! grep -q "^State:[[:space:]]*Z" "/proc/$pid/status" 2>/dev/null && echo "$pid"; true'
    )
    output = (await machine.run(command)).strip()
    return int(output) if output.isdigit() else None


async def _start_export(
    ctx: RunContext, run_id: str, machine: Machine, asked: list[str], judge: dict[str, Any] | None
) -> None:
    """Uploads the converters when GGUF is asked for and the export job, then starts the export detached."""
    record = ctx.store.get(run_id)
    remote = str(record.remote_dir)
    gguf = [item.removeprefix("gguf:") for item in asked if item.startswith("gguf:")]
    job: dict[str, Any] = {"adapter": ADAPTER_DIR_NAME, "merged": "merged" in asked, "gguf": gguf}
    if judge:
        job["judge"] = {key: int(judge[key]) for key in ("max_examples", "max_new_tokens")}
    if gguf:
        job["converters"] = f"{remote}/{REMOTE_CONVERTERS}"
        await upload_llama_cpp(ctx, run_id, machine, remote, quantize=bool(set(gguf) & set(QUANTIZE_GGUF_TYPES)))
        if set(gguf) & set(QUANTIZE_GGUF_TYPES):
            job["build_sources"] = f"{remote}/{REMOTE_BUILD_SOURCES}"
    await machine.run(f"cat > {shlex.quote(f'{remote}/out/{EXPORT_JOB_FILE_NAME}')}", stdin=json.dumps(job))
    start = (
        f"cd {shlex.quote(remote)} || exit 1; PYTHONPATH=payload setsid nohup {VENV_PYTHON} -m trainer_payload export "
        f"{JOB_FILE_NAME} out/{EXPORT_JOB_FILE_NAME} > {EXPORT_LOG} 2>&1 < /dev/null & "
        f'echo "$!" > {EXPORT_PID_FILE}; echo "$!"'
    )
    output = (await machine.run(start)).strip().splitlines()
    work = ", ".join([*(["judging base against tuned"] if judge else []), *asked])
    ctx.report(f"working on the machine after training (pid {output[-1] if output else '?'}): {work}")


async def upload_llama_cpp(ctx: RunContext, run_id: str, machine: Machine, remote: str, *, quantize: bool) -> None:
    """Sends llama.cpp's converters (the copy the local export runs) to the machine, and its source for K-quants."""
    from desktop.services.local.llama_cpp_source import llama_cpp_build_sources, llama_cpp_converters
    from desktop.services.runs.transfer import send_files

    def say(text: str, _fraction: float | None) -> None:
        ctx.report(text)

    folders = [((await llama_cpp_converters(say)).root, REMOTE_CONVERTERS)]
    if quantize:
        folders.append((await llama_cpp_build_sources(say), REMOTE_BUILD_SOURCES))
    files = await asyncio.to_thread(_files_of, folders)
    await send_files(ctx, run_id, machine, remote, files)


def _files_of(folders: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """(local file, remote path) of every file in the folders, each under its remote name."""
    return [
        (path, f"{remote}/{path.relative_to(root).as_posix()}")
        for root, remote in folders
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]


async def _pull_outputs(ctx: RunContext, run_id: str, machine: Machine, ended: dict[str, Any]) -> Path:
    """Downloads every file the ``exported`` event names, verified, then moves each output into the export folder.

    Raises:
        ExportOnMachineError: The event names no file, or an output outside the files it hashed.
    """
    files: dict[str, str] = dict(ended.get("files") or {})
    outputs: dict[str, str] = dict(ended.get("outputs") or {})
    if not files or not outputs:
        why = "; ".join(str(note)[:500] for note in (ended.get("notes") or [])[:MAX_NOTES])
        raise ExportOnMachineError(why or "the machine reported no exported files")
    record = ctx.store.get(run_id)
    folder = exports_folder(run_id)
    partial = inside(folder, PARTIAL_FOLDER)
    items = [(f"{record.remote_dir}/out/{name}", inside(partial, name), digest) for name, digest in files.items()]
    await machine.download_many(items, ctx.progress("download", run_id))
    await asyncio.to_thread(_move_into_place, partial, folder, outputs, list(files))
    return folder


def _move_into_place(partial: Path, folder: Path, outputs: dict[str, str], files: list[str]) -> None:
    """Each output (a folder or a file under ``partial``) replaces the one of that name in ``folder``."""
    for name in outputs.values():
        if not any(f == name or f.startswith(f"{name}/") for f in files):
            raise ExportOnMachineError(f"the machine named an output it did not send: {name!r}")
        source, target = inside(partial, name), inside(folder, Path(name).name)
        if target.is_dir():
            shutil.rmtree(target)
        source.replace(target)
    shutil.rmtree(partial, ignore_errors=True)
