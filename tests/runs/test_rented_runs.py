"""Renting end to end: ``rentune run`` with ``[compute]`` against the fake clouds, whose machines are real sshd
servers on loopback, training the tiny model with the real payload.

The driver's decisions when a machine goes wrong run on in-memory clouds and hosts in test_rental_logic (a spot
machine outbid or taken away, a machine the idle guard terminates) and test_rental_money (ledger and terminate under
faults, the budget stopping a training run); moving to a new machine with real parts: test_rented_resume and
test_engine_end_to_end's machine-lost test; a budget reached mid-training on real parts: test_engine_options.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from desktop.cli import main
from desktop.core.runs.spec import run_spec_from_dict
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.platform.settings import installation_id
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from desktop.services.runs.transfer_log import read_transfers
from tests.fakes.http import FakeCloud, FakeInstance
from tests.fakes.machines import processes_of
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.secret_watch import ArgvWatch
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class CloudUnderTest:
    """One fake cloud wired into the environment as the app finds a real one."""

    name: str
    fake: FakeCloud
    gpu: str


def _serve(
    monkeypatch: pytest.MonkeyPatch, fake: FakeCloud, name: str, url_env: str, suffix: str, key_env: str
) -> FakeCloud:
    monkeypatch.setenv(url_env, fake.serve() + suffix)
    monkeypatch.setenv(key_env, fake.valid_key)
    return fake


@pytest.fixture
def runpod(fake_runpod: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> CloudUnderTest:
    fake = _serve(monkeypatch, fake_runpod, "runpod", "RENTUNE_RUNPOD_URL", "", "RUNPOD_API_KEY")
    return CloudUnderTest("runpod", fake, "RTX 4090")


@pytest.fixture
def vast(fake_vast: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> CloudUnderTest:
    fake = _serve(monkeypatch, fake_vast, "vast", "RENTUNE_VAST_URL", "/api/v0", "VAST_API_KEY")
    return CloudUnderTest("vast", fake, "RTX 4090")


SpecWriter = Callable[..., Path]


@pytest.fixture
def rented_spec(tmp_path: Path, tiny_model: TinyModel, chat_dataset: Path) -> SpecWriter:
    """Writes a SPEC.toml renting from ``cloud`` (keyword arguments: [compute] keys, then ``training=`` and
    ``budget=``)."""

    def write(cloud: CloudUnderTest, training: dict[str, Any] | None = None, budget: float = 0, **compute: Any) -> Path:
        settings = {**TINY_TRAINING, "max_steps": 20, **(training or {})}  # two checkpoints: enough to rent around
        table = {
            "provider": cloud.name,
            "gpu": cloud.gpu,
            "python": sys.executable,
            "user": getpass.getuser(),
            "ready_timeout_minutes": 1,
            **compute,
        }
        lines = ["[model]", f'base = "{tiny_model.path}"', "", "[data]", f'train = "{chat_dataset}"', ""]
        lines += ["[training]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items()), ""]
        lines += ["[compute]", *(f"{k} = {json.dumps(v)}" for k, v in table.items()), ""]
        if budget:
            lines += ["[budget]", f"max_usd = {budget}", ""]
        path = tmp_path / "SPEC.toml"
        path.write_text("\n".join(lines))
        return path

    return write


def _driver(**rental: float) -> tuple[RunEngine, RentalDriver]:
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2, grace_seconds=5), report=print)
    options = RentalOptions(**{"poll_seconds": 0.3, "ready_poll_seconds": 0.2, **rental})  # type: ignore[arg-type]
    return engine, RentalDriver(engine, options=options)


def _create(engine: RunEngine, spec_path: Path) -> str:
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), spec_path.parent, spec_path)
    return engine.create(spec).id


def _nothing_left(fake: FakeCloud) -> None:
    with fake.lock:
        live = [i.id for i in fake.live_instances()]
        machines = [i for i in fake.instances if fake.pool.alive(i)]
    assert live == [] and machines == [], f"left running at the fake: {live}, machines up: {machines}"


def _assert_ledger_matches(fake: FakeCloud, run_id: str) -> None:
    """The ledger's dollars equal price x rented time as the provider counted it (within a second of billing)."""
    rentals = {r.instance_id: r for r in Ledger().rentals(run_id)}
    for instance in fake.instances.values():
        assert instance.terminated is not None
        booked = rentals[instance.id]
        provider_seconds = instance.terminated - instance.created
        assert booked.stopped is not None
        assert abs((booked.stopped - booked.started) - provider_seconds) < 2.0
        assert abs(booked.usd(time.time()) - booked.price_per_hour * provider_seconds / 3600) < 0.01


