"""One run across several machines: each a real sshd of its own (own host key, own home), the real payload training
the tiny model over gloo with one rank per machine, driven by the engine as one run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.spec import RunSpec
from desktop.core.runs.states import RunState
from desktop.services.runs.checkpoints import newest_local_checkpoint
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.events import mirrored_events
from desktop.services.runs.store import RunStore
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.sshd import SshdUnavailableError, SshHost, SshServer
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel
from tests.payload.conftest import payload_env
from tests.payload.test_training import assert_adapter_changes_the_model
from trainer_payload.checkpoints import is_complete

pytestmark = pytest.mark.slow

NodeFactory = Callable[[str], SshServer]


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[NodeFactory]:
    """Starts sshds as separate machines: each its own host key and listener, all accepting the first one's client
    key (one [target] identity and key file, as a lab's hosts would)."""
    servers: list[SshServer] = []

    def start(name: str) -> SshServer:
        server = SshServer(tmp_path / name)
        if servers:
            server.client_key = servers[0].client_key
            server.authorized_keys_file = servers[0].authorized_keys_file
        try:
            server.start()
        except SshdUnavailableError as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cluster_spec(folder: Path, hosts: list[SshHost], tiny_model: TinyModel, **training: object) -> Path:
    dataset = write_chat_dataset(folder / "chat.jsonl")
    settings = {**TINY_TRAINING, "seed": 7, **training}
    lines = ["[model]", f'base = "{tiny_model.path}"', "", "[data]", f'train = "{dataset}"', "", "[training]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    lines += [
        "",
        "[target]",
        f"hosts = {json.dumps([host.url for host in hosts])}",
        f'identity = "{hosts[0].client_key}"',
        f'python = "{sys.executable}"',
        f'workdir = "{folder / "remote"}"',
        f'authorized_keys = "{hosts[0].server.authorized_keys_file}"',
        f"head_port = {free_port()}",
    ]
    path = folder / "SPEC.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def losses(events: list[dict]) -> dict[int, float]:  # type: ignore[type-arg]
    return {e["step"]: e["loss"] for e in events if e["event"] == "step"}


def two_ranks_on_one_machine(folder: Path, tiny_model: TinyModel, **training: object) -> dict[int, float]:
    """The reference: the same job as 2 ranks on one machine, the payload run directly."""
    folder.mkdir()
    write_chat_dataset(folder / "train.jsonl")
    job = {"base_model": str(tiny_model.path), "train_file": "train.jsonl", "output_dir": "out"}
    job |= {**TINY_TRAINING, "seed": 7, **training, "num_gpus": 2}
    (folder / "job.json").write_text(json.dumps(job))
    command = [sys.executable, "-m", "trainer_payload", "run", str(folder / "job.json")]
    result = subprocess.run(command, capture_output=True, text=True, env=payload_env(), timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return losses([json.loads(line) for line in (folder / "out" / "events.jsonl").read_text().splitlines()])


def test_two_machines_train_one_run_with_the_loss_curve_of_two_ranks_on_one(
    machines: NodeFactory, tiny_model: TinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head, other = machines("head"), machines("node1")
    spec = cluster_spec(tmp_path, [head.host(), other.host()], tiny_model, max_steps=12, checkpoint_steps=4)
    assert main(["run", str(spec)]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    assert out.count("pinned host key") == 2, "each machine's own host key, pinned on first contact"
    assert main(["runs", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert len(runs) == 1 and runs[0]["state"] == "finished", "one run, not one per machine"
    adapter = Path(runs[0]["adapter"])
    assert is_complete(adapter) and (adapter / "adapter_model.safetensors").is_file()
    assert_adapter_changes_the_model(tiny_model.path, adapter)  # it loads onto the base and changes its answers
    events = mirrored_events(adapter.parent)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "one contiguous stream, from rank 0"
    reference = two_ranks_on_one_machine(tmp_path / "reference", tiny_model, max_steps=12, checkpoint_steps=4)
    assert losses(events) == pytest.approx(reference, rel=1e-3)
    store = RunStore()
    (node,) = store.nodes_of(runs[0]["id"])
    assert node.state is RunState.FINISHED and node.target == other.host().url
    home = newest_local_checkpoint(adapter.parent / "checkpoints")
    assert home is not None and is_complete(home), "every file of every machine's part verified at home"
    on_node = Path(str(node.remote_dir)) / "out" / "checkpoints" / home.name / "rng_state_1.pth"
    assert (home / "rng_state_0.pth").is_file() and (home / "rng_state_1.pth").read_bytes() == on_node.read_bytes()
    assert is_complete(on_node.parent), "every machine keeps whole sealed checkpoints: any of them can resume"
    node_log = Path(str(node.remote_dir)) / "out" / "events.jsonl"
    node_events = [json.loads(line)["event"] for line in node_log.read_text().splitlines()]
    assert "step" not in node_events and "checkpoint" not in node_events, "rank 0 alone reports the training"
    assert "rentune-run-" not in head.authorized_keys_file.read_text(), "every machine's run key is removed"
    assert not (Path(str(node.remote_dir)) / "data").exists(), "the uploaded data is removed on every machine"
    assert main(["runs", "--json"]) == 0 and len(json.loads(capsys.readouterr().out)) == 1
    assert main(["status", runs[0]["id"]]) == 0
    assert f"node 1: finished on {other.host().url}" in capsys.readouterr().out


def test_moving_a_run_across_machines_takes_one_target_per_machine(capsys: pytest.CaptureFixture[str]) -> None:
    store = RunStore()
    head = store.create({"training": {}, "cluster": {"num_nodes": 2, "node_rank": 0}}, "ssh://me@a:22")
    node = store.create(
        {"training": {}, "cluster": {"num_nodes": 2, "node_rank": 1}}, "ssh://me@b:22", node_of=head.id, rank=1
    )
    for record in (head, node):
        store.transition(record.id, RunState.CONNECTING)
        store.transition(record.id, RunState.PAUSED)
    assert main(["resume", head.id, "--target", "ssh://me@c:22"]) == 2
    assert "trains on 2 machines: give --target once per machine, the head first" in capsys.readouterr().err
    assert store.get(head.id).target == "ssh://me@a:22", "nothing moved"


def kill_machine(server: SshServer, remote_dir: Path) -> None:
    """As a machine that vanished: every process working in its run folder is killed, then its sshd."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = str((proc / "cwd").readlink())
        except OSError:
            continue
        if cwd == str(remote_dir) or cwd.startswith(f"{remote_dir}/"):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                continue
    server.stop()


async def wait_for(predicate: Callable[[], bool], limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "it never happened"
        await asyncio.sleep(0.1)


def running(pid: int) -> bool:
    """Whether a process runs (a zombie nobody reaped has ended)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


async def lose_a_machine(
    machines: NodeFactory, tiny_model: TinyModel, folder: Path, lost: str
) -> tuple[RunEngine, str, RunSpec]:
    """A two-machine run that loses machine ``lost`` ("head" or "node") once a checkpoint is home: it must pause,
    saying which, with no trainer left on any machine. Returns the engine, the run's id and its spec."""
    import tomllib

    from desktop.core.runs.spec import run_spec_from_dict

    head, other = machines("head"), machines("node1")
    spec_path = cluster_spec(folder, [head.host(), other.host()], tiny_model, max_steps=400, checkpoint_steps=4)
    spec = run_spec_from_dict(tomllib.loads(spec_path.read_text()), folder, spec_path)
    engine = RunEngine(RunStore(), options=EngineOptions(poll_seconds=0.2, grace_seconds=10))
    record = engine.create(spec)
    (node,) = engine.store.nodes_of(record.id)
    drive = asyncio.ensure_future(engine.drive(record.id))
    checkpoints = engine.folder(record.id) / "checkpoints"
    await wait_for(lambda: newest_local_checkpoint(checkpoints) is not None or drive.done())
    head_pid, node_pid = engine.store.get(record.id).pid, engine.store.get(node.id).pid
    assert head_pid is not None and node_pid is not None
    if lost == "node":
        kill_machine(other, Path(str(engine.store.get(node.id).remote_dir)))
    else:
        kill_machine(head, Path(str(engine.store.get(record.id).remote_dir)))
    paused = await asyncio.wait_for(drive, 120)  # the grace period is 10 s; the rest is a loaded machine's slack
    assert paused.state is RunState.PAUSED, paused.error
    if lost == "node":
        assert paused.error and "node 1" in paused.error and "every machine was stopped" in paused.error
    else:
        assert paused.error and "unreachable" in paused.error
    assert not running(head_pid) and not running(node_pid), "no trainer is left on any machine"
    assert engine.store.get(node.id).state is RunState.PAUSED
    return engine, record.id, spec


async def test_a_lost_head_pauses_the_run_and_stops_the_other_machine(
    machines: NodeFactory, tiny_model: TinyModel, tmp_path: Path
) -> None:
    # the resume on a fresh pair is the same after either loss: the test below proves it once
    engine, run_id, _ = await lose_a_machine(machines, tiny_model, tmp_path, "head")
    assert newest_local_checkpoint(engine.folder(run_id) / "checkpoints") is not None


async def test_a_lost_node_pauses_the_run_stops_the_head_and_a_fresh_pair_resumes(
    machines: NodeFactory, tiny_model: TinyModel, tmp_path: Path
) -> None:
    engine, run_id, spec = await lose_a_machine(machines, tiny_model, tmp_path, "node")
    folder = engine.folder(run_id)
    home = newest_local_checkpoint(folder / "checkpoints")
    assert home is not None
    newest = int(home.name.split("-")[1])

    fresh_head, fresh_other = machines("head2"), machines("node2")
    engine.retarget_nodes(run_id, [_target(fresh_head.host(), spec), _target(fresh_other.host(), spec)])
    engine.prepare_resume(run_id)
    engine.ctx.set_spec(run_id, training={**engine.store.get(run_id).spec["training"], "max_steps": newest + 4})
    for node_record in engine.store.nodes_of(run_id):
        engine.ctx.set_spec(node_record.id, training={**node_record.spec["training"], "max_steps": newest + 4})
    finished = await asyncio.wait_for(engine.drive(run_id), 900)
    assert finished.state is RunState.FINISHED, finished.error
    events = mirrored_events(folder)
    resumed = [e for e in events if e["event"] == "state" and e.get("resume_from")]
    assert resumed and resumed[-1]["resume_from"] == f"checkpoint-{newest}", "continued from the newest at home"
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps[-1] == newest + 4
    (fresh_node,) = engine.store.nodes_of(run_id)
    assert fresh_node.target == fresh_other.host().url
    sent = Path(str(fresh_node.remote_dir)) / "out" / "checkpoints" / home.name
    assert {p.name for p in home.iterdir()} <= {p.name for p in sent.iterdir()}, "all of it, to every machine"


def _target(host: SshHost, spec):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    workdir = str(Path(spec.target.workdir).parent / "fresh")
    return replace(spec.target, user=host.user, host=host.host, port=host.port, host_key=None, workdir=workdir)
