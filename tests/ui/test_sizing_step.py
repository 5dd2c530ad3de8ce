"""The sizing step plans real models (catalog, local folder) from the prepared data's manifest, like rentune plan."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from desktop.cli import main
from desktop.core.runs.draft import RunDraft, TargetDraft
from desktop.core.settings import Settings
from desktop.services.data.prepare import prepare_dataset
from desktop.services.platform.secrets import SecretStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.review_step import write_launch_spec
from desktop.ui.pages.wizard.sizing_step import CARD_SIZES_GB, SizingStep, option_label
from tests.fixtures.tiny_models import TinyModel


@pytest.fixture
def prepared(chat_dataset: Path, tmp_path: Path) -> Path:
    """The chat dataset prepared as the data step does (train.jsonl, eval.jsonl, manifest.json)."""
    return prepare_dataset(chat_dataset, tmp_path / "prepared", seq_len=2048, eval_fraction=0.1).train


def make_step(qtbot: QtBot, draft: RunDraft) -> SizingStep:
    step = SizingStep(AppContext(Settings(), SecretStore(), draft=draft))
    qtbot.addWidget(step)
    step.resize(1280, 800)
    step.show()
    return step


def sized(step: SizingStep, wait_for: Callable[..., None]) -> SizingStep:
    step.show_draft()
    wait_for(lambda: step.sizing is not None or step.problem is not None, timeout=30)
    return step


def test_a_catalog_model_is_sized_from_the_manifest_like_the_cli(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    prepared: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    step = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", train_file=str(prepared))), wait_for)
    assert step.problem is None and step.sizing is not None
    manifest = json.loads((prepared.parent / "manifest.json").read_text())
    counts, trained = manifest["counts"], manifest["tokens"]["trained_per_epoch"]
    tokens = round(trained * counts["train"] / (counts["train"] + counts["eval"]))
    plan = step.sizing.plan
    assert plan.workload.tokens == tokens and f"{tokens:,} tokens x 3 epochs" in step.status_label.text()

    assert main(["plan", "--model", "qwen2.5-0.5b", "--tokens", str(tokens), "--epochs", "3", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    table = step.options_table
    assert table.rowCount() == len(cli["options"])
    shown = [(table.item(r, 1).text(), table.item(r, 4).text()) for r in range(table.rowCount())]
    assert shown == [(str(o["count"]), f"${o['cost_usd']:,.2f}") for o in cli["options"]]

    items = {k: v for k, v in cli["memory_gb"].items() if k != "per_gpu_total" and v > 0}
    assert len(step.chart.segments) == len(items)
    assert step.chart.total() == pytest.approx(cli["memory_gb"]["per_gpu_total"], abs=0.05)
    assert [line.value() for line in step.chart.card_lines] == list(CARD_SIZES_GB)
    assert "Total:" in step.items_label.text()

    recommended = step.sizing.recommended
    assert recommended is not None and table.item(0, 0).text().endswith("(recommended)")
    assert table.item(0, 0).font().bold() and step.recommendation_label.text().startswith("Recommended:")
    selected = table.selectionModel().selectedRows()
    assert [index.row() for index in selected] == [0], "the recommendation is preselected"
    assert table.item(0, 0).data(Qt.ItemDataRole.UserRole) == option_label(recommended)
    assert step.context.draft.gpu_name == "", "a preselection is not the user's pick (a re-plan recommends afresh)"
    table.selectRow(2)
    assert step.context.draft.gpu_name == table.item(2, 0).data(Qt.ItemDataRole.UserRole)
    assert step.validate() is None and not step.suggestions_label.isVisibleTo(step)


def test_a_local_model_folder_is_sized_from_its_config(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], tiny_model: TinyModel
) -> None:
    draft = RunDraft(base_model=str(tiny_model.path), method="lora")
    step = sized(make_step(qtbot, draft), wait_for)
    assert step.sizing is not None and step.problem is None
    assert step.sizing.plan.arch.vocab_size == tiny_model.vocab_size
    assert "prepare the data for exact counts" in step.status_label.text()
    assert step.options_table.rowCount() > 0 and step.validate() is None
    draft.training["seq_len"] = 256
    step.show_draft()  # changed settings: sized again
    wait_for(lambda: step.sizing is not None and step.sizing.plan.setup.seq_len == 256, timeout=30)


def test_an_unreachable_hub_model_blocks_with_the_fix(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = sized(make_step(qtbot, RunDraft(base_model="some-org/some-model-not-cached")), wait_for)
    assert step.sizing is None and step.problem is not None
    assert "offline" in step.problem and "local model folder" in step.problem
    assert step.validate() == step.problem and step.status_label.text() == step.problem
    assert step.options_table.rowCount() == 0


def test_no_model_yet_says_where_to_choose_one(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = sized(make_step(qtbot, RunDraft()), wait_for)
    assert step.validate() == "Choose a base model on the Model step first."


def test_nothing_fits_shows_what_to_change_without_blocking(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    draft = RunDraft(base_model="llama-3.3-70b", method="full", gpu_name="H100 SXM")
    draft.training.update(seq_len=8192, micro_batch=8)
    step = sized(make_step(qtbot, draft), wait_for)
    assert step.sizing is not None and step.sizing.recommended is None
    assert step.recommendation_label.text().startswith("Nothing fits")
    assert step.suggestions_label.isVisibleTo(step) and "QLoRA" in step.suggestions_label.text()
    assert "--" not in step.suggestions_label.text(), "no CLI flags in the app"
    assert "gradient accumulation" in step.suggestions_label.text() or "8 GPUs, FSDP" in step.suggestions_label.text()
    assert draft.gpu_name == "H100 SXM", "the user's pick is kept and selected"
    assert step.validate() is None


def test_an_own_server_too_small_is_a_warning_not_a_block(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    draft = RunDraft(base_model="llama-3.1-8b", method="lora")
    draft.target.gpu = "1 x NVIDIA GeForce RTX 3060 (12288 MiB)"
    step = sized(make_step(qtbot, draft), wait_for)
    assert step.server_label.isVisibleTo(step) and "run out of memory" in step.server_label.text()
    assert step.validate() is None
    draft.target.gpu = "1 x NVIDIA H200 (143771 MiB)"
    step.show_draft()
    assert not step.server_label.isVisibleTo(step)


def test_the_picked_gpu_count_and_strategy_reach_the_launched_spec(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], prepared: Path
) -> None:
    # 70 B parameters in LoRA need more than one card: the options include several GPUs.
    target = TargetDraft(host="box", user="me")
    draft = RunDraft(base_model="llama-3.3-70b", method="lora", train_file=str(prepared), target=target)
    step = sized(make_step(qtbot, draft), wait_for)
    assert step.sizing is not None
    table, options = step.options_table, step.sizing.plan.options
    row = next(r for r, o in enumerate(options) if o.count > 1)
    table.selectRow(row)
    _path, spec = write_launch_spec(step.context.draft)
    picked = options[row]
    assert (spec.training["num_gpus"], spec.training["strategy"]) == (picked.count, picked.strategy.value)
    table.selectRow(next(r for r, o in enumerate(options) if o.count == 1))
    _path, spec = write_launch_spec(step.context.draft)
    assert spec.training["num_gpus"] == 1
