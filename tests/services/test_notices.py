"""Notices are given once each: budget thresholds, idle machines, orphans, finished and failed runs."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from desktop.core.runs.spec import ComputeSpec
from desktop.core.runs.states import RunState
from desktop.services.billing.activity import mark_activity
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.meter import read_meter
from desktop.services.billing.notices import Notice, NoticeKind, NoticeMemory, due_notices
from desktop.services.providers.base import Instance, InstanceState, ProviderName
from desktop.services.runs.store import RunStore
from tests.fixtures.recorded_costs import backdated_run

HOUR = 3600.0


def _live_rented_run(store: RunStore, ledger: Ledger, start: float, budget: float = 10.0, price: float = 6.0) -> str:
    compute = asdict(ComputeSpec(provider="runpod", gpu="RTX 4090"))
    rental = {
        "provider": "runpod",
        "instance_id": "pod-1",
        "gpu": "RTX 4090",
        "price_per_hour": price,
        "spot": False,
        "offer_id": "o",
        "created": start,
        "ready": start + 60,
    }
    spec = {"compute": compute, "rental": rental, "budget_usd": budget, "hourly_rate_usd": price, "base_model": "m"}
    history = [(RunState.PLANNED, start - 10), (RunState.PROVISIONING, start), (RunState.TRAINING, start + 120)]
    run_id = backdated_run(store, spec, history, "ssh://root@10.0.0.1:22")
    ledger.open(run_id, "runpod", "pod-1", "RTX 4090", price, started=start)
    return run_id


def _said(memory: NoticeMemory, store: RunStore, ledger: Ledger, now: float, **kwargs: object) -> list[Notice]:
    return memory.take(due_notices(read_meter(store, ledger, now=now, **kwargs)))  # type: ignore[arg-type]


def _budget(memory: NoticeMemory, store: RunStore, ledger: Ledger, now: float) -> list[Notice]:
    """The budget notices given (the run is idle too, in these made-up hours: that is another test)."""
    return [notice for notice in _said(memory, store, ledger, now) if notice.kind is NoticeKind.BUDGET]


def test_each_budget_threshold_is_announced_once() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    start = time.time() - 10 * HOUR
    run_id = _live_rented_run(store, ledger, start)
    assert _budget(memory, store, ledger, start + 0.5 * HOUR) == []  # $3 of $10
    [half] = _budget(memory, store, ledger, start + 0.9 * HOUR)  # $5.40
    assert (half.kind, half.percent, half.run_id, half.budget_usd) == (NoticeKind.BUDGET, 50, run_id, 10.0)
    assert half.usd == pytest.approx(5.4)
    assert _budget(memory, store, ledger, start + 1.0 * HOUR) == [], "50 % is said once"
    [eighty] = _budget(memory, store, ledger, start + 1.4 * HOUR)
    assert eighty.percent == 80
    [full] = _budget(memory, store, ledger, start + 1.7 * HOUR)
    assert full.percent == 100
    assert _budget(memory, store, ledger, start + 1.8 * HOUR) == []


def test_a_jump_past_two_thresholds_says_only_the_higher_one() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    start = time.time() - 10 * HOUR
    _live_rented_run(store, ledger, start)
    [notice] = _budget(memory, store, ledger, start + 1.4 * HOUR)
    assert notice.percent == 80
    assert _budget(memory, store, ledger, start + 1.5 * HOUR) == [], "50 % was remembered with it"


def test_a_machine_that_trains_nothing_is_announced_once_per_idle_spell() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    now = time.time()
    run_id = _live_rented_run(store, ledger, now - 30 * 60, budget=0)  # last moved 28 min ago (training began)
    [idle] = _said(memory, store, ledger, now)
    assert idle.kind is NoticeKind.IDLE and idle.run_id == run_id
    assert idle.minutes == pytest.approx(28, abs=0.5) and idle.guard_minutes == 20
    assert _said(memory, store, ledger, now + 60) == []
    event = {"seq": 1, "ts": now + 120, "event": "step", "step": 5}
    mirror = store.runs_dir / run_id / "events.jsonl"
    mirror.write_text(json.dumps(event) + "\n")  # the trainer moved again: mirrored here at now + 120
    os.utime(mirror, (now + 120, now + 120))
    assert _said(memory, store, ledger, now + 300) == [], "moving again ends the spell"
    [again] = _said(memory, store, ledger, now + 120 + 11 * 60)
    assert again.kind is NoticeKind.IDLE and again.minutes == pytest.approx(11, abs=0.5)


def test_transfer_bytes_moving_count_as_activity_not_idleness() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    now = time.time()
    run_id = _live_rented_run(store, ledger, now - 30 * 60, budget=0)
    mark_activity(store.runs_dir / run_id, now - 60)  # an upload or a pull moved bytes a minute ago
    assert _said(memory, store, ledger, now) == [], "a long transfer is work"


def test_an_absurd_event_time_never_decides_idleness() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    now = time.time()
    run_id = _live_rented_run(store, ledger, now - 30 * 60, budget=0)
    mirror = store.runs_dir / run_id / "events.jsonl"
    mirror.write_text('{"seq": 1, "ts": 1e300, "event": "step", "step": 5}\n')
    os.utime(mirror, (now - 40 * 60, now - 40 * 60))
    [idle] = _said(memory, store, ledger, now)
    assert idle.kind is NoticeKind.IDLE and idle.minutes == pytest.approx(28, abs=0.5), "1e300 changed nothing"


def test_orphans_are_announced_once_per_set() -> None:
    store, ledger, memory = RunStore(), Ledger(), NoticeMemory(None)
    orphan = Instance(ProviderName.VAST, "v-9", "rentune-20200101-000000-dead", InstanceState.RUNNING, 0.4, "RTX 3090")
    [notice] = _said(memory, store, ledger, time.time(), orphans=[orphan])
    assert (notice.kind, notice.count, notice.usd) == (NoticeKind.ORPHANS, 1, 0.4)
    assert _said(memory, store, ledger, time.time(), orphans=[orphan]) == []
    other = Instance(ProviderName.RUNPOD, "p-2", "rentune-20200101-000000-beef", InstanceState.STARTING, 0.7)
    [both] = _said(memory, store, ledger, time.time(), orphans=[orphan, other])
    assert both.count == 2 and both.usd == pytest.approx(1.1)


def test_runs_that_end_are_announced_but_not_those_ended_before_the_first_look(tmp_path: Path) -> None:
    store, ledger = RunStore(), Ledger()
    old = store.create({"base_model": "old"}, "ssh://me@box:22")
    store.transition(old.id, RunState.CONNECTING)
    store.transition(old.id, RunState.FINISHED)
    live = store.create({"base_model": "tiny"}, "ssh://me@box:22")
    store.transition(live.id, RunState.TRAINING)
    path = tmp_path / "notices.json"
    memory = NoticeMemory(path)
    assert _said(memory, store, ledger, time.time()) == [], "a run that ended before Rentune looked is not news"
    store.transition(live.id, RunState.FINISHED)
    [done] = _said(memory, store, ledger, time.time())
    assert (done.kind, done.run_id, done.model) == (NoticeKind.FINISHED, live.id, "tiny")
    failing = store.create({"base_model": "tiny"}, "ssh://me@box:22")
    store.transition(failing.id, RunState.TRAINING)
    store.transition(failing.id, RunState.FAILED)
    store.update(failing.id, error="out of memory at step 3")
    [failed] = _said(memory, store, ledger, time.time())
    assert failed.kind is NoticeKind.FAILED and failed.detail == "out of memory at step 3"
    now = time.time()
    store.record_finished(
        {"base_model": "tiny", "trial": {"backend": "cpu"}}, started=now - 60, trained=(now - 50, now)
    )
    assert _said(memory, store, ledger, time.time()) == [], "a trial on this computer shows its own end"
    later = NoticeMemory(path)  # the next start remembers what was said
    assert _said(later, store, ledger, time.time()) == []
    assert later.first_time("explained") and not later.first_time("explained")
    assert not NoticeMemory(path).first_time("explained")
