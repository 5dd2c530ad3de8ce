"""Publishing to the Hub, for real, against a stand-in of its write API (``huggingface_hub`` in a child process).

A finished run with the tiny pattern adapter, its evaluation, a GGUF and a merged model is published with
``rentune publish``: the repo is created private, every file arrives byte for byte (the large ones over Git LFS), the
card is written from the run without a row of the data, and the token reaches the child over stdin only. A failed
upload commits nothing, and publishing again sends only what the Hub lacks.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from desktop.cli.app import main
from desktop.core.judging.general import task_score
from desktop.services.evaluation.general import GeneralCheck
from desktop.services.evaluation.judge import JudgeOptions, judge_comparison
from desktop.services.evaluation.report import write_reports
from desktop.services.local.compare import CompareExample, CompareResult
from desktop.services.local.inventory import COMPARE_FOLDER, exports_folder
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.publishing import hub as hub_module
from desktop.services.runs.store import RunStore
from tests.fakes.hub_uploads import LFS_FROM_BYTES, HubUploads
from tests.fixtures.adapters import PATTERN, TrainedAdapter
from tests.fixtures.exported_models import record_returned_run, write_gguf
from tests.fixtures.recorded_run import EVENTS

pytestmark = pytest.mark.slow  # each publish starts a Python with huggingface_hub (a few seconds)


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """The command line and environment of every child the publisher starts."""
    started: list[tuple[tuple[str, ...], dict[str, str]]] = []
    real = asyncio.create_subprocess_exec

    async def spy(*command: str, **kwargs: Any) -> asyncio.subprocess.Process:
        started.append((command, dict(kwargs.get("env") or {})))
        return await real(*command, **kwargs)

    monkeypatch.setattr(hub_module.asyncio, "create_subprocess_exec", spy)
    return started


def _finished_run(adapter: TrainedAdapter) -> str:
    """A rented run with the pattern adapter, its events, an evaluation, a GGUF and a merged model."""
    store = RunStore()
    run_id = record_returned_run(store, adapter.path, base=str(adapter.base), rented_price=2.69)
    shutil.copy(EVENTS, store.folder(run_id) / "events.jsonl")
    folder = exports_folder(run_id)
    write_gguf(folder / "model-Q8_0.gguf", file_type=7, size=3 * LFS_FROM_BYTES)
    (folder / "merged").mkdir(parents=True)
    (folder / "merged" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}', encoding="utf-8")
    (folder / "merged" / "model.safetensors").write_bytes(hashlib.sha256(b"w").digest() * (LFS_FROM_BYTES // 16))
    rows = [CompareExample(q, a, "no idea", a, i + 1) for i, (q, a) in enumerate(PATTERN)]
    result = CompareResult(adapter.base, adapter.path, Path("eval.jsonl"), 6.1, 0.4, rows, len(rows))
    general = GeneralCheck(
        [task_score("rentune_capitals", [1.0] * 8, [1.0] * 6 + [0.0] * 2)], "lm-evaluation-harness 0.4.13"
    )
    judgement = replace(judge_comparison(result, JudgeOptions(), None, None), general=general)
    write_reports(judgement, folder / COMPARE_FOLDER)
    return run_id


def test_a_run_is_published_private_with_every_file_and_a_card_from_the_run(
    pattern_adapter: TrainedAdapter,
    hub_uploads: HubUploads,
    children: list[tuple[tuple[str, ...], dict[str, str]]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    SecretStore().set(SecretName.HUGGINGFACE, hub_uploads.token)
    run_id = _finished_run(pattern_adapter)
    assert main(["publish", run_id, "--repo", "tuned-pattern", "--exports"]) == 0
    printed = capsys.readouterr().out
    assert f"to {hub_uploads.url}/ada/tuned-pattern (private" in printed

    repo = hub_uploads.repos["ada/tuned-pattern"]
    assert repo.private and len(repo.commits) == 1
    folder = exports_folder(run_id)
    expected = {
        "adapter_config.json": (pattern_adapter.path / "adapter_config.json").read_bytes(),
        "adapter_model.safetensors": (pattern_adapter.path / "adapter_model.safetensors").read_bytes(),
        "gguf/model-Q8_0.gguf": (folder / "model-Q8_0.gguf").read_bytes(),
        "merged/config.json": (folder / "merged" / "config.json").read_bytes(),
        "merged/model.safetensors": (folder / "merged" / "model.safetensors").read_bytes(),
    }
    assert {name: repo.files[name] for name in expected} == expected
    assert sorted(repo.files) == sorted([*expected, "README.md", "loss.svg"]), "PEFT's stub README is replaced"
    assert sum(1 for method, path in hub_uploads.requests if method == "PUT") == 2, "the two large files went over LFS"

    card = repo.files["README.md"].decode()
    assert card.startswith(f'---\nbase_model: "{pattern_adapter.base}"\nlibrary_name: peft\n')
    for fact in ("| Method | qlora |", "| LoRA rank | 16 |", "| Training rows | 64 |", "| GPU | H100 80GB |"):
        assert fact in card, fact
    assert "| Cost | $" in card and "![Loss during training](loss.svg)" in card
    assert "Leaning better, not yet clear (more held-out rows would tell): 4 held-out rows fixed, 0 broken" in card
    assert "General ability (lm-evaluation-harness 0.4.13, small offline tasks):" in card
    assert "| world capitals | 100% | 75% | -25 points (" in card
    assert "| normalised | 0/4 | 4/4 |" in card and 'from_pretrained("ada/tuned-pattern")' in card
    assert not any(question in card or answer in card for question, answer in PATTERN), "no row of the data"
    assert repo.files["loss.svg"].startswith(b"<svg")

    ((command, env),) = children
    assert all(hub_uploads.token not in part for part in command), "never on the command line"
    assert hub_uploads.token not in "".join(f"{k}={v}" for k, v in env.items()), "never in the child's environment"
    assert env["HF_HUB_DISABLE_XET"] == "1" and env["HF_ENDPOINT"] == hub_uploads.url


def test_a_failed_upload_commits_nothing_and_publishing_again_sends_only_what_is_missing(
    pattern_adapter: TrainedAdapter, hub_uploads: HubUploads, capsys: pytest.CaptureFixture[str]
) -> None:
    SecretStore().set(SecretName.HUGGINGFACE, hub_uploads.token)
    run_id = _finished_run(pattern_adapter)
    hub_uploads.broken_from_put = (
        2  # the storage fails from the merged model's upload on (retries too); the GGUF arrived
    )
    assert main(["publish", run_id, "--repo", "ada/tuned", "--exports"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("rentune: error: publishing failed: ") and line.endswith("publishing again resumes")
    assert hub_uploads.token not in line
    assert hub_uploads.repos["ada/tuned"].commits == [] and hub_uploads.repos["ada/tuned"].files == {}

    hub_uploads.broken_from_put, failed_puts = None, hub_uploads.puts
    assert main(["publish", run_id, "--repo", "ada/tuned", "--exports"]) == 0
    assert hub_uploads.puts == failed_puts + 1, "the GGUF was not sent again: only the merged model's weights"
    assert len(hub_uploads.repos["ada/tuned"].files) == 7


@pytest.mark.parametrize(
    ("setup", "argv_repo", "expected", "code"),
    [
        ("none", "tuned", "no Hugging Face token: add a token with write access in Settings", 2),
        ("wrong", "tuned", "the Hugging Face Hub refused the token: add a token with write access in Settings", 1),
        ("right", "bad--name", "'bad--name' is not a Hugging Face repo name", 2),
    ],
    ids=["no-token", "refused-token", "bad-name"],
)
def test_what_cannot_be_published_is_one_line_with_the_fix(
    pattern_adapter: TrainedAdapter,
    hub_uploads: HubUploads,
    capsys: pytest.CaptureFixture[str],
    setup: str,
    argv_repo: str,
    expected: str,
    code: int,
) -> None:
    if setup != "none":
        SecretStore().set(SecretName.HUGGINGFACE, hub_uploads.token if setup == "right" else "hf_not_the_right_one")
    assert main(["publish", str(pattern_adapter.path), "--repo", argv_repo]) == code
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"rentune: error: {expected}" or line.startswith(f"rentune: error: {expected}"), line
    assert hub_uploads.repos == {}
