"""``rentune offers`` and ``rentune machines``: JSON keys and order, the table, notes, missing keys, and orphans
(a live run's machine kept; an ended, failed or unknown run's ``rentune-*`` machine stopped; the user's own never
touched), on in-memory providers, then end to end on the three fake clouds served over HTTP."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from desktop.cli import main
from desktop.core.runs.labels import machine_label
from desktop.core.runs.states import RunState
from desktop.services.billing.rentals import Rental
from desktop.services.providers.base import AuthError, InstanceState, OfferQuery, ProviderName, RentRequest
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.listing import Unread
from desktop.services.providers.market import OpenProvider, gather_offers
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.renting import orphans
from desktop.services.renting.orphans import burn_rate, list_machines, stop_orphans
from desktop.services.runs.store import RunStore
from tests.fakes.http import FakeCloud
from tests.fakes.lambda_cloud import FakeLambda
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vast import FakeVast
from tests.providers.test_market import MemoryProvider, machine, offer, opener

RUNPOD, VAST, LAMBDA = ProviderName.RUNPOD, ProviderName.VAST, ProviderName.LAMBDA
OFFER_KEYS = [
    "provider",
    "offer_id",
    "gpu",
    "count",
    "nodes",
    "vram_gb",
    "price_per_hour",
    "spot",
    "reliability",
    "location",
    "fits",
    "hours",
    "total_usd",
]


@pytest.fixture
def clouds(monkeypatch: pytest.MonkeyPatch) -> dict[ProviderName, MemoryProvider]:
    """RunPod and Lambda in memory (Vast.ai has no key), wired into both commands."""
    runpod = MemoryProvider(RUNPOD, [offer(RUNPOD, "RTX 4090", 0.69), offer(RUNPOD, "H100 SXM", 2.99, vram=80)])
    lam = MemoryProvider(LAMBDA, [offer(LAMBDA, "A10", 0.75), offer(LAMBDA, "Tesla T4", 0.20, vram=16)])
    open_ = opener(runpod, lam)
    monkeypatch.setattr("desktop.cli.offers.gather_offers", functools.partial(gather_offers, open=open_))
    monkeypatch.setattr("desktop.cli.machines.list_machines", functools.partial(list_machines, open=open_))
    monkeypatch.setattr("desktop.cli.machines.stop_orphans", functools.partial(stop_orphans, open=open_))
    return {RUNPOD: runpod, LAMBDA: lam}


def offers_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main(["offers", *args, "--json"]) == 0
    data: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return data


def test_offers_json_has_exactly_the_documented_keys_cheapest_first(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    offers = offers_json(capsys)
    assert [list(o) for o in offers] == [OFFER_KEYS] * 4
    assert [o["price_per_hour"] for o in offers] == [0.20, 0.69, 0.75, 2.99]
    assert offers[1] == {
        "provider": "runpod",
        "offer_id": "runpod:RTX 4090:0.69",
        "gpu": "RTX 4090",
        "count": 1,
        "nodes": 1,
        "vram_gb": 24,
        "price_per_hour": 0.69,
        "spot": False,
        "reliability": None,
        "location": "EU",
        "fits": None,
        "hours": None,
        "total_usd": None,
    }


def test_offers_with_a_model_put_what_fits_first_cheapest_total_first(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    offers = offers_json(capsys, "--model", "qwen2.5-14b", "--tokens", "5000000", "--epochs", "1")
    assert [(o["gpu"], o["fits"]) for o in offers] == [
        ("RTX 4090", "fits"),
        ("H100 SXM", "fits"),
        ("A10", "tight"),
        ("Tesla T4", "no"),
    ]
    fitting = [o for o in offers if o["fits"] != "no"]
    assert [o["total_usd"] for o in fitting] == sorted(o["total_usd"] for o in fitting)  # type: ignore[type-var]
    assert (offers[3]["hours"], offers[3]["total_usd"]) == (None, None)  # a T4 is not in the catalog


def test_offers_filters_reach_the_providers(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    offers = offers_json(capsys, "--provider", "runpod", "--min-vram", "40")
    assert [o["gpu"] for o in offers] == ["H100 SXM"]


def test_offers_table_is_aligned_and_notes_go_to_stderr(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["offers", "--model", "qwen2.5-14b"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == [
        "PROVIDER",
        "GPU",
        "VRAM",
        "$/H",
        "SPOT",
        "RELIABILITY",
        "LOCATION",
        "FIT",
        "HOURS",
        "TOTAL",
    ]
    assert lines[1].split()[:5] == ["RunPod", "H100", "SXM", "x1", "80"]  # 4 h at $2.99 beat 18 h at $0.69
    assert lines[1].split()[-3:] == ["fits", "4.0", "$12.05"]
    assert len({line.index("$") for line in lines[1:]}) == 1  # the price column lines up
    assert err == "Vast.ai skipped: no API key; rentune keys set vast\n"


def test_no_offers_says_which_filter_to_relax(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["offers", "--max-price", "0.1", "--gpus", "2"]) == 0
    out, _ = capsys.readouterr()
    assert out == "no offers match --gpus 2 --max-price 0.1; relax --gpus 2 or --max-price 0.1\n"


def test_a_failing_provider_is_a_note_not_a_failure(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    clouds[LAMBDA].failure = AuthError(LAMBDA, "the API key was refused (invalid key); set a valid key")
    assert main(["offers", "--json"]) == 0
    out, err = capsys.readouterr()
    assert {o["provider"] for o in json.loads(out)} == {"runpod"}
    assert "Lambda skipped: the API key was refused (invalid key); set a valid key\n" in err


def test_offers_without_any_key_say_how_to_add_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["offers"]) == 1
    assert (
        capsys.readouterr().err == "rentune: error: no API key for any provider; add one with rentune keys set runpod\n"
    )
    assert main(["offers", "--provider", "vast"]) == 1
    assert capsys.readouterr().err == "rentune: error: no API key for Vast.ai; add one with rentune keys set vast\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "0"], "--gpus 0 is out of range"),
        (["--max-price", "-1"], "--max-price -1 must be above 0"),
        (["--model", "qwen2.5-7b", "--seq-len", "1"], "--seq-len 1 is out of range"),
        (["--model", "no-such-model-at-all"], "no-such-model-at-all"),
    ],
)
def test_bad_offer_flags_are_one_line(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["offers", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


# -- machines and orphans ---------------------------------------------------------------------------------------


def run_in(store: RunStore, *states: RunState) -> str:
    """A run moved through ``states``; returns its id."""
    run_id = store.create({"name": "test"}, None).id
    for state in states:
        store.transition(run_id, state)
    return run_id


@pytest.fixture
def fleet(clouds: dict[ProviderName, MemoryProvider]) -> dict[str, str]:
    """Machines of a live run, an ended run, a failed run, an unknown run, and the user's own; returns run ids."""
    store = RunStore()
    live = run_in(store, RunState.PROVISIONING, RunState.TRAINING)
    ended = run_in(store, RunState.PROVISIONING, RunState.FINISHED)
    failed = run_in(store, RunState.PROVISIONING, RunState.FAILED)
    clouds[RUNPOD].machines = [
        machine(RUNPOD, "pod-live", f"rentune-{live}", InstanceState.RUNNING, 0.69),
        machine(RUNPOD, "pod-ended", f"rentune-{ended}", InstanceState.RUNNING, 2.99),
        machine(RUNPOD, "pod-mine", "my-notebook", InstanceState.RUNNING, 0.44),
        machine(RUNPOD, "pod-gone", "rentune-19990101-000000-dead", InstanceState.TERMINATED, 1.0),
    ]
    clouds[LAMBDA].machines = [
        machine(LAMBDA, "i-failed", f"rentune-{failed}", InstanceState.STOPPED, 0.75),
        machine(LAMBDA, "i-unknown", "rentune-20200101-000000-beef", InstanceState.STARTING, 1.29),
    ]
    return {"live": live, "ended": ended, "failed": failed}


