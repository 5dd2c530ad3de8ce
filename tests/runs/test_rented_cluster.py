"""A RunPod Instant Cluster end to end: ``rentune run`` with ``[compute] nodes = 2`` against the fake RunPod, whose
cluster members are real sshds on loopback, training the tiny model across them with the real payload."""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.renting.driver import RentalDriver, RentalOptions
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunRecord, RunStore
from tests.fakes.runpod import FakeRunPod
from tests.fakes.runpod_clusters import booked_as_billed
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel

pytestmark = pytest.mark.slow


def cluster_spec(folder: Path, tiny_model: TinyModel, dataset: Path, **compute: object) -> Path:
    table = {
        "provider": "runpod",
        "gpu": "RTX 4090",
        "nodes": 2,
        "python": sys.executable,
        "user": getpass.getuser(),
        "ready_timeout_minutes": 1,
        **compute,
    }
    settings = {**TINY_TRAINING, "max_steps": 12, "checkpoint_steps": 4}
    lines = ["[model]", f'base = "{tiny_model.path}"', "", "[data]", f'train = "{dataset}"', ""]
    lines += ["[training]", *(f"{k} = {json.dumps(v)}" for k, v in settings.items()), ""]
    lines += ["[compute]", *(f"{k} = {json.dumps(v)}" for k, v in table.items()), ""]
    path = folder / "SPEC.toml"
    path.write_text("\n".join(lines))
    return path


def driven_cluster_run(
    fake_runpod: FakeRunPod, monkeypatch: pytest.MonkeyPatch, spec: Path, tmp_path: Path
) -> tuple[RunEngine, RentalDriver, RunRecord]:
    """An engine and its renting driver on the fake RunPod (fast polls), and the run of ``spec`` created."""
    import tomllib

    from desktop.core.runs.spec import run_spec_from_dict

    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2, grace_seconds=5))
    driver = RentalDriver(engine, options=RentalOptions(poll_seconds=0.3, ready_poll_seconds=0.2))
    return engine, driver, engine.create(run_spec_from_dict(tomllib.loads(spec.read_text()), tmp_path, spec))


