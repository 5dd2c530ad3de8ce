"""What judging on the machine costs: the per-token floor for small models, the weights' read for large ones."""

from __future__ import annotations

import pytest

from desktop.core.judging.on_machine import judge_cost


def test_a_small_model_pays_the_per_token_floor() -> None:
    cost = judge_cost(135_000_000, 50, 128, 2.0)
    # 1.5 min fixed + 0.27 GB read at 0.8 GB/s + 50 rows x 2 answers x 128 tokens x 25 ms
    assert cost.work_minutes == pytest.approx(1.5 + 0.27 / 0.8 / 60 + 50 * 2 * 128 * 0.025 / 60, abs=0.05)
    assert cost.download_minutes == 0.0 and cost.usd == pytest.approx(cost.work_minutes / 60 * 2.0, abs=0.005)


def test_a_large_model_pays_a_read_of_its_weights_per_token() -> None:
    cost = judge_cost(70_000_000_000, 50, 128, 20.0)
    per_token = 140e9 / 1e12  # 0.14 s: the weights' read, above the floor
    assert cost.work_minutes == pytest.approx(1.5 + 140 / 0.8 / 60 + 50 * 2 * 128 * per_token / 60, abs=0.05)
    assert cost.usd == pytest.approx(cost.work_minutes / 60 * 20.0, abs=0.01)


def test_no_price_no_dollars() -> None:
    assert judge_cost(1_000_000_000, 10, 64, None).usd is None