async def test_orphans_are_rentune_machines_no_live_run_owns(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str]
) -> None:
    report = await list_machines(RunStore(), None, list(ProviderName), open=opener(*clouds.values()))
    owners = {m.instance.instance_id: (m.run_id, m.orphan) for m in report.machines}
    assert owners == {
        "pod-live": (fleet["live"], False),
        "pod-ended": (None, True),
        "pod-mine": (None, False),
        "pod-gone": (None, False),  # terminated: nothing left to stop
        "i-failed": (None, True),
        "i-unknown": (None, True),
    }
    assert burn_rate(report) == pytest.approx(2.99 + 1.29)  # the stopped one bills no GPU
    assert report.notes == ["Vast.ai skipped: no API key; rentune keys set vast"]


async def test_stopping_orphans_rechecks_the_runs(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str]
) -> None:
    store = RunStore()
    report = await list_machines(store, None, list(ProviderName), open=opener(*clouds.values()))
    store.transition(fleet["live"], RunState.CANCELLED)  # ends after the listing, where it was no orphan: kept
    stopped, failures = await stop_orphans(store, report, None, open=opener(*clouds.values()))
    assert sorted(i.instance_id for i in stopped) == ["i-failed", "i-unknown", "pod-ended"]
    assert failures == []
    assert clouds[RUNPOD].terminated == ["pod-ended"] and sorted(clouds[LAMBDA].terminated) == ["i-failed", "i-unknown"]