def _assert_bill_split_adds_up(fake: FakeCloud, run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``rentune costs --run`` splits the bill into phases that add up to what the provider billed (within 1 %)."""
    [instance] = fake.instances.values()
    [booked] = Ledger().rentals(run_id)
    assert instance.terminated is not None
    billed = booked.price_per_hour * (instance.terminated - instance.created) / 3600
    assert main(["costs", "--run", run_id, "--json"]) == 0
    bill = json.loads(capsys.readouterr().out)
    phases = {phase["phase"]: phase for phase in bill["phases"]}
    assert sum(phase["usd"] for phase in phases.values()) == pytest.approx(billed, rel=0.01)
    assert all(phases[name]["seconds"] > 0 for name in ("waiting for the machine", "setup and upload", "training"))
    assert bill["usd_per_training_hour"] == pytest.approx(bill["usd"] / bill["training_hours"])
    trained = phases["training"]["usd"] + phases["checkpoint transfers while training"]["usd"]
    assert bill["idle_usd"] == pytest.approx(bill["usd"] - trained), "checkpoints came home while the GPU trained on"
    assert read_transfers(RunStore().folder(run_id)), "every checkpoint pull is logged for the bill's phases"
    assert main(["costs", "--run", run_id]) == 0
    assert "effective training hour: $" in capsys.readouterr().out
    assert main(["status", run_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bill"]["phases"] == bill["phases"], "the run's report, the same split"
    assert main(["status", run_id]) == 0
    assert "  paid while nothing trained: $" in capsys.readouterr().out


class KeyWatch(ArgvWatch):
    """Samples, while a run goes on, every process's command line and the machines' processes' environments, and
    the machines' disks at the end, for the account's API key."""

    def __init__(self, fake: FakeCloud) -> None:
        super().__init__(fake.valid_key)
        self.fake = fake

    def __exit__(self, *_: object) -> None:
        super().__exit__()
        for instance in self.fake.instances.values():
            home = instance.address.home if instance.address else None
            for path in home.rglob("*") if home else ():
                if path.is_file() and self.secret in path.read_bytes():
                    self.leaks.append(f"machine disk: {path}")

    def sample(self) -> None:
        """Every command line, and the environment of every process of every machine."""
        super().sample()
        for machine_id in list(self.fake.instances):
            for pid in processes_of(self.fake.pool.marker(machine_id)):
                with contextlib.suppress(OSError):
                    if self.secret in Path(f"/proc/{pid}/environ").read_bytes():
                        self.leaks.append(f"environment of machine process {pid}")


def _secret_free(home: Path, keys: list[str]) -> None:
    for path in home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for key in keys:
                assert key.encode() not in data, f"an API key was written to {path}"
            assert b"PRIVATE KEY" not in data, f"a private key was written to {path}"


@pytest.mark.parametrize(("cloud_name", "keyring_exists"), [("runpod", True), ("vast", False)])
def test_rentune_run_rents_trains_and_terminates_when_the_adapter_is_home(
    cloud_name: str,
    keyring_exists: bool,
    request: pytest.FixtureRequest,
    rented_spec: SpecWriter,
    capsys: pytest.CaptureFixture[str],
    rentune_home: Path,
    memory_keyring: MemoryKeyring,
) -> None:
    """Vast's run is a headless server's: no keyring at all, so the run's SSH key lives in a private file."""
    import keyring
    from keyring.backends.fail import Keyring as NoKeyring

    from desktop.services.machines.keys import key_file

    cloud: CloudUnderTest = request.getfixturevalue(cloud_name)
    if not keyring_exists:
        keyring.set_keyring(NoKeyring())
    with KeyWatch(cloud.fake) as watch:
        assert main(["run", str(rented_spec(cloud))]) == 0, capsys.readouterr()
    assert watch.samples > 10 and not watch.leaks, f"the API key was seen: {watch.leaks[:3]}"
    out = capsys.readouterr().out
    assert "adapter verified" in out and "terminated" in out
    runs = RunStore().all()
    assert len(runs) == 1 and runs[0].state is RunState.FINISHED
    adapter = Path(str(runs[0].adapter))
    [instance] = cloud.fake.instances.values()
    assert instance.label == f"rentune-{installation_id()}-{runs[0].id}"
    assert instance.terminated is not None
    arrived = (adapter / "adapter_model.safetensors").stat().st_mtime
    assert instance.terminated - arrived < 30, "terminated within 30 s of the adapter arriving"
    _nothing_left(cloud.fake)
    _assert_ledger_matches(cloud.fake, runs[0].id)
    _assert_bill_split_adds_up(cloud.fake, runs[0].id, capsys)
    path = key_file(runs[0].id)
    if keyring_exists:
        assert not path.exists(), "the keyring keeps the run key: no file"
    else:
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert path.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----"), "kept like a keyring keeps it"
        RunEngine(RunStore()).delete(runs[0].id)
        assert not path.exists(), "the run's private key goes with the run"
    _secret_free(rentune_home, [cloud.fake.valid_key])


def test_a_machine_that_never_becomes_ready_is_terminated_with_a_clear_message(
    runpod: CloudUnderTest, rented_spec: SpecWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    runpod.fake.faults.never_ready = True
    assert main(["run", str(rented_spec(runpod, ready_timeout_minutes=0.05))]) == 1
    out = capsys.readouterr().out
    assert "was not ready after 0.05 min" in out and "it was terminated, nothing is billing" in out
    _nothing_left(runpod.fake)
    assert RunStore().all()[0].state is RunState.FAILED


def test_out_of_stock_and_a_refused_key_fail_clearly_and_rent_nothing(
    runpod: CloudUnderTest,
    rented_spec: SpecWriter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runpod.fake.faults.out_of_stock = True
    assert main(["run", str(rented_spec(runpod))]) == 1
    out = capsys.readouterr().out
    assert "no longer any instances available" in out
    runpod.fake.faults.out_of_stock = False
    monkeypatch.setenv("RUNPOD_API_KEY", "wrong-key")
    assert main(["run", str(rented_spec(runpod))]) == 1
    out = capsys.readouterr().out
    assert "API key was refused" in out and "rentune keys set runpod" in out
    _nothing_left(runpod.fake)


def test_bootstrap_failure_terminates_the_machine(
    runpod: CloudUnderTest, rented_spec: SpecWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(rented_spec(runpod, python="/nonexistent/python3"))]) == 1
    out = capsys.readouterr().out
    assert "terminated" in out
    _nothing_left(runpod.fake)


def test_a_budget_too_small_to_stop_a_machine_rents_nothing(runpod: CloudUnderTest, rented_spec: SpecWriter) -> None:
    engine, driver = _driver()
    run_id = _create(engine, rented_spec(runpod, budget=0.01))
    record = asyncio.run(driver.drive(run_id))
    assert record.state is RunState.FAILED and "raise [budget] max_usd" in str(record.error)
    assert runpod.fake.instances == {}


def _instances(fake: FakeCloud) -> list[FakeInstance]:
    with fake.lock:
        return list(fake.instances.values())


@pytest.fixture
def lambda_cloud(fake_lambda: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> CloudUnderTest:
    fake = _serve(monkeypatch, fake_lambda, "lambda", "RENTUNE_LAMBDA_URL", "/api/v1", "LAMBDA_API_KEY")
    return CloudUnderTest("lambda", fake, "A10")


def test_lambda_run_rents_trains_and_terminates(lambda_cloud: CloudUnderTest, rented_spec: SpecWriter) -> None:
    """Lambda's API has no SSH port (VMs take ubuntu@ip:22): the fake's machines listen elsewhere, so the client
    gets the fake's address seam; everything else goes through the registry's URL and key."""
    from desktop.services.providers.lambda_cloud import LambdaProvider, Pacer
    from desktop.services.providers.registry import PROVIDERS

    fake: Any = lambda_cloud.fake
    fake.limits = None  # Lambda's rate limits are tested on a manual clock (test_lambda); here they only add seconds

    def open_lambda(name: Any, secrets: Any) -> LambdaProvider:
        info = PROVIDERS[name]
        return LambdaProvider(os.environ["LAMBDA_API_KEY"], info.url, ssh_for=fake.ssh_for, pacer=Pacer(0.0, 0.0))

    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2, grace_seconds=5), report=print)
    driver = RentalDriver(
        engine, options=RentalOptions(poll_seconds=0.3, ready_poll_seconds=0.2), open_provider=open_lambda
    )
    run_id = _create(engine, rented_spec(lambda_cloud))
    record = asyncio.run(driver.drive(run_id))
    assert record.state is RunState.FINISHED
    [instance] = fake.instances.values()
    arrived = (Path(str(record.adapter)) / "adapter_model.safetensors").stat().st_mtime
    assert instance.terminated is not None and instance.terminated - arrived < 30
    _nothing_left(fake)
    _assert_ledger_matches(fake, run_id)


def test_laptop_closed_the_machine_terminates_itself_and_resume_finishes(
    runpod: CloudUnderTest, rented_spec: SpecWriter
) -> None:
    engine, driver = _driver()
    run_id = _create(engine, rented_spec(runpod, training={"max_steps": 20}, self_stop_minutes=0.05))
    folder = engine.folder(run_id)

    async def close_the_laptop() -> None:
        drive = asyncio.ensure_future(driver.drive(run_id))
        for _ in range(1200):
            if any(e["event"] == "step" for e in mirrored_events(folder)):
                break
            await asyncio.sleep(0.1)
        drive.cancel()  # nobody follows the run from here on: no pulls, no heartbeat
        with contextlib.suppress(asyncio.CancelledError):
            await drive

    asyncio.run(close_the_laptop())
    [machine] = _instances(runpod.fake)
    for _ in range(1200):  # training ends on the machine; 3 s later it terminates itself
        if machine.terminated is not None:
            break
        time.sleep(0.1)
    assert machine.terminated is not None, "the machine terminated itself"
    own_key = f"pod-scoped-{machine.id}"
    assert any(r.bearer == own_key for r in runpod.fake.requests), "with the pod's own key"
    assert machine.address is not None
    for path in machine.address.home.rglob("*"):
        if path.is_file():
            assert runpod.fake.valid_key.encode() not in path.read_bytes(), f"the account key reached {path}"
    record = asyncio.run(driver.drive(run_id))
    assert record.state is RunState.FINISHED
    assert len(RunStore().get(run_id).spec["machines"]) == 2
    _nothing_left(runpod.fake)


def test_rentune_run_warns_of_orphaned_machines_with_their_burn_rate(
    runpod: CloudUnderTest, rented_spec: SpecWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    from desktop.services.providers.base import OfferQuery, ProviderName, RentRequest
    from desktop.services.providers.registry import open_provider

    async def leave_an_orphan() -> None:
        provider = open_provider(ProviderName.RUNPOD)
        try:
            [offer, *_] = await provider.offers(OfferQuery(gpu="RTX 4090"))
            key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHf2lCXjVHZmIeOaVG7CXHPBBpU1KLdmkLmNbdzN8YKc orphan"
            await provider.create(RentRequest(offer, key, "rentune-20200101-000000-dead", "img"))
        finally:
            await provider.aclose()

    asyncio.run(leave_an_orphan())
    runpod.fake.faults.never_ready = True
    assert main(["run", str(rented_spec(runpod, ready_timeout_minutes=0.02))]) == 1
    err = capsys.readouterr().err
    assert "1 orphaned machine (no live run owns it) bills $0.69/h" in err and "rentune-20200101-000000-dead" in err
    assert "rentune machines --stop-orphans" in err


def test_renting_with_a_keyring_that_stores_nothing_refuses_before_anything_is_rented(
    runpod: CloudUnderTest, rented_spec: SpecWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    import keyring
    from keyring.backends.null import Keyring as NullKeyring

    keyring.set_keyring(NullKeyring())  # (a keyring that does not exist at all keeps run keys in files instead)
    assert main(["run", str(rented_spec(runpod))]) == 2
    err = capsys.readouterr().err
    assert "renting needs a keyring that keeps the run's own SSH key" in err
    assert "the keyring backend keyring.backends.null.Keyring stores nothing: unset PYTHON_KEYRING_BACKEND" in err
    assert runpod.fake.instances == {} and RunStore().all() == []


def test_rentune_stop_of_a_detached_rented_run_pulls_the_checkpoint_and_terminates(
    runpod: CloudUnderTest, rented_spec: SpecWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, driver = _driver()
    run_id = _create(engine, rented_spec(runpod, training={"max_steps": 400}))

    async def detach_once_training() -> None:
        drive = asyncio.ensure_future(driver.drive(run_id))
        while not any(e["event"] == "step" for e in mirrored_events(engine.folder(run_id))):
            await asyncio.sleep(0.1)
        drive.cancel()  # Ctrl-C: the machine trains on, nobody follows
        with contextlib.suppress(asyncio.CancelledError):
            await drive

    asyncio.run(asyncio.wait_for(detach_once_training(), 300))
    assert main(["stop", run_id]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f"run {run_id}: cancelled" in out and "terminated RunPod machine" in out
    assert list(engine.folder(run_id).glob("checkpoints/checkpoint-*")), "the stop's checkpoint came home"
    _nothing_left(runpod.fake)
