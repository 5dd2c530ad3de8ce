"""Cancelling the vocabulary check while it copies the model's description ends as a cancellation, nothing else."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path

import pytest

from desktop.services.local import gguf
from desktop.services.local.common import no_progress


def test_a_cancelled_check_lets_the_copy_end_and_leaves_no_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    copying = threading.Event()

    def slow_copy(model_dir: Path, target: Path) -> Path:
        target.mkdir()
        copying.set()
        end, index = time.monotonic() + 0.5, 0
        while time.monotonic() < end:  # still writing, fast, when the cancellation comes and after it
            (target / f"file-{index}.json").write_text("{}")
            index += 1
        return target

    async def converters(_progress: object) -> object:
        return object()

    monkeypatch.setattr(gguf, "llama_cpp_converters", converters)
    monkeypatch.setattr(gguf, "convertible_architectures", lambda _c: frozenset({"LlamaForCausalLM"}))
    monkeypatch.setattr(gguf, "_copy_description", slow_copy)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    async def cancel_while_copying() -> None:
        task = asyncio.create_task(gguf.check_vocabulary(model, no_progress))
        while not copying.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # before the fix: OSError "Directory not empty"
            await task

    asyncio.run(cancel_while_copying())
    assert list((tmp_path / "tmp").iterdir()) == [], "the scratch folder went, after the copy ended"
