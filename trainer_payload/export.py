"""``python -m trainer_payload export job.json out/export-job.json``: the merged model and GGUF made on the machine.

Merging a large adapter needs the base model's size in memory (about 140 GB for 70 B parameters); the rented machine
has it, a laptop may not. After training, the app asks for this export: the same checked merge as at home
(:mod:`trainer_payload.merge`: merged logits against base + adapter, nothing saved on a mismatch), then llama.cpp's
own converter (uploaded by the app, the same one it runs at home) writes each GGUF type it writes by itself
(:data:`CONVERTER_GGUF_TYPES`); K-quants (:data:`QUANTIZE_GGUF_TYPES`) are quantised from an F16 GGUF by
a small tool over llama.cpp's library (:mod:`trainer_payload.quantize_tool`), built on the machine from llama.cpp's
source (CPU only, a minute or two on a GPU machine's cores), as the app's own export quantises with the same library
function. Every file is hashed; one ``exported`` event names them (or
says why it failed), so the app pulls them verified before the machine is terminated. ``export`` events say what is
being done.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainer_payload.checkpoints import sha256_file
from trainer_payload.compare import compare_rows
from trainer_payload.dataset import load_messages
from trainer_payload.merge import merge
from trainer_payload.protocol import (
    CONVERTER_GGUF_TYPES,
    EVENTS_FILE_NAME,
    EXPORT_DIR_NAME,
    JUDGE_FILE_NAME,
    ON_MACHINE_GGUF_TYPES,
    QUANTIZE_GGUF_TYPES,
    EventKind,
    EventWriter,
    JobSpec,
    check_relative_path,
)
from trainer_payload.quantize_tool import TOOL_NAME, build_steps, write_project

#: A float32 merge needs twice a 16-bit model's bytes; above this share of the machine's memory, merge in 16 bits.
FLOAT32_MEMORY_SHARE = 0.5


class ExportJobError(ValueError):
    """The export job asks for something this payload cannot make; the message says what."""


def read_export_job(path: Path) -> dict[str, Any]:
    """The export job: ``adapter`` (relative to ``out/``), ``merged`` (bool), ``gguf`` (types), ``converters``.

    ``judge`` (``max_examples``, ``max_new_tokens``) asks for base against tuned on the job's held-out rows first.

    Raises:
        ExportJobError: A field is missing, of the wrong type, or names a GGUF type the converter cannot write.
    """
    job = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(job, dict) or not isinstance(job.get("adapter"), str):
        raise ExportJobError("the export job must name the adapter folder")
    check_relative_path(job["adapter"])
    types = job.get("gguf") or []
    if not isinstance(types, list) or any(t not in ON_MACHINE_GGUF_TYPES for t in types):
        raise ExportJobError(f"GGUF types on the machine are {', '.join(ON_MACHINE_GGUF_TYPES)}, not {types!r}")
    if types and not isinstance(job.get("converters"), str):
        raise ExportJobError("a GGUF export needs the folder of llama.cpp's converters")
    if set(types) & set(QUANTIZE_GGUF_TYPES) and not isinstance(job.get("build_sources"), str):
        raise ExportJobError("a K-quant GGUF export needs the folder of llama.cpp's source to build its quantise tool")
    judge = job.get("judge")
    if judge is not None and not (
        isinstance(judge, dict) and all(_whole(judge.get(key), 1, 10_000) for key in ("max_examples", "max_new_tokens"))
    ):
        raise ExportJobError("judge needs max_examples and max_new_tokens, whole numbers from 1 to 10000")
    return job


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def base_folder(base_model: str) -> Path:
    """The base model's files: its folder, or the Hub download the bootstrap made (no network is used)."""
    if Path(base_model).is_dir():
        return Path(base_model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(base_model, local_files_only=True))


def _stored_dtype(base: Path) -> str:
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def _merge_in_half(base: Path, stored: str) -> bool:
    """Whether to merge in the stored 16-bit type: a float32 copy would crowd the machine's memory."""
    if stored not in ("float16", "bfloat16"):
        return False
    weights = sum(file.stat().st_size for file in base.glob("*.safetensors"))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return True
    return weights * 2 > memory * FLOAT32_MEMORY_SHARE