async def test_a_run_that_came_alive_keeps_its_machine(clouds: dict[ProviderName, MemoryProvider]) -> None:
    store = RunStore()
    run_id = run_in(store)  # planned: live
    clouds[RUNPOD].machines = [machine(RUNPOD, "pod-1", f"rentune-{run_id}-x", InstanceState.RUNNING, 1.0)]
    report = await list_machines(store, None, [RUNPOD], open=opener(*clouds.values()))
    assert [m.orphan for m in report.machines] == [False]  # not a name Rentune gives: the user's own, never touched
    clouds[RUNPOD].machines = [machine(RUNPOD, "pod-1", f"rentune-{run_id}", InstanceState.RUNNING, 1.0)]
    orphaned = orphans.MachinesReport([orphans.Machine(clouds[RUNPOD].machines[0], None, True)], [], [], [RUNPOD])
    stopped, _ = await stop_orphans(store, orphaned, None, open=opener(*clouds.values()))
    assert stopped == [] and clouds[RUNPOD].terminated == []


async def test_a_machine_the_run_moved_away_from_is_an_orphan(clouds: dict[ProviderName, MemoryProvider]) -> None:
    store = RunStore()
    run_id = run_in(store, RunState.PROVISIONING, RunState.TRAINING)
    now = Rental(RUNPOD, "pod-new", "RTX 4090", 0.69, False, "offer-1", 0.0)
    store.update(run_id, spec={"name": "test", "rental": now.as_dict()})
    clouds[RUNPOD].machines = [
        machine(RUNPOD, "pod-old", f"rentune-{run_id}", InstanceState.RUNNING, 0.69),  # its release had failed
        machine(RUNPOD, "pod-new", f"rentune-{run_id}", InstanceState.RUNNING, 0.69),
    ]
    report = await list_machines(store, None, [RUNPOD], open=opener(*clouds.values()))
    assert {m.instance.instance_id: (m.run_id, m.orphan) for m in report.machines} == {
        "pod-old": (None, True),
        "pod-new": (run_id, False),
    }


def test_machines_json(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["machines", "--json"]) == 0
    machines = json.loads(capsys.readouterr().out)
    assert [list(m) for m in machines] == [
        ["provider", "instance_id", "name", "state", "price_per_hour", "run_id", "orphan", "other_computer"]
    ] * 6
    live = next(m for m in machines if m["instance_id"] == "pod-live")
    assert live == {
        "provider": "runpod",
        "instance_id": "pod-live",
        "name": f"rentune-{fleet['live']}",
        "state": "running",
        "price_per_hour": 0.69,
        "run_id": fleet["live"],
        "orphan": False,
        "other_computer": False,
    }


