"""A rented run's bill by phase: every billed second in one phase, so the phases add up to the ledger's dollars."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from desktop.core.runs.bill_phases import BilledStretch, BillPhase, BillSplit, split_bill
from desktop.core.runs.states import FLOW, RunState

T0 = 1_700_000_000.0


def _history(*steps: tuple[float, RunState]) -> list[dict[str, object]]:
    return [{"ts": T0 + offset, "to_state": state.value} for offset, state in steps]


def _by_phase(split: BillSplit) -> dict[BillPhase, tuple[float, float]]:
    return {cost.phase: (cost.seconds, cost.usd) for cost in split.phases if cost.seconds}


def test_a_run_priced_by_hand_phase_by_phase() -> None:
    # $36 an hour is a cent a second: rented at 0, up at 100, training 400..3,400, home at 3,460, gone at 3,490
    history = _history(
        (0, RunState.PLANNED),
        (0, RunState.PROVISIONING),
        (100, RunState.CONNECTING),
        (130, RunState.UPLOADING),
        (250, RunState.BOOTSTRAPPING),
        (400, RunState.TRAINING),
        (3400, RunState.SYNCING),
        (3430, RunState.PULLING),
        (3460, RunState.FINISHED),
    )
    hold = [{"event": "hold", "ts": T0 + 1000, "held": True}, {"event": "hold", "ts": T0 + 1300, "held": False}]
    split = split_bill([BilledStretch(T0, T0 + 3490, 36.0)], history, hold)
    assert _by_phase(split) == {
        BillPhase.WAITING_FOR_MACHINE: pytest.approx((100, 1.00)),
        BillPhase.SETUP: pytest.approx((300, 3.00)),
        BillPhase.TRAINING: pytest.approx((2700, 27.00)),
        BillPhase.WAITING_ON_YOU: pytest.approx((300, 3.00)),
        BillPhase.PULLING_HOME: pytest.approx((60, 0.60)),
        BillPhase.TEARDOWN: pytest.approx((30, 0.30)),
    }
    assert split.usd == pytest.approx(34.90) and split.idle_usd == pytest.approx(7.90)
    assert split.training_hours == pytest.approx(0.75)
    assert split.effective_usd_per_training_hour == pytest.approx(34.90 / 0.75)  # $46.53, not the $36 on the offer


def test_the_export_on_the_machine_is_its_own_phase_and_a_run_that_never_trained_has_no_effective_hour() -> None:
    history = _history((0, RunState.PROVISIONING), (50, RunState.PULLING), (200, RunState.FINISHED))
    export = [
        {"event": "export", "ts": T0 + 80},
        {"event": "export", "ts": T0 + 120},
        {"event": "exported", "ts": T0 + 180},
    ]
    split = split_bill([BilledStretch(T0, T0 + 210, 36.0)], history, export)
    assert _by_phase(split)[BillPhase.EXPORT] == pytest.approx((100, 1.0))
    assert _by_phase(split)[BillPhase.PULLING_HOME] == pytest.approx((50, 0.5))
    assert split.training_hours == 0 and split.effective_usd_per_training_hour is None


def test_a_checkpoint_coming_home_while_training_is_its_own_phase_and_still_training() -> None:
    # $36 an hour: training 100..1,100 with checkpoints pulled 300..360 and 700..800; one more after training ended
    history = _history((0, RunState.PROVISIONING), (100, RunState.TRAINING), (1100, RunState.PULLING))
    transfers = [(T0 + 300, T0 + 360), (T0 + 700, T0 + 800), (T0 + 1100, T0 + 1150)]
    split = split_bill([BilledStretch(T0, T0 + 1200, 36.0)], history, [], transfers)
    assert _by_phase(split) == {
        BillPhase.WAITING_FOR_MACHINE: pytest.approx((100, 1.0)),
        BillPhase.TRAINING: pytest.approx((840, 8.4)),
        BillPhase.CHECKPOINT_TRANSFER: pytest.approx((160, 1.6)),
        BillPhase.PULLING_HOME: pytest.approx((100, 1.0)),  # the run no longer trained: that pull is pulling home
    }
    assert split.idle_usd == pytest.approx(2.0), "the GPU trained on while the checkpoint came home: not idle"
    assert split.training_hours == pytest.approx(1000 / 3600)


def test_two_machines_of_a_cluster_bill_twice_for_one_wall_hour_of_training() -> None:
    history = _history((0, RunState.TRAINING), (3600, RunState.FINISHED))
    machines = [BilledStretch(T0, T0 + 3600, 2.0), BilledStretch(T0, T0 + 3600, 2.0)]
    split = split_bill(machines, history, [])
    assert _by_phase(split)[BillPhase.TRAINING] == pytest.approx((7200, 4.0))
    assert split.training_hours == pytest.approx(1.0) and split.effective_usd_per_training_hour == pytest.approx(4.0)


def test_a_machine_still_billing_after_its_run_ended_is_teardown_and_one_rented_before_any_state_is_waiting() -> None:
    history = _history((100, RunState.TRAINING), (200, RunState.FAILED))
    split = split_bill([BilledStretch(T0, T0 + 500, 36.0)], history, [])
    assert _by_phase(split) == {
        BillPhase.WAITING_FOR_MACHINE: pytest.approx((100, 1.0)),
        BillPhase.TRAINING: pytest.approx((100, 1.0)),
        BillPhase.TEARDOWN: pytest.approx((300, 3.0)),
    }


_STATES = st.sampled_from([*FLOW, RunState.PAUSED, RunState.FAILED, RunState.CANCELLED])
_SECONDS = st.floats(min_value=0, max_value=20_000, allow_nan=False)


@given(
    rentals=st.lists(st.tuples(_SECONDS, _SECONDS, st.floats(0.01, 50.0)), min_size=1, max_size=4),
    history=st.lists(st.tuples(_SECONDS, _STATES), max_size=12),
    holds=st.lists(st.tuples(_SECONDS, _SECONDS), max_size=3),
    transfers=st.lists(st.tuples(_SECONDS, _SECONDS), max_size=3),
)
def test_the_phases_add_up_to_the_ledgers_dollars_whatever_the_history(
    rentals: list[tuple[float, float, float]],
    history: list[tuple[float, RunState]],
    holds: list[tuple[float, float]],
    transfers: list[tuple[float, float]],
) -> None:
    stretches = [BilledStretch(T0 + min(a, b), T0 + max(a, b), price) for a, b, price in rentals]
    events = []
    for a, b in holds:
        events += [{"event": "hold", "ts": T0 + min(a, b), "held": True}, {"event": "hold", "ts": T0 + max(a, b)}]
    spans = [(T0 + min(a, b), T0 + max(a, b)) for a, b in transfers]
    split = split_bill(stretches, _history(*sorted(history)), events, spans)
    ledger = sum(s.price_per_hour * (s.end - s.start) / 3600 for s in stretches)
    assert sum(cost.usd for cost in split.phases) == pytest.approx(ledger, rel=1e-9, abs=1e-9)
    assert split.usd == pytest.approx(ledger, rel=1e-9, abs=1e-9)
    assert sum(c.seconds for c in split.phases) == pytest.approx(sum(s.end - s.start for s in stretches), abs=1e-6)


def test_serving_after_training_is_its_own_phase_and_no_paid_idle() -> None:
    history = _history(
        (0, RunState.PROVISIONING),
        (100, RunState.TRAINING),
        (400, RunState.PULLING),
        (430, RunState.SERVING),
        (2230, RunState.FINISHED),
    )
    split = split_bill([BilledStretch(T0, T0 + 2260, 36.0)], history, [])
    assert _by_phase(split)[BillPhase.SERVING] == pytest.approx((1800, 18.0))
    assert split.usd == pytest.approx(22.60)
    assert split.idle_usd == pytest.approx(1.00 + 0.30 + 0.30), "renting, pull and teardown; not the serving asked for"
    hours = split.training_hours
    assert split.effective_usd_per_training_hour == pytest.approx((22.60 - 18.0) / hours), "serving is no training"