class MachineExport:
    """One export on the machine, from the trained adapter to hashed files under ``out/export`` (or ``folder``)."""

    def __init__(self, spec: JobSpec, job: dict[str, Any], events: EventWriter, folder: str = EXPORT_DIR_NAME) -> None:
        self.out = Path(spec.output_dir)
        self.base_model, self.job, self.events = spec.base_model, job, events
        self.eval_file = spec.eval_file
        self.folder = self.out / folder
        self.scratch = self.folder / ".work"
        self.outputs: dict[str, str] = {}

    def say(self, fraction: float, phase: str) -> None:
        """Reports what is being done."""
        self.events.emit(EventKind.EXPORT, phase=phase, fraction=round(fraction, 3))

    def execute(self) -> dict[str, Any]:
        """Merges, converts and hashes; returns the ``exported`` event's fields.

        A GGUF that cannot be made (no compiler for the quantise tool, say) is a note: the other outputs still come.

        Raises:
            RuntimeError: The merge failed or did not match base + adapter (then nothing is sent).
        """
        shutil.rmtree(self.folder, ignore_errors=True)  # a half-made export of an earlier try is never sent
        self.folder.mkdir(parents=True)
        notes = self._judge()
        check = None
        if self.job.get("merged") or self.job.get("gguf"):
            merged = self.folder / "merged" if self.job.get("merged") else self.scratch / "merged"
            check = self._merge(merged)
            if self.job.get("merged"):
                self.outputs["merged"] = f"{EXPORT_DIR_NAME}/merged"
            notes += self._ggufs(merged, list(self.job.get("gguf") or []))
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.say(0.95, "hashing the files for the download")
        return {"files": self._hashes(), "outputs": self.outputs, "merge_check": check, "notes": notes}

    def _judge(self) -> list[str]:
        """Base against tuned on the held-out rows (``judge``) into ``judge.json``; a failure is a note, not an end."""
        asked = self.job.get("judge")
        if not asked:
            return []
        if not self.eval_file:
            return ["judging was asked for, and the run has no held-out rows on the machine: judge it at home"]
        try:
            rows = list(enumerate(load_messages(Path(self.eval_file)), start=1))
            counted = {"usable_rows": len(rows)}
            result = compare_rows(
                base_folder(self.base_model),
                self.out / self.job["adapter"],
                [(line, row["messages"]) for line, row in rows[: asked["max_examples"]]],
                asked["max_new_tokens"],
                self._judge_progress,
            )
        except Exception as exc:  # noqa: BLE001 - the export's other outputs still come; the reason is said
            return [f"judging on the machine failed ({type(exc).__name__}: {str(exc)[:300]}): judge it at home"]
        target = self.folder / JUDGE_FILE_NAME
        target.write_text(json.dumps(counted | result), encoding="utf-8")
        self.outputs["judge"] = target.relative_to(self.out).as_posix()
        return []

    def _judge_progress(self, fraction: float | None, text: str) -> None:
        self.say(0.0 if fraction is None else fraction * 0.2, f"judging: {text}")

    def _merge(self, merged: Path) -> dict[str, Any]:
        """The checked merge into ``merged``; returns its logit check.

        Raises:
            RuntimeError: The merged model does not match base + adapter.
        """
        base = base_folder(self.base_model)
        stored = _stored_dtype(base)
        job = {"base": str(base), "adapter": str(self.out / self.job["adapter"]), "out": str(merged)}
        result = merge(job | {"stored_dtype": stored, "half": _merge_in_half(base, stored)}, self._merge_progress)
        check: dict[str, Any] = result["check"]
        if not check["ok"]:
            raise RuntimeError(
                f"the merged model does not match base + adapter (largest logit difference "
                f"{check['max_difference']:.3g}, allowed {check['tolerance']:.3g}); nothing was written"
            )
        return check

    def _ggufs(self, merged: Path, types: list[str]) -> list[str]:
        """Writes each GGUF type asked for; returns what could not be made, and why."""
        notes = []
        for qtype in [t for t in types if t in CONVERTER_GGUF_TYPES] + [t for t in types if t in QUANTIZE_GGUF_TYPES]:
            try:
                if qtype in CONVERTER_GGUF_TYPES:
                    self.outputs[f"gguf:{qtype}"] = self._convert(merged, qtype, self.folder)
                else:
                    f16 = self.outputs.get("gguf:F16") or self._f16(merged)
                    self.outputs[f"gguf:{qtype}"] = self._quantize(self.out / f16, qtype)
            except (RuntimeError, OSError) as exc:
                notes.append(f"GGUF {qtype} could not be made on the machine: {exc}")
        return notes

    def _f16(self, merged: Path) -> str:
        """The F16 GGUF the K-quants are quantised from (made once, in the scratch folder)."""
        made = self.scratch / "model-F16.gguf"
        return made.relative_to(self.out).as_posix() if made.is_file() else self._convert(merged, "F16", self.scratch)

    def _merge_progress(self, fraction: float, text: str) -> None:
        self.say(fraction * 0.6, f"merging: {text}")

    def _convert(self, merged: Path, qtype: str, folder: Path) -> str:
        """Writes ``model-QTYPE.gguf`` into ``folder`` with llama.cpp's converter; returns its path under ``out/``."""
        self.say(0.65, f"converting to GGUF {qtype}")
        converters = Path(self.job["converters"]).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"model-{qtype}.gguf"
        partial = target.with_name(target.name + ".partial")
        command = [
            sys.executable,
            str(converters / "convert_hf_to_gguf.py"),
            str(merged),
            "--outfile",
            str(partial),
            "--outtype",
            qtype.lower(),
        ]
        env = os.environ | {"PYTHONPATH": str(converters / "gguf-py"), "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])[-600:]
            raise RuntimeError(f"llama.cpp's converter failed for GGUF {qtype}: {tail or 'no output'}")
        partial.replace(target)
        return target.relative_to(self.out).as_posix()

    def _quantize(self, f16: Path, qtype: str) -> str:
        """Writes ``model-QTYPE.gguf`` from the F16 GGUF with the quantise tool; returns its path under ``out/``."""
        tool = self._quantize_tool()
        self.say(0.85, f"quantising to GGUF {qtype}")
        target = self.folder / f"model-{qtype}.gguf"
        partial = target.with_name(target.name + ".partial")
        done = subprocess.run([str(tool), str(f16), str(partial), qtype], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-600:]
            raise RuntimeError(f"quantising to GGUF {qtype} failed: {tail or 'no output'}")
        partial.replace(target)
        return target.relative_to(self.out).as_posix()

    def _quantize_tool(self) -> Path:
        """The quantise tool (:mod:`trainer_payload.quantize_tool`), built once per run folder from the uploaded source.

        Raises:
            RuntimeError: The machine has no cmake or C compiler, or the build failed (its last lines are said).
        """
        sources = Path(self.job["build_sources"]).resolve()
        project = sources.parent / f"{sources.name}-quantize"
        build = sources.parent / f"{sources.name}-build"
        tool = build / TOOL_NAME
        if tool.is_file():
            return tool
        if not (shutil.which("cmake") and (shutil.which("c++") or shutil.which("g++"))):
            raise RuntimeError(
                "this machine has no cmake or C++ compiler to build llama.cpp's quantise tool for K-quants; ask for "
                "gguf:Q8_0 on the machine (the converter writes it alone), or make Q4_K_M at home"
            )
        self.say(0.75, "building llama.cpp's quantise tool (CPU only)")
        write_project(sources, project)
        for step in build_steps(project, build, os.cpu_count() or 2):
            done = subprocess.run(step, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-600:]
                raise RuntimeError(f"building llama.cpp's quantise tool failed: {tail or 'no output'}")
        return tool

    def _hashes(self) -> dict[str, str]:
        """The sha256 of every file of the outputs, by its path relative to ``out/``."""
        files = sorted(p for p in self.folder.rglob("*") if p.is_file() and self.scratch not in p.parents)
        return {str(p.relative_to(self.out).as_posix()): sha256_file(p) for p in files}


def run_export(job_path: Path, export_path: Path) -> int:
    """Runs the export of the trained job ``job_path``; reports through its ``events.jsonl``; returns the exit code."""
    spec = JobSpec.load(job_path)
    events = EventWriter(Path(spec.output_dir) / EVENTS_FILE_NAME)
    try:
        job = read_export_job(export_path)
        fields = MachineExport(spec, job, events).execute()
    except Exception as exc:  # noqa: BLE001 - every failure must become the exported event, never a silent crash
        events.emit(EventKind.EXPORTED, files={}, error=f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    events.emit(EventKind.EXPORTED, **fields)
    return 0
