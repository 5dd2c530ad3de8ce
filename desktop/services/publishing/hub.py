"""Publish an adapter (and what was exported from it) to a Hugging Face Hub repo, private unless asked otherwise.

The upload runs in a child process (:mod:`desktop.services.publishing.upload_job`) with the local tools' Python:
Cancel kills it, and a rerun sends only what the Hub does not have yet. The token comes from the secret store (or
``HF_TOKEN``) and reaches the child over its stdin, never its command line or environment. The child uses the Git
LFS protocol (``HF_HUB_DISABLE_XET``): that is what this app's tests can stand in for, and the Hub accepts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desktop.core.redaction import redact
from desktop.services.evaluation.report import loss_svg
from desktop.services.evaluation.run_facts import RunFacts
from desktop.services.local.common import LocalInputError, LocalToolError, Progress, no_progress
from desktop.services.local.inventory import COMPARE_FOLDER, exports_folder
from desktop.services.local.toolenv import job_file, local_python
from desktop.services.platform.secrets import SecretName, SecretStore, without_secrets
from desktop.services.publishing import upload_job
from desktop.services.publishing.card import model_card, read_evaluation
from desktop.services.runs.outputs import AdapterSource
from desktop.services.runs.run_facts import read_run_facts
from desktop.services.runs.store import RunStore
from trainer_payload.protocol import CHECKPOINT_MARKER

#: A repo name the Hub takes: letters, digits, ``-``, ``_`` and ``.``, up to 96, optionally after ``owner/``.
_NAME = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,94}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: Files of an adapter folder that are not published: Rentune's checkpoint seal, and PEFT's stub README (the card
#: written from the run replaces it).
_LEFT_OUT = (CHECKPOINT_MARKER, "README.md")


@dataclass(frozen=True)
class PublishRequest:
    """What to publish where.

    Attributes:
        repo: ``owner/name``, or ``name`` for the token's own account.
        adapter: The adapter (and the run it came from).
        exports: Exported files and folders to add: GGUF files go under ``gguf/``, a merged folder under ``merged/``.
        private: Whether a new repo is private (an existing one keeps its visibility).
    """

    repo: str
    adapter: AdapterSource
    exports: tuple[Path, ...] = ()
    private: bool = True


@dataclass(frozen=True)
class Published:
    """Where it went: the repo's id and address, the commit, and every file the commit added."""

    repo: str
    url: str
    commit: str
    files: list[str] = field(default_factory=list)


def repo_problem(repo: str) -> str:
    """Why ``repo`` is not a repo name the Hub takes ("" when it is)."""
    if not _NAME.match(repo) or ".." in repo or "--" in repo or repo.endswith((".", "-")):
        return (
            f"{repo!r} is not a Hugging Face repo name: use owner/name or name, with letters, digits, '-', '_' "
            "and '.' (no '--' or '..', at most 96 characters)"
        )
    return ""


def planned_files(request: PublishRequest) -> list[tuple[Path, str]]:
    """Each local file and its path in the repo: the adapter at the top, then the exports.

    Raises:
        LocalInputError: The adapter folder or an export is missing.
    """
    if not (request.adapter.adapter / "adapter_config.json").is_file():
        raise LocalInputError(f"{request.adapter.adapter} holds no adapter (adapter_config.json): nothing to publish")
    adapter = request.adapter.adapter
    files = [(path, path.name) for path in sorted(adapter.iterdir()) if path.is_file() and path.name not in _LEFT_OUT]
    for export in request.exports:
        if export.is_file() and export.suffix == ".gguf":
            files.append((export, f"gguf/{export.name}"))
        elif export.is_dir():
            files += [(path, f"merged/{path.relative_to(export).as_posix()}") for path in _files(export)]
        else:
            raise LocalInputError(
                f"{export} is not a GGUF file or an exported folder: export it again, or leave it out"
            )
    return files


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and path.name != CHECKPOINT_MARKER)