def test_a_two_machine_cluster_trains_one_run_and_is_deleted_once_the_adapter_is_home(
    fake_runpod: FakeRunPod,
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: TinyModel,
    chat_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RENTUNE_RUNPOD_URL", fake_runpod.serve())
    monkeypatch.setenv("RUNPOD_API_KEY", fake_runpod.valid_key)
    assert main(["run", str(cluster_spec(tmp_path, tiny_model, chat_dataset))]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert "2 machines answer" in out and "adapter verified" in out
    (run,) = RunStore().all()
    assert run.state is RunState.FINISHED
    (cluster,) = fake_runpod.clusters.values()
    assert cluster.body["compute"] == {"gpuTypeId": "NVIDIA GeForce RTX 4090", "gpuCountPerPod": 1, "podCount": 2}
    members = fake_runpod.member_pods(cluster.id)
    assert all(pod.terminated is not None for pod in members) and not fake_runpod.pool.servers
    (node,) = RunStore().nodes_of(run.id)
    assert node.state is RunState.FINISHED
    assert node.target == f"ssh://{getpass.getuser()}@127.0.0.1:{members[1].address.port}", "rank 1 on member 1"
    adapter = Path(str(run.adapter))
    arrived = (adapter / "adapter_model.safetensors").stat().st_mtime
    assert cluster.deleted is not None and cluster.deleted - arrived < 30, "deleted within 30 s of the adapter home"
    events = mirrored_events(adapter.parent)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["step"] for e in events if e["event"] == "step"][-1] == 12
    rentals = Ledger().rentals(run.id)
    assert [r.instance_id for r in rentals] == [f"cluster:{cluster.id}/0", f"cluster:{cluster.id}/1"], "one per machine"
    for rental, billed in zip(rentals, fake_runpod.members_billed(cluster.id), strict=True):
        assert rental.stopped is not None and rental.price_per_hour == pytest.approx(0.69)
        gap = booked_as_billed(rental.usd(time.time()), billed)
        assert gap is None, f"the ledger's dollars are RunPod's: {gap}"


async def test_a_cluster_that_loses_a_machine_is_deleted_and_the_run_resumes_on_a_fresh_one(
    fake_runpod: FakeRunPod,
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: TinyModel,
    chat_dataset: Path,
    tmp_path: Path,
) -> None:
    import asyncio

    from desktop.services.runs.checkpoints import newest_local_checkpoint

    path = cluster_spec(tmp_path, tiny_model, chat_dataset)
    path.write_text(path.read_text().replace("max_steps = 12", "max_steps = 400"))
    engine, driver, record = driven_cluster_run(fake_runpod, monkeypatch, path, tmp_path)
    drive = asyncio.ensure_future(driver.drive(record.id))
    folder = engine.folder(record.id)
    deadline = time.monotonic() + 600
    while newest_local_checkpoint(folder / "checkpoints") is None:
        assert time.monotonic() < deadline and not drive.done(), "no checkpoint came home"
        await asyncio.sleep(0.2)
    home = newest_local_checkpoint(folder / "checkpoints")
    assert home is not None
    newest = int(home.name.split("-")[1])
    (first,) = fake_runpod.clusters.values()
    for run in [engine.store.get(record.id), *engine.store.nodes_of(record.id)]:  # a short rest of the run
        engine.ctx.set_spec(run.id, training={**run.spec["training"], "max_steps": newest + 40})
    fake_runpod.statuses[first.members[1]] = "EXITED"  # one machine of the cluster stops
    finished = await asyncio.wait_for(drive, 600)
    assert finished.state is RunState.FINISHED, finished.error
    assert first.deleted is not None and len(fake_runpod.clusters) == 2, "the lost cluster went, a fresh one came"
    assert all(book.deleted is not None for book in fake_runpod.clusters.values()) and not fake_runpod.pool.servers
    resumed = [e for e in mirrored_events(folder) if e["event"] == "state" and e.get("resume_from")]
    assert resumed and int(resumed[-1]["resume_from"].split("-")[1]) >= newest, "from the newest at home then"
    books = list(fake_runpod.clusters.values())
    rentals = Ledger().rentals(record.id)
    assert [r.instance_id for r in rentals] == [f"cluster:{book.id}/{rank}" for book in books for rank in (0, 1)]
    billed = [member for book in books for member in fake_runpod.members_billed(book.id)]
    for rental, member in zip(rentals, billed, strict=True):
        gap = booked_as_billed(rental.usd(time.time()), member)
        assert rental.stopped is not None and gap is None, gap


async def test_with_the_laptop_closed_the_clusters_head_deletes_the_cluster_once_training_ends(
    fake_runpod: FakeRunPod,
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: TinyModel,
    chat_dataset: Path,
    tmp_path: Path,
) -> None:
    """Self-stop for a cluster (opted in with send_api_key): nobody follows the run, training ends, and a few seconds
    later the head deletes the whole cluster with the user's key, which never reached any machine's disk."""
    import asyncio
    import contextlib

    path = cluster_spec(tmp_path, tiny_model, chat_dataset, self_stop_minutes=0.05, send_api_key=True)
    engine, driver, record = driven_cluster_run(fake_runpod, monkeypatch, path, tmp_path)
    drive = asyncio.ensure_future(driver.drive(record.id))
    folder, deadline = engine.folder(record.id), time.monotonic() + 600
    while not any(e["event"] == "step" for e in mirrored_events(folder)):
        assert time.monotonic() < deadline and not drive.done(), "training never started"
        await asyncio.sleep(0.1)
    drive.cancel()  # the laptop closes: no pulls, no heartbeat, nobody to delete the cluster
    with contextlib.suppress(asyncio.CancelledError):
        await drive
    (book,) = fake_runpod.clusters.values()
    while book.deleted is None:
        assert time.monotonic() < deadline, "the cluster never deleted itself"
        await asyncio.sleep(0.2)
    deletes = [r for r in fake_runpod.requests if r.method == "DELETE" and r.path.endswith(f"/clusters/{book.id}")]
    assert [r.bearer for r in deletes] == [fake_runpod.valid_key], "once, with the user's key"
    watcher = Path(str(engine.store.get(record.id).remote_dir)) / "out" / "self_stop.log"
    assert "self-stop armed" in watcher.read_text(), "the head's self-stop (the head goes with the cluster it deletes)"
    members = fake_runpod.member_pods(book.id)
    assert all(pod.terminated is not None for pod in members), "every machine of it went"
    for pod in members:
        assert pod.address is not None
        for file in pod.address.home.rglob("*"):
            if file.is_file():
                assert fake_runpod.valid_key.encode() not in file.read_bytes(), f"the account key reached {file}"