async def test_another_computers_machines_are_never_orphans_unless_asked(
    clouds: dict[ProviderName, MemoryProvider],
) -> None:
    from desktop.services.platform.settings import installation_id

    store = RunStore()
    mine, theirs = installation_id(), "feedbeef"
    assert mine != theirs
    ended = run_in(store, RunState.PROVISIONING, RunState.FINISHED)
    clouds[RUNPOD].machines = [
        machine(RUNPOD, "pod-theirs", f"rentune-{theirs}-20261201-101010-abcd", InstanceState.RUNNING, 2.0),
        machine(RUNPOD, "pod-mine", f"rentune-{mine}-{ended}", InstanceState.RUNNING, 0.5),
    ]
    report = await list_machines(store, None, [RUNPOD], open=opener(*clouds.values()))
    assert [m.instance.instance_id for m in report.orphans] == ["pod-mine"]
    assert [m.instance.instance_id for m in report.other_computers] == ["pod-theirs"]
    assert orphans.other_computers_rate(report) == 2.0
    stopped, _ = await stop_orphans(store, report, None, open=opener(*clouds.values()))
    assert [i.instance_id for i in stopped] == ["pod-mine"] and clouds[RUNPOD].terminated == ["pod-mine"]
    report = await list_machines(store, None, [RUNPOD], open=opener(*clouds.values()))
    stopped, _ = await stop_orphans(store, report, None, open=opener(*clouds.values()), include_other_computers=True)
    assert [i.instance_id for i in stopped] == ["pod-theirs"]


async def test_stopping_an_orphan_closes_its_ledger_row(clouds: dict[ProviderName, MemoryProvider]) -> None:
    from desktop.services.billing.ledger import Ledger, RentalState

    store = RunStore()
    ended = run_in(store, RunState.PROVISIONING, RunState.FINISHED)
    clouds[RUNPOD].machines = [machine(RUNPOD, "pod-left", f"rentune-{ended}", InstanceState.RUNNING, 1.0)]
    Ledger().open(ended, "runpod", "pod-left", "RTX 4090", 1.0, started=1_800_000_000.0)
    report = await list_machines(store, None, [RUNPOD], open=opener(*clouds.values()))
    await stop_orphans(store, report, None, open=opener(*clouds.values()))
    row = Ledger().get("runpod", "pod-left")
    assert row is not None and row.state is RentalState.ENDED and not row.running


async def test_a_slow_provider_leaves_out_only_itself(clouds: dict[ProviderName, MemoryProvider]) -> None:
    store = RunStore()
    ended = run_in(store, RunState.PROVISIONING, RunState.FINISHED)
    clouds[RUNPOD].machines = [machine(RUNPOD, "pod-left", f"rentune-{ended}", InstanceState.RUNNING, 1.0)]
    clouds[LAMBDA].delay = 5.0
    report = await list_machines(store, None, [RUNPOD, LAMBDA], open=opener(*clouds.values()), limit_s=0.3)
    assert [m.instance.instance_id for m in report.orphans] == ["pod-left"]
    assert any("Lambda skipped: no answer in 0.3 s" in note for note in report.notes)


