"""The money ledger: rentals opened and closed, dollars from explicit times, month splits, concurrent writers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from desktop.services.billing.ledger import SCHEMA_VERSION, Ledger, LedgerError, month_bounds

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


def test_default_file_is_in_the_data_folder(rentune_home: Path) -> None:
    assert Ledger().path == rentune_home.resolve() / "data" / "ledger.sqlite"
    assert Ledger().path.is_file()


def test_open_then_close_records_both_times(ledger: Ledger) -> None:
    opened = ledger.open("run-1", "runpod", "pod-a", "RTX 4090", 0.69, started=T0)
    assert opened.running and opened.stopped is None
    assert (opened.run_id, opened.provider, opened.instance_id, opened.gpu) == ("run-1", "runpod", "pod-a", "RTX 4090")
    closed = ledger.close("runpod", "pod-a", stopped=T0 + 3600)
    assert closed is not None and not closed.running
    assert closed.stopped == T0 + 3600
    assert ledger.get("runpod", "pod-a") == closed


def test_close_is_idempotent_and_keeps_the_first_stop(ledger: Ledger) -> None:
    ledger.open("run-1", "vast", "123", "A100", 1.0, started=T0)
    first = ledger.close("vast", "123", stopped=T0 + 60)
    again = ledger.close("vast", "123", stopped=T0 + 7200)
    assert first is not None and again is not None
    assert again.stopped == T0 + 60


def test_close_of_an_unknown_machine_is_none(ledger: Ledger) -> None:
    assert ledger.close("lambda", "nope") is None
    assert ledger.get("lambda", "nope") is None


def test_opening_an_instance_twice_keeps_the_first_record(ledger: Ledger) -> None:
    first = ledger.open("run-1", "runpod", "pod-a", "RTX 4090", 0.69, started=T0)
    second = ledger.open("run-2", "runpod", "pod-a", "H100", 3.0, started=T0 + 100)
    assert second == first
    assert len(ledger.rentals()) == 1


def test_same_instance_id_at_two_providers_is_two_rentals(ledger: Ledger) -> None:
    ledger.open("run-1", "runpod", "42", "A10", 0.5, started=T0)
    ledger.open("run-1", "vast", "42", "A10", 0.4, started=T0)
    assert [r.provider for r in ledger.rentals()] == ["runpod", "vast"]


def test_open_without_a_time_uses_now(ledger: Ledger) -> None:
    before = datetime.now(UTC).timestamp()
    rental = ledger.open("run-1", "runpod", "pod-a", "A10", 0.5)
    assert before - 1 <= rental.started <= datetime.now(UTC).timestamp() + 1


def test_usd_is_price_times_hours(ledger: Ledger) -> None:
    rental = ledger.open("run-1", "runpod", "pod-a", "H100", 2.0, started=T0)
    assert rental.usd(T0 + 1800) == pytest.approx(1.0)  # running: up to now
    closed = ledger.close("runpod", "pod-a", stopped=T0 + 5400)
    assert closed is not None
    assert closed.usd(T0 + 99_999) == pytest.approx(3.0)  # stopped: now no longer counts


def test_a_stop_before_the_start_costs_nothing(ledger: Ledger) -> None:
    ledger.open("run-1", "runpod", "pod-a", "H100", 2.0, started=T0)
    closed = ledger.close("runpod", "pod-a", stopped=T0 - 600)
    assert closed is not None and closed.stopped == T0
    assert closed.usd(T0 + 3600) == 0.0


def test_rentals_filter_by_run_and_running(ledger: Ledger) -> None:
    ledger.open("run-1", "runpod", "a", "A10", 0.5, started=T0)
    ledger.open("run-2", "vast", "b", "A10", 0.5, started=T0 + 1)
    ledger.close("runpod", "a", stopped=T0 + 10)
    assert [r.instance_id for r in ledger.rentals("run-2")] == ["b"]
    assert [r.instance_id for r in ledger.running()] == ["b"]
    assert [r.instance_id for r in ledger.rentals()] == ["a", "b"]


def test_month_bounds_wrap_the_year() -> None:
    assert month_bounds(ts("2026-12-31T23:59:59")) == (ts("2026-12-01T00:00:00"), ts("2027-01-01T00:00:00"))
    assert month_bounds(ts("2027-02-01T00:00:00")) == (ts("2027-02-01T00:00:00"), ts("2027-03-01T00:00:00"))


def test_summary_splits_a_rental_at_the_month_boundary(ledger: Ledger) -> None:
    ledger.open("run-1", "runpod", "a", "A10", 1.0, started=ts("2026-11-30T23:00:00"))
    ledger.close("runpod", "a", stopped=ts("2026-12-01T01:00:00"))  # 1 h in November, 1 h in December
    ledger.open("run-2", "vast", "b", "H100", 2.0, started=ts("2026-10-01T00:00:00"))
    ledger.close("vast", "b", stopped=ts("2026-10-01T03:00:00"))  # all in October
    ledger.open("run-3", "lambda", "c", "A100", 1.5, started=ts("2026-11-30T22:00:00"))  # still running
    summary = ledger.summary(now=ts("2026-12-01T04:00:00"))
    assert summary.total_usd == pytest.approx(2.0 + 6.0 + 1.5 * 6)
    assert summary.month_usd == pytest.approx(1.0 + 1.5 * 4)
    assert [r.instance_id for r in summary.rentals] == ["b", "c", "a"]
    assert [r.instance_id for r in summary.running] == ["c"]
    assert summary.now == ts("2026-12-01T04:00:00")


def test_summary_of_an_empty_ledger_is_zero(ledger: Ledger) -> None:
    summary = ledger.summary(now=T0)
    assert (summary.total_usd, summary.month_usd, summary.rentals, summary.running) == (0, 0, (), ())


def test_schema_version_and_wal(ledger: Ledger) -> None:
    with sqlite3.connect(ledger.path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    ledger.open("run-1", "runpod", "a", "A10", 0.5, started=T0)
    assert Ledger(ledger.path).rentals() == ledger.rentals(), "reopening keeps the rows"


V2_TABLE = """CREATE TABLE rentals (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, provider TEXT NOT NULL, instance_id TEXT, gpu TEXT NOT NULL,
    price_per_hour REAL NOT NULL, started REAL NOT NULL, stopped REAL, label TEXT NOT NULL DEFAULT '',
    offer_id TEXT NOT NULL DEFAULT '', state TEXT NOT NULL DEFAULT 'live', end_estimated INTEGER NOT NULL DEFAULT 0,
    stop_sent REAL, UNIQUE (provider, instance_id))"""


def test_a_ledger_of_the_previous_schema_keeps_its_rentals(tmp_path: Path) -> None:
    """Schema 2 (before clusters had a row per machine) is brought to this version in place; nothing is lost."""
    path = tmp_path / "ledger.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(V2_TABLE)
        db.execute(
            "INSERT INTO rentals (run_id, provider, instance_id, gpu, price_per_hour, started, stopped, state) "
            "VALUES ('run-1', 'runpod', 'pod-1', 'A10', 0.5, ?, ?, 'ended')",
            (T0, T0 + 7200),
        )
        db.execute("PRAGMA user_version = 2")
    db.close()
    (rental,) = Ledger(path).rentals()
    assert (rental.instance_id, rental.usd(T0 + 9999), rental.cluster, rental.machine_id) == (
        "pod-1",
        1.0,
        None,
        "pod-1",
    )
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    db.close()


def test_a_ledger_from_a_newer_rentune_is_refused(ledger: Ledger) -> None:
    with sqlite3.connect(ledger.path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(LedgerError, match="newer Rentune"):
        Ledger(ledger.path)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match=r"ledger\.sqlite cannot be used"):
        Ledger(path)


def test_threads_write_at_once(ledger: Ledger) -> None:
    def rent(worker: int) -> None:
        for i in range(20):
            ledger.open(f"run-{worker}", "runpod", f"{worker}-{i}", "A10", 0.5, started=T0 + i)
            ledger.close("runpod", f"{worker}-{i}", stopped=T0 + i + 3600)

    threads = [threading.Thread(target=rent, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rentals = ledger.rentals()
    assert len(rentals) == 120 and not ledger.running()
    assert ledger.summary(now=T0).total_usd == pytest.approx(120 * 0.5)


_WRITER = """
import sys
from pathlib import Path
from desktop.services.billing.ledger import Ledger
ledger = Ledger(Path(sys.argv[1]))
for i in range(40):
    ledger.open(sys.argv[2], sys.argv[2], str(i), "A10", 1.0, started=1.0)
    ledger.close(sys.argv[2], str(i), stopped=3601.0)
"""


def test_two_processes_write_at_once(ledger: Ledger) -> None:
    root = Path(__file__).resolve().parents[2]
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(ledger.path), name], cwd=root, stderr=subprocess.PIPE)
        for name in ("runpod", "vast")
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err.decode()
    assert len(ledger.rentals()) == 80 and not ledger.running()
    assert ledger.summary(now=0).total_usd == pytest.approx(80.0)


def test_many_openers_of_a_new_ledger_at_once_all_succeed(tmp_path: Path) -> None:
    """The app's background settle, its pages and the CLI open the ledger together; none may see "locked"."""
    path = tmp_path / "ledger.sqlite"
    with ThreadPoolExecutor(max_workers=8) as pool:
        ledgers = list(pool.map(lambda _: Ledger(path), range(16)))
    ledgers[0].open("r1", "runpod", "pod-1", "A100", 1.0, started=0.0)
    assert [r.instance_id for r in ledgers[-1].rentals()] == ["pod-1"]
