"""A checkpoint of a run across several machines comes home with every machine's part: the head's files, then what
only the other machines' ranks wrote (RNG states; a full fine-tune's shards), each verified against that machine's own
seal. The machines are in memory (:class:`FakeHost`); the same flow over real sshds is in test_several_machines.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from desktop.core.runs.spec import RunSpec, SshTarget
from desktop.core.runs.states import RunState
from desktop.services.machines.failures import PermanentError
from desktop.services.machines.ssh import Endpoint
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs import checkpoints, connection, nodes
from desktop.services.runs.checkpoints import part_files
from desktop.services.runs.engine import EngineOptions, RunEngine
from desktop.services.runs.nodes import Nodes
from desktop.services.runs.store import RunRecord, RunStore
from tests.fixtures.fake_machine import FakeHost, FakeMachine
from trainer_payload.checkpoints import is_complete
from trainer_payload.protocol import CHECKPOINT_MARKER, CheckpointEvent, EventKind

FAST = EngineOptions(poll_seconds=0.02, grace_seconds=0.5)
CHECKPOINT = "checkpoints/checkpoint-4"
HEAD_FILES = {"adapter_model.safetensors": b"head weights", "rng_state_0.pth": b"rank 0 rng"}
NODE_FILES = {"adapter_model.safetensors": b"node copy", "rng_state_1.pth": b"rank 1 rng"}


def seal(host: FakeHost, folder: str, files: dict[str, bytes]) -> dict[str, str]:
    """Writes a checkpoint as the payload seals it (files, then the marker listing each size and SHA-256)."""
    listed = {}
    for name, data in files.items():
        host.files[f"{folder}/{name}"] = data
        listed[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    host.files[f"{folder}/{CHECKPOINT_MARKER}"] = json.dumps({"step": 4, "files": listed}).encode()
    return {name: info["sha256"] for name, info in listed.items()}


class TwoMachines:
    """A head and one node in memory, each reached at its own address with its own host key."""

    def __init__(self, tmp_path: Path, training: dict[str, object]) -> None:
        self.head, self.node = FakeHost("/home/head"), FakeHost("/home/node")
        self.lines: list[str] = []
        self.engine = RunEngine(RunStore(), SecretStore(), FAST, report=self.lines.append, connect=self.connect)
        train = tmp_path / "train.jsonl"
        train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
        spec = RunSpec(
            "org/tiny-model",
            train,
            None,
            {"max_steps": 8, **training},
            SshTarget("trainer", "head.example", 22),
            nodes=(SshTarget("trainer", "node.example", 22),),
            head_address="10.0.0.1",
        )
        self.record: RunRecord = self.engine.create(spec)
        (self.node_record,) = self.engine.store.nodes_of(self.record.id)

    async def connect(self, endpoint: Endpoint, pinned: str | None, time_limit: float) -> FakeMachine:
        host = self.head if endpoint.host == "head.example" else self.node
        return await host.connect(endpoint, pinned, time_limit)

    def folder(self, record: RunRecord) -> str:
        return f"{self.engine.store.get(record.id).remote_dir}/out/{CHECKPOINT}"

    async def pull_prepared(self, prepare_node: Callable[[], object]) -> None:
        """The head seals checkpoint-4, ``prepare_node`` writes the node's part (or not); then it is pulled home."""
        ctx, run_id = self.engine.ctx, self.record.id
        others = Nodes(ctx, run_id)
        head = await connection.connect(ctx, run_id, install_key=True)
        await others.machine(self.node_record.id)  # logged in: the node's folder is known from here on
        prepare_node()
        digests = seal(self.head, self.folder(self.record), HEAD_FILES)
        event: CheckpointEvent = {
            "ts": 0.0, "seq": 1, "event": EventKind.CHECKPOINT, "step": 4, "path": CHECKPOINT, "bytes": 22,
            "sha256": digests,
        }  # fmt: skip
        try:
            await checkpoints.pull_checkpoint(ctx, run_id, head, event, others)
        finally:
            await others.close()


@pytest.fixture
def fast_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "PART_WAIT_SECONDS", 0.3)


async def test_every_machines_part_comes_home_and_the_marker_lists_them_all(tmp_path: Path) -> None:
    two = TwoMachines(tmp_path, {"method": "lora"})
    await two.pull_prepared(lambda: seal(two.node, two.folder(two.node_record), NODE_FILES))
    home = two.engine.folder(two.record.id) / CHECKPOINT
    assert is_complete(home), "complete at home, every file verified"
    assert (home / "adapter_model.safetensors").read_bytes() == b"head weights", "a file both wrote: the head's"
    assert (home / "rng_state_1.pth").read_bytes() == b"rank 1 rng", "what only the node wrote came from it"
    listed = json.loads((home / CHECKPOINT_MARKER).read_text())["files"]
    assert sorted(listed) == ["adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth"]
    assert not (home / f"{CHECKPOINT_MARKER}.head").exists()


async def test_an_adapters_checkpoint_comes_without_a_node_that_never_sealed_it(
    tmp_path: Path, fast_parts: None
) -> None:
    two = TwoMachines(tmp_path, {"method": "lora"})
    await two.pull_prepared(lambda: None)
    home = two.engine.folder(two.record.id) / CHECKPOINT
    assert is_complete(home) and not (home / "rng_state_1.pth").exists()
    assert any("its part of checkpoints/checkpoint-4 cannot be had" in line for line in two.lines)