def test_machines_table_warns_of_orphans(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["machines"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["PROVIDER", "ID", "NAME", "STATE", "$/H", "RUN"]
    assert len(lines) == 8
    assert lines[-1] == "3 orphaned machines burn $4.28/h: rentune machines --stop-orphans"
    assert any(fleet["live"] in line and line.startswith("RunPod") for line in lines)
    assert "Vast.ai skipped" in err


def test_include_other_computers_alone_is_refused_not_ignored(
    clouds: dict[ProviderName, MemoryProvider], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["machines", "--include-other-computers"]) == 2
    assert "run rentune machines --stop-orphans --include-other-computers" in capsys.readouterr().err
    assert all(not cloud.terminated for cloud in clouds.values())


def test_stop_orphans_says_what_it_stopped(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["machines", "--stop-orphans"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert set(lines[:3]) == {
        f"stopped Lambda rentune-{fleet['failed']} (i-failed), $0.75/h",
        "stopped Lambda rentune-20200101-000000-beef (i-unknown), $1.29/h",
        f"stopped RunPod rentune-{fleet['ended']} (pod-ended), $2.99/h",
    }
    assert lines[3] == "stopped 3 orphaned machines: $4.28/h no longer billed"
    assert "pod-mine" not in clouds[RUNPOD].terminated and "pod-live" not in clouds[RUNPOD].terminated


def test_a_machine_that_cannot_be_stopped_is_named(
    clouds: dict[ProviderName, MemoryProvider], fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    lam = clouds[LAMBDA]
    original = lam.terminate

    async def refuse(instance_id: str) -> None:
        if instance_id == "i-unknown":
            raise AuthError(LAMBDA, "the API key was refused (read-only key)")
        await original(instance_id)

    lam.terminate = refuse  # type: ignore[method-assign]
    assert main(["machines", "--stop-orphans"]) == 1
    out, err = capsys.readouterr()
    assert "stopped 2 orphaned machines: $2.99/h no longer billed" in out
    assert (
        "Lambda: cannot stop rentune-20200101-000000-beef (i-unknown): the API key was refused (read-only key)" in err
    )


def test_machines_without_any_key_say_how_to_add_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["machines"]) == 1
    assert "no API key for any provider; add one with rentune keys set runpod" in capsys.readouterr().err


# -- end to end: the real clients against the fake clouds, served over HTTP ----------------------------------------

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ3bVm4sX9bW0xJ1sQvI6o4kz3wY5b2qfS1lDZ8J8yA rentune-test"


@pytest.fixture
def served(
    fake_runpod: FakeRunPod, fake_vast: FakeVast, fake_lambda: FakeLambda, monkeypatch: pytest.MonkeyPatch
) -> dict[ProviderName, FakeCloud]:
    """The three fake clouds served on loopback, their URLs and keys in the environment; machines never boot."""
    clouds: dict[ProviderName, FakeCloud] = {RUNPOD: fake_runpod, VAST: fake_vast, LAMBDA: fake_lambda}
    for name, cloud, suffix in (
        (RUNPOD, fake_runpod, ""),
        (VAST, fake_vast, "/api/v0"),
        (LAMBDA, fake_lambda, "/api/v1"),
    ):
        cloud.faults.never_ready = True  # listing and stopping need no sshd
        monkeypatch.setenv(PROVIDERS[name].url_env, cloud.serve() + suffix)
        monkeypatch.setenv(PROVIDERS[name].secret.env_var, cloud.valid_key)
    return clouds


def test_offers_of_the_three_clouds_end_to_end(
    served: dict[ProviderName, FakeCloud], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["offers", "--json", "--model", "qwen2.5-7b"]) == 0
    out, err = capsys.readouterr()
    offers = json.loads(out)
    assert err == ""
    assert {o["provider"] for o in offers} == {"runpod", "vast", "lambda"}
    assert all(list(o) == OFFER_KEYS for o in offers)
    assert not any(o["gpu"] == "A100" and o["count"] == 8 for o in offers)  # Lambda's 8x A100 has no capacity
    assert all(o["hours"] for o in offers)  # every GPU of the fakes is one the catalog knows
    fitting = [o for o in offers if o["fits"] in ("fits", "tight")]
    assert fitting and offers[: len(fitting)] == fitting
    assert [o["total_usd"] for o in fitting if o["total_usd"] is not None] == sorted(
        o["total_usd"] for o in fitting if o["total_usd"] is not None
    )


def test_clusters_are_offered_by_runpod_and_the_others_say_they_rent_none(
    served: dict[ProviderName, FakeCloud], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["offers", "--json", "--nodes", "2", "--gpus", "8", "--model", "qwen2.5-7b"]) == 0
    out, err = capsys.readouterr()
    offers = json.loads(out)
    assert offers and all((o["provider"], o["nodes"], o["count"]) == ("runpod", 2, 8) for o in offers)
    assert "Vast.ai" in err and "Lambda" in err and "no API for renting several machines as one cluster" in err
    assert main(["offers", "--nodes", "2", "--gpus", "8"]) == 0
    assert "2 machines x RTX 4090 x8" in capsys.readouterr().out
    assert main(["offers", "--nodes", "2", "--spot"]) == 2
    assert "not sold as spot" in capsys.readouterr().err


def test_a_refused_key_is_a_note_end_to_end(
    served: dict[ProviderName, FakeCloud], capsys: pytest.CaptureFixture[str]
) -> None:
    served[VAST].faults.reject_key = True
    assert main(["offers", "--json", "--provider", "all"]) == 0
    out, err = capsys.readouterr()
    assert {o["provider"] for o in json.loads(out)} == {"runpod", "lambda"}
    assert err.startswith("Vast.ai skipped: the API key was refused")


async def rent(name: ProviderName, cloud: FakeCloud, gpu: str, label: str) -> str:
    """Rents a machine through the real client (it never boots); returns its id."""
    provider = open_provider(name, api_key=cloud.valid_key, transport=cloud.transport())
    try:
        chosen = (await provider.offers(OfferQuery(gpu=gpu)))[0]
        return (await provider.create(RentRequest(chosen, PUBLIC_KEY, label, "pytorch/pytorch:latest"))).instance_id
    finally:
        await provider.aclose()


async def test_machines_and_orphans_end_to_end(
    served: dict[ProviderName, FakeCloud], capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    live = run_in(store, RunState.PROVISIONING)
    ended = run_in(store, RunState.PROVISIONING, RunState.CANCELLED)
    kept = await rent(RUNPOD, served[RUNPOD], "RTX 4090", f"rentune-{live}")
    orphan = await rent(VAST, served[VAST], "RTX 4090", f"rentune-{ended}")
    mine = await rent(LAMBDA, served[LAMBDA], "A10", "my-own-box")
    assert await asyncio.to_thread(main, ["machines", "--json"]) == 0
    listed = {m["instance_id"]: (m["provider"], m["run_id"], m["orphan"]) for m in json.loads(capsys.readouterr().out)}
    assert listed == {kept: ("runpod", live, False), orphan: ("vast", None, True), mine: ("lambda", None, False)}
    assert await asyncio.to_thread(main, ["machines", "--stop-orphans"]) == 0
    assert f"stopped Vast.ai rentune-{ended} ({orphan})" in capsys.readouterr().out
    assert served[VAST].instances[orphan].terminated is not None
    assert served[RUNPOD].instances[kept].live and served[LAMBDA].instances[mine].live


async def test_a_cluster_no_live_run_owns_is_an_orphan_at_its_machines_price_and_is_deleted(
    served: dict[ProviderName, FakeCloud], capsys: pytest.CaptureFixture[str]
) -> None:
    ended = run_in(RunStore(), RunState.PROVISIONING, RunState.CANCELLED)
    provider = open_provider(RUNPOD, api_key=served[RUNPOD].valid_key, transport=served[RUNPOD].transport())
    try:
        (offer,) = await provider.offers(OfferQuery(gpu="RTX 4090", count=1, nodes=2))
        cluster = await provider.create(RentRequest(offer, PUBLIC_KEY, f"rentune-{ended}", "pytorch/pytorch:latest"))
        elsewhere = await provider.create(  # rented by Rentune on another computer (another RENTUNE_HOME)
            RentRequest(offer, PUBLIC_KEY, machine_label("ffffffff", ended), "pytorch/pytorch:latest")
        )
    finally:
        await provider.aclose()
    assert await asyncio.to_thread(main, ["machines", "--json"]) == 0
    listed = {m["instance_id"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed[cluster.instance_id]["orphan"], "this computer's, owned by no live run"
    assert listed[cluster.instance_id]["price_per_hour"] == pytest.approx(2 * 0.69), "both machines' price"
    assert not listed[elsewhere.instance_id]["orphan"], "another computer's cluster is never an orphan"
    assert await asyncio.to_thread(main, ["machines", "--stop-orphans"]) == 0
    assert f"({cluster.instance_id})" in capsys.readouterr().out
    runpod = served[RUNPOD]
    assert isinstance(runpod, FakeRunPod)
    books = {f"cluster:{book.id}": book for book in runpod.clusters.values()}
    assert books[cluster.instance_id].deleted is not None, "the cluster and every machine of it"
    assert books[elsewhere.instance_id].deleted is None, "another computer's is left alone"


@pytest.mark.parametrize("command", [["offers"], ["machines"], ["machines", "--stop-orphans"]])
def test_no_provider_answering_is_a_failure_not_an_empty_list(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "some-key")
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", "http://127.0.0.1:9")  # nothing listens there
    assert main([*command, "--provider", "runpod"] if command == ["offers"] else command) == 1
    err = capsys.readouterr().err
    assert "RunPod skipped: cannot reach http://127.0.0.1:9" in err
    assert "no provider answered (see above); check the network and the keys, then try again" in err


# -- one list failing, one row unreadable: nothing else hidden --------------------------------------------------------


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> OpenProvider:
    """Opens the real clients retrying at once (a failing list answers 500 every time), wired into the command."""
    open_ = functools.partial(open_provider, retry=RetryPolicy(attempts=2, first_delay=0.01))
    monkeypatch.setattr("desktop.cli.machines.list_machines", functools.partial(list_machines, open=open_))
    return open_


async def test_a_failed_cluster_list_still_shows_the_pods_and_their_orphan_end_to_end(
    served: dict[ProviderName, FakeCloud], quick_retries: OpenProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    live = run_in(store, RunState.PROVISIONING)
    ended = run_in(store, RunState.PROVISIONING, RunState.CANCELLED)
    kept = await rent(RUNPOD, served[RUNPOD], "RTX 4090", f"rentune-{live}")
    orphan = await rent(RUNPOD, served[RUNPOD], "RTX 4090", f"rentune-{ended}")
    served[RUNPOD].failing_lists["clusters"] = 500  # type: ignore[attr-defined]
    assert await asyncio.to_thread(main, ["machines", "--json"]) == 0
    out, err = capsys.readouterr()
    listed = {m["instance_id"]: (m["provider"], m["run_id"], m["orphan"]) for m in json.loads(out)}
    assert listed[kept] == ("runpod", live, False) and listed[orphan] == ("runpod", None, True)
    assert "RunPod: clusters could not be listed (server error 500" in err
    assert await asyncio.to_thread(main, ["machines"]) == 0
    out, err = capsys.readouterr()
    assert "1 orphaned machine burns $0.69/h" in out and "clusters could not be listed" in err
    warning = await orphans.orphan_warning(store, open=quick_retries)
    assert warning is not None and orphan in warning and "RunPod: clusters could not be listed" in warning


async def test_a_vast_instance_with_an_unreadable_port_hides_no_other_machine_end_to_end(
    served: dict[ProviderName, FakeCloud], quick_retries: OpenProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    ended = run_in(store, RunState.PROVISIONING, RunState.CANCELLED)
    orphan = await rent(VAST, served[VAST], "RTX 4090", f"rentune-{ended}")
    mine = await rent(VAST, served[VAST], "RTX 4090", "my-own-box")
    broken = await rent(VAST, served[VAST], "RTX 4090", "rentune-20200101-000000-beef")
    running = {"actual_status": "running", "intended_status": "running"}
    served[VAST].malform(broken, **running, ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "abc"}]})
    assert await asyncio.to_thread(main, ["machines", "--json"]) == 0
    out, err = capsys.readouterr()
    listed = {m["instance_id"]: m["orphan"] for m in json.loads(out) if m["provider"] == "vast"}
    assert listed == {orphan: True, mine: False}, "the other instances, the orphan among them"
    assert (
        f"Vast.ai: instance {broken} (rentune-20200101-000000-beef) could not be read "
        "(invalid literal for int() with base 10: 'abc')"
    ) in err.splitlines()
    report = await list_machines(store, None, [VAST], open=quick_retries)
    assert [m.instance.instance_id for m in report.orphans] == [orphan] and len(report.unread) == 1


async def test_machines_left_out_are_warned_of_even_without_an_orphan(
    clouds: dict[ProviderName, MemoryProvider],
) -> None:
    clouds[RUNPOD].machines = [machine(RUNPOD, "pod-mine", "my-notebook", InstanceState.RUNNING, 0.44)]
    clouds[RUNPOD].unread = [Unread("RunPod: clusters could not be listed (server error 500)")]
    report = await list_machines(RunStore(), None, [RUNPOD], open=opener(*clouds.values()))
    assert [m.instance.instance_id for m in report.machines] == ["pod-mine"]
    assert report.unread == ["RunPod: clusters could not be listed (server error 500)"]
    assert report.notes[-1] == report.unread[0]
    warning = orphans.unread_warning(report)
    assert warning is not None and "clusters could not be listed" in warning and "may bill unseen" in warning
