"""``rentune costs`` and ``rentune keys``, run through the real entry point as a user would type them."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import desktop.cli.keys as keys_cli
import desktop.services.billing.ledger as ledger_module
import desktop.services.billing.spend as spend_module
from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.core.settings import RentOrBuyChoice, Settings
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.spend import OWN_SERVER, spend_overview
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.platform.settings import save_settings
from desktop.services.providers.base import AuthError, ProviderError, ProviderName
from desktop.services.providers.registry import PROVIDERS
from desktop.services.runs.store import RunStore
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.recorded_costs import seed_spending
from tests.fixtures.recorded_run import backdate

KEY = "rpa_TESTKEY_0123456789abcdef"


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- rentune costs --------------------------------------------------------------------------------------------------


@pytest.fixture
def filled_ledger(monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """Three rentals (one in November, one closed and one running in December), read at 2026-12-01T08:00:00Z."""
    ledger = Ledger()
    ledger.open("run-n", "lambda", "l-1", "A100", 1.29, started=ts("2026-11-20T00:00:00"))
    ledger.close("lambda", "l-1", stopped=ts("2026-11-20T10:00:00"))
    ledger.open("run-a", "runpod", "pod-1", "RTX 4090", 0.69, started=ts("2026-12-01T03:52:10"))
    ledger.close("runpod", "pod-1", stopped=ts("2026-12-01T05:52:10"))
    ledger.open("run-b", "vast", "v-1", "RTX 4090", 1.5, started=ts("2026-12-01T06:00:00"))
    clock = SimpleNamespace(time=lambda: ts("2026-12-01T08:00:00"))
    monkeypatch.setattr(ledger_module, "time", clock)
    monkeypatch.setattr(spend_module, "time", clock)
    return ledger


def test_costs_json_is_exactly_the_documented_object(filled_ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "costs", "--json")
    assert code == 0
    vast = {
        "run_id": "run-b",
        "provider": "vast",
        "instance_id": "v-1",
        "gpu": "RTX 4090",
        "price_per_hour": 1.5,
        "started": "2026-12-01T06:00:00Z",
        "stopped": None,
        "state": "live",
        "end_estimated": False,
        "usd": pytest.approx(3.0),
    }
    assert json.loads(out) == {
        "total_usd": pytest.approx(17.28),
        "month_usd": pytest.approx(4.38),
        "today_usd": pytest.approx(4.38),
        "billing_per_hour": 1.5,
        "rentals": [
            {
                "run_id": "run-n",
                "provider": "lambda",
                "instance_id": "l-1",
                "gpu": "A100",
                "price_per_hour": 1.29,
                "started": "2026-11-20T00:00:00Z",
                "stopped": "2026-11-20T10:00:00Z",
                "state": "ended",
                "end_estimated": False,
                "usd": pytest.approx(12.9),
            },
            {
                "run_id": "run-a",
                "provider": "runpod",
                "instance_id": "pod-1",
                "gpu": "RTX 4090",
                "price_per_hour": 0.69,
                "started": "2026-12-01T03:52:10Z",
                "stopped": "2026-12-01T05:52:10Z",
                "state": "ended",
                "end_estimated": False,
                "usd": pytest.approx(1.38),
            },
            vast,
        ],
        "running": [vast],
    }


def test_costs_json_carries_dollars_unrounded_and_marks_estimated_ends(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger()
    ledger.open("run-c", "runpod", "pod-2", "RTX 4090", 0.74, started=ts("2026-12-01T03:00:00"))
    ledger.close("runpod", "pod-2", stopped=ts("2026-12-01T03:00:36"), estimated=True)  # 36 s: $0.0074, seen gone
    ledger.open("run-c", "runpod", "pod-3", "RTX 4090", 0.74, started=ts("2026-12-01T04:00:00"))
    ledger.close("runpod", "pod-3", stopped=ts("2026-12-01T04:00:36"), estimated=False)  # the provider's own end
    code, out, _ = run(capsys, "costs", "--json")
    assert code == 0
    estimated, exact = json.loads(out)["rentals"]
    assert estimated["usd"] == pytest.approx(0.0074, rel=1e-9) and estimated["end_estimated"] is True
    assert exact["end_estimated"] is False
    _, out, _ = run(capsys, "costs")
    assert "2026-12-01T03:00:36Z (est.)" in out and "0.01" in out, "rounded only where a person reads it"


def test_costs_text_has_the_table_totals_and_a_warning_per_running_machine(
    filled_ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "costs")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "PROVIDER", "INSTANCE", "GPU", "$/H", "STARTED", "STOPPED", "DOLLARS"]
    assert lines[2].split() == [
        "run-a", "RunPod", "pod-1", "RTX", "4090", "0.69", "2026-12-01T03:52:10Z", "2026-12-01T05:52:10Z", "1.38"
    ]  # fmt: skip
    assert lines[3].split()[-2:] == ["running", "3.00"]
    assert "total $17.28, this month $4.38, today $4.38, billing $1.50/h now" in lines
    assert lines[-1] == (
        "still running: Vast.ai instance v-1 (RTX 4090) of run run-b at $1.50/h, $3.00 so far; "
        "rentune stop run-b ends it"
    )


def test_costs_are_the_costs_pages_sums_own_servers_included(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI and the app's Costs page and tray give the same cents: rented machines and own servers alike."""
    now = ts("2026-12-01T08:00:00")
    seed_spending(now=now)
    clock = SimpleNamespace(time=lambda: now)
    monkeypatch.setattr(ledger_module, "time", clock)
    monkeypatch.setattr(spend_module, "time", clock)
    overview = spend_overview(RunStore(), now=now)
    answer = json.loads(run(capsys, "costs", "--json")[1])
    assert answer["total_usd"] == pytest.approx(overview.total_usd) and overview.total_usd > 0
    assert answer["month_usd"] == pytest.approx(overview.month_usd)
    assert answer["today_usd"] == pytest.approx(overview.today_usd)
    assert answer["billing_per_hour"] == pytest.approx(overview.burn_per_hour)
    own = [line for line in answer["rentals"] if line["provider"] == OWN_SERVER]
    assert own and all(line["instance_id"] == "" for line in own)
    assert sum(line["usd"] for line in answer["rentals"]) == pytest.approx(answer["total_usd"]), "unrounded: sums agree"
    text = run(capsys, "costs")[1]
    assert "Your server" in text and f"total ${overview.total_usd:.2f}," in text


