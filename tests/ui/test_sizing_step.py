"""The sizing step plans real models (catalog, local folder) from the prepared data's manifest, like rentune plan."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from desktop.cli import main
from desktop.core.runs.draft import RunDraft, TargetDraft
from desktop.core.settings import Settings
from desktop.core.sizing.report import format_hours
from desktop.core.units import memory_text
from desktop.services.data.prepare import prepare_dataset
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.review_step import write_launch_spec
from desktop.ui.pages.wizard.sizing_step import CARD_SIZES_GIB, HATCHED, SizingStep, option_label
from desktop.ui.theme import current_palette
from desktop.ui.widgets.charts import BarSegment, Capacity, MemoryBarChart, card_gb
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
    wait_for(lambda: not step.running and step.facts is not None, timeout=60)
    return step


def test_a_catalog_model_is_sized_from_the_manifest_like_the_cli(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    wait_for: Callable[..., None],
    prepared: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    step = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", train_file=str(prepared))), wait_for)
    assert step.validate() is None and step.sizing is not None
    manifest = json.loads((prepared.parent / "manifest.json").read_text())
    tokens = manifest["tokens"]["train_per_epoch"]  # the training split's own tokens
    plan = step.sizing.plan
    assert plan.workload.tokens == tokens and f"Tokens: {tokens:,} per epoch for 3 epochs" in step.tokens_label.text()

    assert main(["plan", "--model", "qwen2.5-0.5b", "--tokens", str(tokens), "--epochs", "3", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    table = step.options_table
    assert table.rowCount() == len(cli["options"])
    shown = [(table.item(r, 1).text(), table.item(r, 4).text()) for r in range(table.rowCount())]
    assert table.horizontalHeaderItem(3).text() == "Time"
    assert shown == [(str(o["count"]), f"${o['cost_usd']:,.2f}") for o in cli["options"]]

    items = {k: v for k, v in cli["memory_gb"].items() if k != "per_gpu_total" and v > 0}
    assert len(step.chart.segments) == len(items)
    assert step.chart.total() == pytest.approx(cli["memory_gb"]["per_gpu_total"], abs=0.05)
    assert step.chart.card_sizes == CARD_SIZES_GIB
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
    assert step.sizing is not None and step.validate() is None
    assert step.sizing.plan.arch.vocab_size == tiny_model.vocab_size
    assert "as no dataset is prepared yet" in step.tokens_label.text()
    assert step.options_table.rowCount() > 0 and step.validate() is None
    draft.training["seq_len"] = 256
    step.show_draft()  # changed settings: sized again
    wait_for(lambda: step.sizing is not None and step.sizing.plan.setup.seq_len == 256, timeout=30)


def test_an_unreachable_hub_model_blocks_with_the_fix(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = sized(make_step(qtbot, RunDraft(base_model="some-org/some-model-not-cached")), wait_for)
    problem = step.step_problem()
    assert step.sizing is None and problem is not None
    assert problem.headline == "The Hugging Face Hub cannot be reached" == step.status_label.text()
    assert "offline" in problem.details and "local model folder" in problem.details
    assert (problem.step, problem.setting, problem.action) == ("model", "base_model", "Change the model")
    assert step.problem_banner.isVisibleTo(step) and step.problem_action.isVisibleTo(step)
    assert step.options_table.rowCount() == 0
    assert not step.chart.segments and "cannot be sized" in step.chart.empty_text


def test_no_model_yet_says_where_to_choose_one(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = sized(make_step(qtbot, RunDraft()), wait_for)
    assert step.validate() == "No model chosen yet. Choose the model to fine-tune on the Model step."


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


def test_the_chart_shows_the_selected_options_memory_per_gpu_with_its_capacity(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    step = sized(make_step(qtbot, RunDraft(base_model="llama-3.3-70b", method="lora")), wait_for)
    assert step.sizing is not None
    options, table = step.sizing.plan.options, step.options_table
    assert [table.horizontalHeaderItem(c).text() for c in range(5)] == ["GPU", "GPUs", "Fits", "Time", "Cost"]
    row = next(r for r, o in enumerate(options) if o.count == 8)
    table.selectRow(row)
    picked = options[row]
    # The bar is that option's memory on each GPU (the split the table shows), its GPU's usable memory across it.
    assert step.chart.total() == pytest.approx(picked.memory.per_gpu_total, abs=0.01)
    assert step.chart.capacity is not None and step.chart.capacity.value == picked.gpu.usable_gb
    assert "on each of 8 GPUs" in step.memory_caption.text()
    assert f"{memory_text(picked.memory.per_gpu_total, 2)} per GPU" in step.items_label.text()
    assert step.items_label.text().endswith(" GiB per GPU") and " GB" not in step.memory_caption.text()
    assert f"has {memory_text(picked.gpu.usable_gb)} usable" in step.memory_caption.text()
    single = next(r for r, o in enumerate(options) if o.count == 1)
    table.selectRow(single)
    assert step.chart.total() == pytest.approx(options[single].memory.per_gpu_total, abs=0.01)
    assert "on one GPU" in step.memory_caption.text()
    for r, option in enumerate(options):  # one way of writing a duration, under "Time"
        assert table.item(r, 3).text() == format_hours(option.hours)


def test_each_memory_component_keeps_its_colour_whatever_else_is_shown(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    lora = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", method="lora")), wait_for)
    full = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", method="full")), wait_for)
    palette = current_palette()
    colours = [{s.key: s.colour for s in step.chart.segments} for step in (lora, full)]
    assert "lora_adapter" in colours[0] and "optimizer" in colours[1], "the two plans show different components"
    for key in colours[0].keys() & colours[1].keys():
        assert colours[0][key] == colours[1][key], key
    assert colours[1]["weights"] == palette.chart[0] and colours[1]["activations"] == palette.chart[2]
    for shown in colours:
        visible = [(colour, key in HATCHED) for key, colour in shown.items()]
        assert len(set(visible)) == len(visible), "no two parts of one bar look the same"
    assert [e.text().split("\N{NO-BREAK SPACE}")[0] for e in full.legend.entries] == [
        s.label for s in full.chart.segments
    ]


def test_card_size_labels_never_overlap_and_an_empty_chart_says_so(qtbot: QtBot) -> None:
    chart = MemoryBarChart(CARD_SIZES_GIB)
    qtbot.addWidget(chart)
    chart.resize(700, chart.sizeHint().height())
    chart.show()
    qtbot.waitExposed(chart)
    chart.show_empty("The memory the job needs appears here once it is sized.")
    chart.grab()  # paints
    assert chart.labelled_cards == [] and chart.accessibleDescription().startswith("The memory the job needs")
    palette = current_palette()
    # 3,200 GB per GPU: the card sizes crowd at the left edge; labels that would touch are left out.
    chart.show_segments([BarSegment("weights", "Base weights", 3200.0, palette.chart[0])], Capacity("H100", 79.0))
    chart.grab()
    assert 0 < len(chart.labelled_cards) < len(CARD_SIZES_GIB) and 141 in chart.labelled_cards
    # 20 GB on a 44 GB card: room for every card in range.
    chart.show_segments([BarSegment("weights", "Base weights", 20.0, palette.chart[0])], Capacity("L40S", 44.2))
    chart.grab()
    assert chart.labelled_cards == [48, 24]
    (_, left_end), (right_start, _) = sorted(chart.card_label_spans)
    assert left_end < right_start, "the labels do not touch"
    # One unit on the whole chart, the card's own: 44.2 decimal GB usable is 41.2 GiB, under the 48 GiB card
    # ("25.0 GB usable" stood beside a "24 GB card", as if a card gave more than it holds).
    assert "L40S has 41.2 GiB usable" in chart.accessibleDescription()
    assert chart.accessibleDescription().startswith("18.6 GiB per GPU: Base weights 18.6 GiB")
    assert chart.card_label_texts == ["48 GiB card", "24 GiB card"] and chart.capacity_text == "L40S: 41.2 GiB usable"
    assert chart.axis_texts and all(text.endswith(" GiB") for text in chart.axis_texts)
    ticks = [float(text.split()[0].replace(",", "")) for text in chart.axis_texts]
    assert ticks[0] == 0 and len({round(b - a, 6) for a, b in itertools.pairwise(ticks)}) == 1, "round GiB ticks"
    assert card_gb(24) == pytest.approx(25.77, abs=0.01) and card_gb(48) > 44.2  # where a card sits on the GB bar


def test_a_speed_measured_on_an_earlier_run_is_used_and_named(
    qtbot: QtBot, wait_for: Callable[..., None], prepared: Path
) -> None:
    from tests.services.test_estimates import _finished_run

    before = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", train_file=str(prepared))), wait_for)
    assert "measured on your runs" not in before.tokens_label.text()
    speed = {option.gpu.id: option.tokens_per_s for option in before.sizing.plan.options if option.count == 1}
    run_id = _finished_run(RunStore(), {"gpu": "rtx4090", "tokens_per_s": 1000.0}, [500.0, 500.0])
    after = sized(make_step(qtbot, RunDraft(base_model="qwen2.5-0.5b", train_file=str(prepared))), wait_for)
    said = f"Speeds measured on your runs: RTX 4090 from run {run_id} (0.50x the estimate)."
    assert said in after.tokens_label.text()
    slower = {option.gpu.id: option.tokens_per_s for option in after.sizing.plan.options if option.count == 1}
    assert slower["rtx4090"] == pytest.approx(speed["rtx4090"] * 0.5, rel=0.01) and slower["l4"] == speed["l4"]


def test_a_measured_peak_spreads_over_the_bar_so_it_adds_up_to_the_measured_total() -> None:
    from desktop.ui.pages.wizard.sizing_step import memory_segments

    items = {"weights": 6.0, "activations": 2.0, "logits": 2.0, "cuda_context": 0.4, "measured": -1.0}
    segments = memory_segments(items, current_palette())
    assert [s.key for s in segments] == ["weights", "activations", "logits", "cuda_context"]
    assert sum(s.value for s in segments) == pytest.approx(9.4), "10.4 modelled, 1.0 less measured"
    assert [s.value for s in segments] == [5.4, 1.8, 1.8, 0.4], "the context is outside the measurement"
