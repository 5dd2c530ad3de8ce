"""Deleting a run from the real SQLite store: the folder and the record go; live runs are refused."""

from __future__ import annotations

import pytest

from desktop.core.runs.states import RunState
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.runs.store import RunLiveError, RunStore, UnknownRunError

SPEC = {"base_model": "tiny", "training": {"method": "lora"}, "hourly_rate_usd": 1.0}


def run_in(store: RunStore, *states: RunState) -> str:
    run_id = store.create(SPEC, "ssh://me@127.0.0.1:22").id
    for state in states:
        store.transition(run_id, state)
    return run_id


@pytest.mark.parametrize("end", [RunState.FINISHED, RunState.CANCELLED, RunState.FAILED])
def test_delete_removes_the_folder_the_record_and_its_history(end: RunState) -> None:
    store = RunStore()
    keep = run_in(store, RunState.CONNECTING, RunState.FINISHED)
    run_id = run_in(store, RunState.CONNECTING, RunState.TRAINING, end)
    checkpoint = store.folder(run_id) / "checkpoints" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
    store.delete(run_id)
    assert not (store.runs_dir / run_id).exists()
    with pytest.raises(UnknownRunError):
        store.get(run_id)
    assert store.transitions(run_id) == []
    assert [r.id for r in store.all()] == [keep], "other runs are untouched"
    assert (store.runs_dir / keep).is_dir()


@pytest.mark.parametrize("state", [RunState.PLANNED, RunState.TRAINING, RunState.PULLING, RunState.PAUSED])
def test_delete_refuses_live_and_paused_runs(state: RunState) -> None:
    store = RunStore()
    run_id = run_in(store, *([] if state is RunState.PLANNED else [RunState.CONNECTING, state]))
    (store.folder(run_id) / "events.jsonl").write_text("{}\n")
    with pytest.raises(RunLiveError, match=f"is {state.value}; stop it"):
        store.delete(run_id)
    assert (store.runs_dir / run_id / "events.jsonl").exists()
    assert store.get(run_id).state is state


def test_delete_needs_the_whole_id() -> None:
    store = RunStore()
    run_id = run_in(store, RunState.CANCELLED)
    with pytest.raises(UnknownRunError, match="whole run id"):
        store.delete(run_id[:10])
    assert store.get(run_id).id == run_id


def test_errors_and_notes_are_written_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    vast = "vast-" + "k3y-0123456789abcdef"
    monkeypatch.setenv("VAST_API_KEY", vast)
    typed = "rk_typed_" + "9z8y7x6w5v4u"
    SecretStore().set(SecretName.RUNPOD, typed)
    store = RunStore()
    run_id = run_in(store, RunState.CONNECTING)
    store.transition(run_id, RunState.FAILED, f"the provider refused key {vast}")
    record = store.update(run_id, error=f"create failed: 401 for {typed} (hf_{'a1B2c3D4e5F6g7H8i9J0kLmN'})")
    assert record.error == "create failed: 401 for *** (***)"
    assert store.transitions(run_id)[-1]["note"] == "the provider refused key ***"
    raw = store.path.read_bytes()
    assert vast.encode() not in raw and typed.encode() not in raw


def test_the_other_machines_of_a_run_are_listed_with_it_found_by_their_id_and_deleted_with_it() -> None:
    store = RunStore()
    head = store.create({"training": {}}, "ssh://me@a:22")
    nodes = [
        store.create({"training": {}}, f"ssh://me@{h}:22", node_of=head.id, rank=r) for r, h in ((2, "c"), (1, "b"))
    ]
    assert [r.id for r in store.all()] == [head.id], "listed as one run"
    assert {r.id for r in store.all(with_nodes=True)} == {head.id, *(n.id for n in nodes)}
    assert [r.target for r in store.nodes_of(head.id)] == ["ssh://me@b:22", "ssh://me@c:22"], "in rank order"
    assert store.get(head.id[:-2]).id == head.id, "a prefix names the run, never one of its machines"
    assert store.get(f"{head.id}.n1").target == "ssh://me@b:22"
    for record in [head, *nodes]:
        store.transition(record.id, RunState.CANCELLED)
    store.delete(head.id)
    assert store.all(with_nodes=True) == [] and not list(store.runs_dir.iterdir())


def test_runs_created_in_one_second_with_a_clashing_suffix_each_get_their_own_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sweep creates many runs per second; a drawn suffix that is taken is drawn again, never a crash."""
    import desktop.services.runs.store as store_module

    suffixes = iter(["ab12", "ab12", "ab12", "cd34", "ab12", "ef56"])
    monkeypatch.setattr(store_module.secrets, "token_hex", lambda _n: next(suffixes))
    monkeypatch.setattr(store_module.time, "strftime", lambda *_a: "20261207-101500-")
    store = RunStore()
    created = [store.create(SPEC, None).id, store.create(SPEC, None).id]
    finished = store.record_finished(SPEC, started=1.0, trained=(2.0, 3.0)).id
    assert [*created, finished] == ["20261207-101500-ab12", "20261207-101500-cd34", "20261207-101500-ef56"]
    assert all((store.runs_dir / run_id).is_dir() for run_id in [*created, finished])
    assert [t["note"] for t in store.transitions(created[1])] == ["created"]
