"""Paid idle read from what this computer keeps: the ledger, each run's history and its mirrored trainer events."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.runs.bill import BillEvents, month_idle, run_bill_split
from desktop.services.runs.store import RunStore
from tests.fixtures.recorded_run import backdate
from trainer_payload.protocol import PROTOCOL_VERSION

NOW = datetime(2026, 12, 15, 12, 0).timestamp()  # the middle of a local month
T0 = NOW - 5000


def _lines(*events: dict[str, object]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


def _trained_run(store: RunStore, ledger: Ledger) -> str:
    """A run billed 1,000 s at $36/h ($10): 100 s renting, 800 s training with a 100 s hold, then 100 s teardown."""
    run = store.create({"base_model": "x"}, None)
    for state in (RunState.PROVISIONING, RunState.TRAINING, RunState.FINISHED):
        store.transition(run.id, state)
    backdate(store, run.id, [T0 - 10, T0, T0 + 100, T0 + 900])
    events = [
        {"v": PROTOCOL_VERSION, "seq": 1, "ts": T0 + 150, "event": "step", "step": 1, "loss": 2.0},
        {"v": PROTOCOL_VERSION, "seq": 2, "ts": T0 + 300, "event": "hold", "step": 9, "held": True},
        {"v": PROTOCOL_VERSION, "seq": 3, "ts": T0 + 400, "event": "hold", "step": 9, "held": False},
    ]
    (store.folder(run.id) / "events.jsonl").write_text(_lines(*events))
    ledger.open(run.id, "runpod", "pod-1", "RTX 4090", 36.0, started=T0)
    ledger.close("runpod", "pod-1", stopped=T0 + 1000)
    return run.id


def test_a_runs_bill_and_this_months_paid_idle_come_from_the_ledger_history_and_events() -> None:
    store, ledger = RunStore(), Ledger()
    run_id = _trained_run(store, ledger)
    split = run_bill_split(store, run_id, ledger=ledger, now=NOW)
    assert split is not None and split.usd == pytest.approx(10.0) and split.idle_usd == pytest.approx(3.0)
    ledger.open("deleted-run", "vast", "v-1", "RTX 4090", 36.0, started=T0)  # no history left: all of it idle
    ledger.close("vast", "v-1", stopped=T0 + 360)
    ledger.open("older-run", "vast", "v-2", "RTX 4090", 36.0, started=T0 - 40 * 86400)  # last month's
    ledger.close("vast", "v-2", stopped=T0 - 39 * 86400)
    month = month_idle(store, BillEvents(), ledger=ledger, now=NOW)
    assert month.usd == pytest.approx(10.0 + 3.6) and month.idle_usd == pytest.approx(3.0 + 3.6)
    assert not (store.runs_dir / "deleted-run").exists(), "reading a deleted run's events makes no folder for it"


def test_the_events_are_read_on_from_where_the_last_read_ended(tmp_path: Path) -> None:
    events, path = BillEvents(), tmp_path / "events.jsonl"

    def event(seq: int, ts: float, kind: str, **fields: object) -> dict[str, object]:
        return {"v": PROTOCOL_VERSION, "seq": seq, "ts": T0 + ts, "event": kind, **fields}

    assert events.of(tmp_path) == []
    path.write_text(_lines(event(1, 1.0, "step", step=1, loss=2.0), event(2, 2.0, "hold", step=1, held=True)))
    assert [e["ts"] - T0 for e in events.of(tmp_path)] == [2.0]
    torn = json.dumps(event(4, 4.0, "export", phase="merging"))
    with path.open("a") as file:
        file.write(_lines(event(3, 3.0, "hold", step=1, held=False)) + torn[:-1])
    assert [e["ts"] - T0 for e in events.of(tmp_path)] == [2.0, 3.0], "a line still being written waits"
    with path.open("a") as file:
        file.write(torn[-1] + "\n")
    assert [e["ts"] - T0 for e in events.of(tmp_path)] == [2.0, 3.0, 4.0]
    path.write_text(_lines(event(1, 9.0, "exported", files={})))  # rewritten shorter: read from the start
    assert [e["ts"] - T0 for e in events.of(tmp_path)] == [9.0]


def test_checkpoint_pulls_are_logged_and_read_back_and_a_bad_line_is_skipped(tmp_path: Path) -> None:
    from desktop.services.runs.transfer_log import TRANSFERS_FILE, read_transfers, record_transfer

    assert read_transfers(tmp_path) == []
    record_transfer(tmp_path, T0 + 10, T0 + 20)
    with (tmp_path / TRANSFERS_FILE).open("a") as file:
        file.write('not json\n{"start": 5}\n{"start": 9, "end": 3}\n{"start": "nan", "end": 1}\n')
    record_transfer(tmp_path, T0 + 1, T0 + 2)
    assert read_transfers(tmp_path) == [(T0 + 1, T0 + 2), (T0 + 10, T0 + 20)]
    record_transfer(tmp_path / "deleted", T0, T0 + 1)  # a run folder being deleted records nothing, raises nothing