def card_texts(request: PublishRequest, files: list[str], store: RunStore) -> dict[str, str]:
    """The README.md (model card) and, when the run logged losses, the loss curve it shows (``loss.svg``)."""
    source = request.adapter
    run: RunFacts | None = None
    evaluation = None
    if source.run_id is not None:
        run = read_run_facts(store, source.run_id, time.time())
        evaluation = read_evaluation(exports_folder(source.run_id) / COMPARE_FOLDER / "report.json")
    base = source.base or (run.base_model if run else "") or "an unnamed base model"
    name = request.repo.rsplit("/", 1)[-1]
    texts = {"README.md": model_card(name, base, run, evaluation, ["README.md", *files])}
    if run is not None and run.losses:
        texts["loss.svg"] = loss_svg(run)
    return texts


async def publish(
    request: PublishRequest,
    secrets: SecretStore,
    *,
    store: RunStore | None = None,
    progress: Progress = no_progress,
) -> Published:
    """Publishes ``request``: creates the repo if needed, uploads, commits; cancelling kills the upload.

    Raises:
        LocalInputError: No token, a bad repo name, or a missing file.
        LocalToolError: The Hub refused or the upload failed (the message says which and what to do).
    """
    if problem := repo_problem(request.repo):
        raise LocalInputError(problem)
    token = secrets.get(SecretName.HUGGINGFACE)
    if not token:
        raise LocalInputError(
            "no Hugging Face token: add a token with write access in Settings (or rentune keys set huggingface)"
        )
    files = await asyncio.to_thread(planned_files, request)
    texts = await asyncio.to_thread(card_texts, request, [in_repo for _, in_repo in files], store or RunStore())
    job = {
        "repo": request.repo,
        "private": request.private,
        "files": [[str(local), in_repo] for local, in_repo in files],
        "texts": texts,
        "message": f"Publish {request.adapter.run_id or request.adapter.adapter.name} from Rentune",
    }
    result = await _run_job(job, token, progress)
    return Published(result["repo"], result["url"], result["commit"], [*texts, *(path for _, path in files)])


async def _run_job(job: dict[str, Any], token: str, progress: Progress) -> dict[str, str]:
    # Publishing is an explicit request to go online, so a HF_HUB_OFFLINE the user keeps for downloads is lifted here.
    quiet = {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    quiet["HF_HUB_OFFLINE"] = "0"
    command = [str(local_python()), str(job_file(upload_job)), json.dumps(job)]
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**without_secrets(), **quiet},
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(token.encode() + b"\n")
        await process.stdin.drain()
        process.stdin.close()
        lines, result = await _read(process, progress)
        code = await process.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if code != 0 or result is None:
        raise LocalToolError(_failure(redact("\n".join(lines), [token])))
    return result


async def _read(process: asyncio.subprocess.Process, progress: Progress) -> tuple[list[str], dict[str, str] | None]:
    assert process.stdout is not None
    lines: list[str] = []
    result = None
    async for raw in process.stdout:
        line = raw.decode("utf-8", "replace").rstrip()
        if line.startswith(upload_job.PROGRESS_PREFIX):
            step = json.loads(line[len(upload_job.PROGRESS_PREFIX) :])
            progress(step["text"], step["fraction"])
        elif line.startswith(upload_job.RESULT_PREFIX):
            result = json.loads(line[len(upload_job.RESULT_PREFIX) :])
        elif line.startswith(upload_job.ERROR_PREFIX):
            error = json.loads(line[len(upload_job.ERROR_PREFIX) :])
            lines.append(f"{error['kind']}: {error['message']}")
        else:
            lines.append(line)
    return lines, result


def _failure(output: str) -> str:
    """The upload's failure as one sentence with the fix."""
    if "401" in output or "Invalid credentials" in output or "Invalid user token" in output or "Unauthorized" in output:
        return "the Hugging Face Hub refused the token: add a token with write access in Settings"
    if "403" in output:
        return "the token may not write to that repo: use your own account or an organisation you can write to"
    if "No module named 'huggingface_hub'" in output:
        return (
            "the local tools lack huggingface_hub: install the local tools on the Models page (rentune tools install)"
        )
    tail = " | ".join(line.strip() for line in output.splitlines()[-2:] if line.strip())
    return f"publishing failed: {tail[-600:] or 'no output'}; nothing was committed, publishing again resumes"