async def test_a_sharded_checkpoint_without_every_part_is_never_taken_for_complete(
    tmp_path: Path, fast_parts: None
) -> None:
    two = TwoMachines(tmp_path, {"method": "full", "strategy": "fsdp"})
    await two.pull_prepared(lambda: None)
    home = two.engine.folder(two.record.id) / CHECKPOINT
    assert not (home / CHECKPOINT_MARKER).exists(), "no marker: never resumed from"
    assert any("could not be pulled" in line and "node 1" in line for line in two.lines)


async def test_a_node_file_that_does_not_match_its_seal_leaves_the_checkpoint_incomplete(tmp_path: Path) -> None:
    two = TwoMachines(tmp_path, {"method": "lora"})

    def tampered() -> None:
        folder = two.folder(two.node_record)
        seal(two.node, folder, NODE_FILES)
        two.node.files[f"{folder}/rng_state_1.pth"] = b"changed after the seal"

    await two.pull_prepared(tampered)
    assert not (two.engine.folder(two.record.id) / CHECKPOINT / CHECKPOINT_MARKER).exists()


async def test_a_node_seal_naming_a_path_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    two = TwoMachines(tmp_path, {"method": "lora"})

    def hostile() -> None:
        two.node.files[f"{two.folder(two.node_record)}/{CHECKPOINT_MARKER}"] = json.dumps(
            {"files": {"../../../.bashrc": {"bytes": 1, "sha256": "0" * 64}}}
        ).encode()

    with pytest.raises(PermanentError, match="unsafe path"):
        await two.pull_prepared(hostile)
    assert not (two.engine.folder(two.record.id) / CHECKPOINT / CHECKPOINT_MARKER).exists()


@pytest.mark.parametrize(
    ("seal_bytes", "problem"),
    [
        (b"\xff not json", "damaged checkpoint seal"),
        (b'{"files": ["a"]}', "no list of files"),
        (b'{"files": {"a.bin": {"bytes": 3}}}', "without a size and SHA-256"),
        (b'{"files": {"a.bin": {"bytes": -1, "sha256": "' + b"a" * 64 + b'"}}}', "without a size and SHA-256"),
        (b'{"files": {"rentune_checkpoint.json.head": {"bytes": 1, "sha256": "' + b"a" * 64 + b'"}}}', "reserved"),
        (b'{"files": {"/etc/passwd": {"bytes": 1, "sha256": "' + b"a" * 64 + b'"}}}', "unsafe path"),
    ],
)
def test_a_damaged_or_hostile_seal_is_refused_with_what_is_wrong(seal_bytes: bytes, problem: str) -> None:
    with pytest.raises(PermanentError, match=problem):
        part_files(seal_bytes, known=())


def test_files_the_head_has_are_not_taken_from_a_node() -> None:
    digest = "b" * 64
    sealed = json.dumps({"files": {"x": {"bytes": 1, "sha256": digest}, "y": {"bytes": 2, "sha256": digest}}})
    assert part_files(sealed.encode(), known={"x"}) == {"y": (2, digest)}


async def test_a_trainer_that_dies_starts_again_on_every_machine_from_the_newest_checkpoint_at_home(
    tmp_path: Path,
) -> None:
    """The head's trainer dies without a word: every machine starts again from the checkpoint at home (all its
    parts), and one a machine sealed alone (a newer one on the node) is deleted first, never resumed from."""
    two = TwoMachines(tmp_path, {"method": "lora"})

    def head_trains(host: FakeHost, folder: str) -> None:
        if host.launches == 1:
            digests = seal(host, f"{folder}/out/{CHECKPOINT}", HEAD_FILES)
            host.emit(EventKind.CHECKPOINT, step=4, path=CHECKPOINT, bytes=22, sha256=digests)
            host.trainer_pid = None  # died, without a final event
            return
        files = host.write_folder(f"{folder}/out/adapter", {"adapter_model.safetensors": b"final weights"})
        host.emit(EventKind.DONE, adapter_path="adapter", files=files)

    def node_trains(host: FakeHost, folder: str) -> None:
        if host.launches == 1:
            seal(host, f"{folder}/out/{CHECKPOINT}", NODE_FILES)
            seal(host, f"{folder}/out/checkpoints/checkpoint-9999", {"trainer_state.json": b"{}"})

    two.head.on_launch, two.node.on_launch = head_trains, node_trains
    finished = await asyncio.wait_for(two.engine.drive(two.record.id), 60)
    assert finished.state is RunState.FINISHED, finished.error
    assert finished.relaunches == 1 and (two.head.launches, two.node.launches) == (2, 2)
    node_dir = f"{two.engine.store.get(two.node_record.id).remote_dir}/out/checkpoints"
    assert not [name for name in two.node.files if name.startswith(f"{node_dir}/checkpoint-9999/")], "deleted"
    head_dir = f"{two.engine.store.get(two.record.id).remote_dir}/out/checkpoints"
    for host, folder in ((two.head, head_dir), (two.node, node_dir)):
        sent = {name.rsplit("/", 1)[1] for name in host.files if name.startswith(f"{folder}/checkpoint-4/")}
        assert sent >= {"adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth", CHECKPOINT_MARKER}
    assert two.head.files[f"{head_dir}/checkpoint-4/rng_state_1.pth"] == b"rank 1 rng", "rank 1's, on the head too"
