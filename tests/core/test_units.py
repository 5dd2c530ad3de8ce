"""Numbers for people: memory in one unit (GiB) everywhere, parameter counts that round into the right unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.core.sizing.catalog import ModelCatalog
from desktop.core.sizing.gpus import gpus_from_json
from desktop.core.units import card_text, count_text, gib, memory_text

RESOURCES = Path(__file__).resolve().parents[2] / "resources"


def test_memory_reads_in_the_cards_own_unit_so_usable_is_below_the_card() -> None:
    gpus = {gpu.id: gpu for gpu in gpus_from_json(json.loads((RESOURCES / "gpus.json").read_text("utf-8")))}
    for gpu in gpus.values():
        # the card's size and what it leaves usable, side by side as the Sizing chart shows them
        card, usable = card_text(gpu.vram_gib), memory_text(gpu.usable_gb)
        assert card.endswith(" GiB") and usable.endswith(" GiB"), (card, usable)
        assert float(usable.split()[0].replace(",", "")) < float(card.split()[0]), f"{gpu.name}: {usable} > {card}"
    rtx = next(gpu for gpu in gpus.values() if gpu.vram_gib == 24)
    assert (card_text(rtx.vram_gib), memory_text(rtx.usable_gb)) == ("24 GiB", "23.3 GiB")
    assert gib(2**30 / 1e9) == pytest.approx(1.0)


def test_memory_slivers_and_large_sizes_read_plainly() -> None:
    assert memory_text(0.004, digits=2) == "< 0.01 GiB" and memory_text(0.0) == "0.0 GiB"
    assert memory_text(3436.0) == "3,200.0 GiB"  # 3,436 decimal GB hold 3,200 GiB
    assert memory_text(-2.147483648) == "-2.0 GiB"


@pytest.mark.parametrize(
    ("count", "short", "long"),
    [
        (999_812_736, "1.0 B", "1.00 billion"),  # Gemma 3 1B read "1000 M"
        (999_400_000, "999 M", "999.4 million"),
        (494_005_120, "494 M", "494.0 million"),
        (134_515_008, "135 M", "134.5 million"),
        (7_615_616_512, "7.6 B", "7.62 billion"),
        (999_960, "1 M", "1.0 million"),  # read "1,000 thousand"
        (40_370_176, "40 M", "40.4 million"),
        (140_000, "140 K", "140 thousand"),
        (512, "512", "512"),
    ],
)
def test_parameter_counts_take_the_unit_they_round_into(count: int, short: str, long: str) -> None:
    assert (count_text(count), count_text(count, long=True)) == (short, long)


def test_no_catalog_model_reads_a_thousand_of_a_unit() -> None:
    catalog = ModelCatalog.from_json(json.loads((RESOURCES / "models.json").read_text("utf-8")))
    for entry in catalog:
        for text in (count_text(entry.arch.total_params), count_text(entry.arch.total_params, long=True)):
            assert not text.startswith(("1000", "1,000")), f"{entry.id}: {text}"