def test_costs_of_an_empty_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "costs")[1] == "no rentals yet\n"
    assert json.loads(run(capsys, "costs", "--json")[1]) == {
        "total_usd": 0,
        "month_usd": 0,
        "today_usd": 0,
        "billing_per_hour": 0,
        "rentals": [],
        "running": [],
    }


def test_costs_with_an_unreadable_ledger_is_one_line(rentune_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (rentune_home / "data").mkdir(parents=True)
    (rentune_home / "data" / "ledger.sqlite").write_bytes(b"not a database" * 200)
    code, out, err = run(capsys, "costs")
    assert code == 1 and out == ""
    assert err.startswith("rentune: error: the ledger ") and "ledger.sqlite cannot be used" in err
    assert len(err.splitlines()) == 1


def test_costs_with_an_unreadable_run_database_is_one_line(
    rentune_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (rentune_home / "data").mkdir(parents=True)
    (rentune_home / "data" / "runs.db").write_bytes(b"not a database" * 200)
    code, out, err = run(capsys, "costs")
    assert code == 1 and out == ""
    assert err.startswith("rentune: error: the run database ") and "move it aside" in err
    assert len(err.splitlines()) == 1


def test_the_bill_by_phase_of_an_unknown_run_or_one_that_rented_nothing_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for unknown in ("20990101-nothing", ""):
        code, out, err = run(capsys, "costs", "--run", unknown)
        assert code == 2 and out == "" and "no run matches" in err and "see rentune runs" in err
    own = RunStore().create({"base_model": "x"}, "ssh://me@gpu-box:22")
    code, out, err = run(capsys, "costs", "--run", own.id, "--json")
    assert code == 2 and out == ""
    assert f"run {own.id} rented no machine" in err and "rentune costs lists it" in err


def test_the_bill_by_phase_is_the_ledgers_dollars_split_by_the_runs_history(
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = RunStore()
    record = store.create({"base_model": "x"}, None)
    for state in ("provisioning", "connecting", "uploading", "bootstrapping", "training"):
        store.transition(record.id, RunState(state))
    Ledger().open(record.id, "runpod", "pod-9", "RTX 4090", 0.69, started=time.time() - 60)
    bill = json.loads(run(capsys, "costs", "--run", record.id, "--json")[1])
    assert [phase["phase"] for phase in bill["phases"]][:3] == [
        "waiting for the machine",
        "setup and upload",
        "training",
    ]
    assert bill["usd"] == pytest.approx(sum(phase["usd"] for phase in bill["phases"]))
    assert bill["usd"] == pytest.approx(0.69 / 60, rel=0.05), "a minute of a machine still running, billed to now"
    text = run(capsys, "costs", "--run", record.id)[1]
    assert text.startswith(f"run {record.id}: $0.01 in all") and "training" in text


def test_rent_or_buy_weighs_the_last_90_days_against_a_card_with_the_saved_figures_and_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "costs", "--rent-or-buy")
    assert code == 2 and out == "" and "no rented training in the last 90 days" in err and "--hours H" in err
    store = RunStore()
    record = store.create({"base_model": "x"}, None)
    store.transition(record.id, RunState.PROVISIONING)
    store.transition(record.id, RunState.TRAINING)
    hour_ago = time.time() - 3600
    backdate(store, record.id, [hour_ago - 1, hour_ago, hour_ago])
    Ledger().open(record.id, "runpod", "pod-7", "H100 SXM", 3.0, started=hour_ago)
    save_settings(Settings(rent_or_buy=RentOrBuyChoice(card="rtx5090", kwh_usd=0.5)))
    code, out, _ = run(capsys, "costs", "--rent-or-buy", "--json", "--price", "1500")
    weighed = json.loads(out)
    assert code == 0 and weighed["owned"]["card"] == "rtx5090" and weighed["owned"]["kwh_usd"] == 0.5
    assert weighed["owned"]["price_usd"] == 1500 and weighed["rented"]["gpus"] == ["H100 SXM"]
    assert weighed["rented"]["usd_per_training_hour"] == pytest.approx(3.0, rel=0.01), "an hour, all of it training"
    assert weighed["hours_per_year"] == pytest.approx(365 / 90, rel=0.01)
    text = run(capsys, "costs", "--rent-or-buy", "--card", "RTX4090", "--hours", "1000")[1]
    assert text.startswith("Rent or buy: owning an RTX 4090 against renting H100 SXM")
    assert "1,000 h of training a year at $3.00 per training hour (paid idle included)" in text
    assert "break-even at" in text and "the RTX 4090 has 24 GB" in text
    code, out, err = run(capsys, "costs", "--rent-or-buy", "--resale", "120")
    assert code == 2 and "--resale input should be less than or equal to 100" in err


# -- rentune keys ---------------------------------------------------------------------------------------------------


class FakeCheck:
    """A key check that records what it was given and answers as told."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[ProviderName, str]] = []

    async def __call__(self, name: ProviderName, key: str) -> None:
        self.calls.append((name, key))
        if self.error is not None:
            raise self.error


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> Any:
    def feed(text: str) -> None:
        monkeypatch.setattr("sys.stdin", io.StringIO(text))

    return feed


def use_check(monkeypatch: pytest.MonkeyPatch, check: FakeCheck) -> FakeCheck:
    monkeypatch.setattr(keys_cli, "check_api_key", check)
    return check


def test_set_reads_stdin_checks_then_stores(
    monkeypatch: pytest.MonkeyPatch, stdin: Any, memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    check = use_check(monkeypatch, FakeCheck())
    stdin(f"  {KEY}  \n")
    code, out, err = run(capsys, "keys", "set", "runpod")
    assert code == 0, err
    assert check.calls == [(ProviderName.RUNPOD, KEY)]
    assert memory_keyring.passwords == {("rentune", "runpod"): KEY}
    assert out == "stored the RunPod API key in the keyring (checked with RunPod)\n"
    assert KEY not in out + err


def test_set_on_a_terminal_asks_with_a_hidden_prompt(
    monkeypatch: pytest.MonkeyPatch, memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    use_check(monkeypatch, FakeCheck())
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: True))
    prompts: list[str] = []

    def getpass(prompt: str) -> str:
        prompts.append(prompt)
        return KEY

    monkeypatch.setattr("getpass.getpass", getpass)
    assert run(capsys, "keys", "set", "Lambda")[0] == 0
    assert prompts == ["Lambda Cloud API key: "]
    assert memory_keyring.passwords == {("rentune", "lambda"): KEY}


def test_a_refused_key_is_not_stored(
    monkeypatch: pytest.MonkeyPatch, stdin: Any, memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = AuthError(ProviderName.RUNPOD, "the API key was refused (401 Unauthorized); ...", "401 Unauthorized")
    use_check(monkeypatch, FakeCheck(refused))
    stdin(KEY + "\n")
    code, out, err = run(capsys, "keys", "set", "runpod")
    assert code == 1 and out == ""
    assert err.startswith(
        "rentune: error: RunPod refused this RunPod API key (401 Unauthorized); nothing was stored; copy the key "
        "again from https://"
    )
    assert memory_keyring.passwords == {}
    assert KEY not in err


def test_an_unreachable_provider_stores_nothing_and_says_how_to_retry(
    monkeypatch: pytest.MonkeyPatch, stdin: Any, memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    use_check(monkeypatch, FakeCheck(ProviderError(ProviderName.VAST, "no answer in time from https://x")))
    stdin(KEY)
    code, _, err = run(capsys, "keys", "set", "vast")
    assert code == 1
    assert "cannot check the Vast.ai API key: Vast.ai did not answer (no answer in time from https://x)" in err
    assert "nothing was stored; run rentune keys set vast again" in err
    assert memory_keyring.passwords == {}


def test_an_empty_key_is_a_usage_error_and_checks_nothing(
    monkeypatch: pytest.MonkeyPatch, stdin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    check = use_check(monkeypatch, FakeCheck())
    stdin("   \n")
    code, _, err = run(capsys, "keys", "set", "vast")
    assert code == 2
    assert "no Vast.ai API key given" in err and "rentune keys set vast < key.txt" in err
    assert check.calls == []


def test_an_unknown_provider_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["keys", "set", "azure"])
    assert exited.value.code == 2
    assert "invalid choice: 'azure'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("provider", "fixture", "suffix"),
    [("runpod", "fake_runpod", ""), ("vast", "fake_vast", "/api/v0"), ("lambda", "fake_lambda", "/api/v1")],
)
def test_set_checks_the_key_with_the_provider_itself(
    provider: str,
    fixture: str,
    suffix: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    stdin: Any,
    memory_keyring: MemoryKeyring,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Against the fake clouds: a key they refuse is not stored, the one they accept is."""
    fake = request.getfixturevalue(fixture)
    info = PROVIDERS[ProviderName(provider)]
    monkeypatch.setenv(info.url_env, fake.serve() + suffix)
    stdin("not-the-key\n")
    code, out, err = run(capsys, "keys", "set", provider)
    assert code == 1 and "refused" in err and "nothing was stored" in err and "not-the-key" not in out + err
    assert memory_keyring.passwords == {}
    stdin(fake.valid_key + "\n")
    code, out, err = run(capsys, "keys", "set", provider)
    assert code == 0, err
    assert memory_keyring.passwords == {("rentune", info.secret.value): fake.valid_key}
    assert fake.valid_key not in out + err


def test_list_says_where_each_key_comes_from_and_never_prints_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    SecretStore().set(SecretName.RUNPOD, KEY)
    monkeypatch.setenv("VAST_API_KEY", "vast-env-secret-value")
    code, out, err = run(capsys, "keys", "list")
    assert code == 0
    assert out.splitlines() == [
        "RunPod API key            keyring",
        "Vast.ai API key           environment VAST_API_KEY",
        "Lambda Cloud API key      missing: rentune keys set lambda",
        "Hugging Face token        missing: rentune keys set huggingface, save it on the Settings page or set HF_TOKEN",
        "Weights & Biases API key  missing: rentune keys set wandb, save it on the Settings page or set WANDB_API_KEY",
        "Bucket access key ID      missing: rentune keys set bucket-key-id, save it on the Settings page or set "
        "RENTUNE_BUCKET_KEY_ID",
        "Bucket secret key         missing: rentune keys set bucket-secret, save it on the Settings page or set "
        "RENTUNE_BUCKET_SECRET",
    ]
    code, out_json, err_json = run(capsys, "keys", "list", "--json")
    assert [(row["name"], row["source"]) for row in json.loads(out_json)] == [
        ("runpod", "keyring"),
        ("vast", "environment"),
        ("lambda", "missing"),
        ("huggingface", "missing"),
        ("wandb", "missing"),
        ("bucket-key-id", "missing"),
        ("bucket-secret", "missing"),
    ]
    everything = out + err + out_json + err_json
    assert KEY not in everything and "vast-env-secret-value" not in everything


def test_a_wandb_key_is_stored_from_stdin_as_it_is_and_removed_again(
    memory_keyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "local-" + "7" * 48
    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    code, out, err = run(capsys, "keys", "set", "wandb")
    assert code == 0, err
    assert memory_keyring.passwords == {("rentune", "wandb"): key} and key not in out + err
    assert "stored the Weights & Biases API key in the keyring (W&B checks it when a run" in out
    code, out, err = run(capsys, "keys", "delete", "wandb")
    assert code == 0 and memory_keyring.passwords == {} and "removed the Weights & Biases API key" in out


def test_delete_removes_the_key(memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]) -> None:
    SecretStore().set(SecretName.LAMBDA, KEY)
    assert run(capsys, "keys", "delete", "lambda")[:2] == (0, "removed the Lambda Cloud API key from the keyring\n")
    assert memory_keyring.passwords == {}
    assert (
        run(capsys, "keys", "delete", "lambda")[1] == "no Lambda Cloud API key was in the keyring; nothing to remove\n"
    )


def test_delete_notes_the_environment_still_provides_one(
    monkeypatch: pytest.MonkeyPatch, memory_keyring: MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    SecretStore().set(SecretName.RUNPOD, KEY)
    monkeypatch.setenv("RUNPOD_API_KEY", "env-value")
    code, out, _ = run(capsys, "keys", "delete", "runpod")
    assert code == 0 and memory_keyring.passwords == {}
    assert "RUNPOD_API_KEY in the environment still provides one; unset it to stop using it" in out
