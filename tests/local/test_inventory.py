"""What the Models page lists and deletes: returned adapters with their cost, exports by kind, what a step needs."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.core.runs.states import RunState
from desktop.services.local import tools
from desktop.services.local.base_model import BaseState, base_availability, hub_cache, hub_download_bytes
from desktop.services.local.common import LocalToolError, partial_name
from desktop.services.local.inventory import ExportedItem, ExportKind, exports_folder, remove_export, scan_exports
from desktop.services.local.needs import needs_now
from desktop.services.local.tools import LocalStep, install_commands, missing_tools
from desktop.services.runs.adapters import delete_adapter, read_inventory
from desktop.services.runs.store import RunLiveError, RunStore
from tests.fakes.hub import FakeHub, HubRepo
from tests.fixtures.adapters import TrainedAdapter
from tests.fixtures.exported_models import (
    STATE_SECONDS,
    record_returned_run,
    record_stopped_run,
    seed_exports,
    write_gguf,
)
from tests.fixtures.tiny_models import TinyModel
from trainer_payload.checkpoints import seal_checkpoint


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    served = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", served.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline; this Hub is local
    yield served
    served.stop()


def test_every_kind_of_export_is_listed_and_nothing_half_written(pattern_adapter: TrainedAdapter) -> None:
    folder = seed_exports("20261201-071200-ab12", pattern_adapter.path)
    write_gguf(partial_name(folder / "model-Q6_K.gguf"))  # an export still being written
    (folder / ".work" / "merged").mkdir(parents=True)
    (folder / "notes.txt").write_text("not an export")

    items = scan_exports(folder)

    assert [(item.kind, item.path.name, item.qtype, item.of_base) for item in items] == [
        (ExportKind.GGUF, "model-Q4_K_M.gguf", "Q4_K_M", False),
        (ExportKind.GGUF, "model-Q8_0.gguf", "Q8_0", False),
        (ExportKind.GGUF, "base-Q8_0.gguf", "Q8_0", True),
        (ExportKind.GGUF_LORA, "adapter-lora.gguf", "F16", False),
        (ExportKind.MERGED, "merged", None, False),
        (ExportKind.MODELFILE, "Modelfile", None, False),
        (ExportKind.COMPARE_REPORT, "report.html", None, False),
    ]
    assert items[0].bytes == 4_683_073_536 and items[0].chat_engine == "llama.cpp"
    assert items[3].chat_engine is None  # a LoRA goes beside its base, never alone


def test_a_gguf_type_comes_from_its_header_and_a_damaged_one_says_so(tmp_path: Path) -> None:
    write_gguf(tmp_path / "model.gguf", file_type=17)
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00")
    found = {item.path.name: item for item in scan_exports(tmp_path)}
    assert found["model.gguf"].qtype == "Q5_K_M" and not found["model.gguf"].damaged
    assert found["cut.gguf"].damaged and found["cut.gguf"].chat_engine is None


def test_a_returned_adapter_is_listed_with_its_time_cost_and_exports(pattern_adapter: TrainedAdapter) -> None:
    store = RunStore()
    own = record_returned_run(store, pattern_adapter.path, base=str(pattern_adapter.base), hourly_rate=2.0)
    rented = record_returned_run(store, pattern_adapter.path, rented_price=2.5, finished_ago=7200)
    unpriced = record_returned_run(store, pattern_adapter.path, finished_ago=9000)
    store.create({"base_model": "x"}, None)  # a run with no adapter yet is not a model
    seed_exports(own, pattern_adapter.path)

    inventory = read_inventory(store)

    by_id = {adapter.run_id: adapter for adapter in inventory.adapters}
    assert [a.run_id for a in inventory.adapters] == [own, rented, unpriced]  # newest first
    adapter = by_id[own]
    assert adapter.trained_seconds == 72 * 60
    assert adapter.source.base == str(pattern_adapter.base)
    assert adapter.bytes == sum(p.stat().st_size for p in adapter.source.adapter.rglob("*") if p.is_file())
    own_seconds = sum(seconds for state, seconds in STATE_SECONDS.items() if state is not RunState.PROVISIONING)
    assert round(adapter.usd or 0, 2) == round(2.0 * own_seconds / 3600, 2)
    assert not adapter.rented and len(adapter.exports) == 7
    assert by_id[rented].rented and round(by_id[rented].usd or 0, 2) == round(
        2.5 * sum(STATE_SECONDS.values()) / 3600, 2
    )
    assert by_id[unpriced].usd is None
    assert not inventory.leftovers


def test_every_complete_adapter_checkpoint_of_any_run_is_an_adapter_of_its_own(
    pattern_adapter: TrainedAdapter,
) -> None:
    store = RunStore()
    stopped = record_stopped_run(store, pattern_adapter.path, 20, base="org/base", eval_file=Path("held.jsonl"))
    checkpoints = store.folder(stopped) / "checkpoints"
    shutil.copytree(checkpoints / "checkpoint-20", checkpoints / "checkpoint-40")
    seal_checkpoint(checkpoints / "checkpoint-40", 40)
    shutil.copytree(pattern_adapter.path, checkpoints / "checkpoint-60")  # still being pulled: no marker yet
    full = checkpoints / "checkpoint-80"  # a full fine-tune's checkpoint is a whole model, not an adapter
    full.mkdir()
    (full / "config.json").write_text("{}", encoding="utf-8")
    seal_checkpoint(full, 80)
    finished = record_returned_run(store, pattern_adapter.path, finished_ago=7200)
    write_gguf(exports_folder(f"{stopped}-step-40") / "model-Q8_0.gguf", file_type=7)

    inventory = read_inventory(store)

    listed = [(a.run_id, a.step, a.state) for a in inventory.adapters]
    assert listed == [(stopped, 40, "cancelled"), (stopped, 20, "cancelled"), (finished, None, "finished")]
    newest = inventory.adapters[0]
    assert newest.is_checkpoint and newest.source.adapter == (checkpoints / "checkpoint-40").resolve()
    assert newest.source.base == "org/base" and newest.source.eval_file == Path("held.jsonl")
    assert newest.source.run_id == stopped and newest.export_folder == exports_folder(f"{stopped}-step-40")
    assert [item.path.name for item in newest.exports] == ["model-Q8_0.gguf"]
    assert not inventory.leftovers  # a checkpoint's export folder belongs to it
    assert not inventory.adapters[2].is_checkpoint and inventory.adapters[2].export_folder == exports_folder(finished)


def test_exports_of_a_deleted_run_are_still_listed(pattern_adapter: TrainedAdapter) -> None:
    store = RunStore()
    run_id = record_returned_run(store, pattern_adapter.path)
    seed_exports(run_id, pattern_adapter.path)
    store.delete(run_id)
    inventory = read_inventory(store)
    assert not inventory.adapters
    assert [item.path.name for item in inventory.leftovers[run_id]][:1] == ["model-Q4_K_M.gguf"]


def test_deleting_an_adapter_removes_only_its_folder_and_only_when_the_run_ended(
    pattern_adapter: TrainedAdapter,
) -> None:
    store = RunStore()
    run_id = record_returned_run(store, pattern_adapter.path)
    seed_exports(run_id, pattern_adapter.path)
    folder = Path(store.get(run_id).adapter or "")

    deleted = delete_adapter(store, run_id)

    assert deleted == folder.resolve() and not folder.exists()
    assert store.get(run_id).adapter is None and store.get(run_id).state is RunState.FINISHED
    assert scan_exports(exports_folder(run_id))  # its exports stay
    assert pattern_adapter.path.is_dir()  # the copy went, never the original
    with pytest.raises(RunLiveError, match="has no adapter"):
        delete_adapter(store, run_id)


def test_a_live_runs_adapter_and_a_folder_outside_rentune_are_never_deleted(pattern_adapter: TrainedAdapter) -> None:
    store = RunStore()
    live = store.create({"base_model": "x"}, None)
    store.transition(live.id, RunState.CONNECTING)
    store.update(live.id, adapter=str(pattern_adapter.path))
    with pytest.raises(RunLiveError, match="connecting"):
        delete_adapter(store, live.id)
    outside = record_returned_run(store, pattern_adapter.path)
    store.update(outside, adapter=str(pattern_adapter.path))
    with pytest.raises(OSError, match="not in Rentune's runs folder"):
        delete_adapter(store, outside)
    assert (pattern_adapter.path / "adapter_config.json").is_file()


def test_removing_an_export_stays_inside_the_exports(pattern_adapter: TrainedAdapter, tmp_path: Path) -> None:
    folder = seed_exports("r1", pattern_adapter.path)
    items = {item.kind: item for item in scan_exports(folder)}
    remove_export(items[ExportKind.COMPARE_REPORT])
    remove_export(items[ExportKind.MERGED])
    assert not (folder / "compare").exists() and not (folder / "merged").exists()
    outside = write_gguf(tmp_path / "mine.gguf")
    with pytest.raises(LocalToolError, match="not in Rentune's exports folder"):
        remove_export(ExportedItem(ExportKind.GGUF, outside, 1))
    assert outside.is_file()


def test_missing_libraries_are_found_without_importing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tools.importable("json") and not tools.importable("no_such_module_rentune")
    assert missing_tools([LocalStep.GGUF, LocalStep.CHAT_GGUF]) == []  # the test venv has them all
    monkeypatch.setattr(tools, "importable", lambda module: module not in ("llama_cpp", "peft"))
    missing = missing_tools([LocalStep.GGUF, LocalStep.CHAT_GGUF])
    assert [tool.distribution for tool in missing] == ["peft", "llama-cpp-python"]
    assert install_commands(missing) == ["rentune tools install"] and install_commands([]) == []
    assert not needs_now([LocalStep.CHAT_GGUF], None).ready


def test_the_base_model_is_here_cached_to_download_or_unusable(tiny_model: TinyModel, hub: FakeHub) -> None:
    assert base_availability(str(tiny_model.path)).state is BaseState.HERE
    assert base_availability(None).state is BaseState.UNNAMED
    assert base_availability("not a model").state is BaseState.NOT_FOUND
    assert base_availability(str(tiny_model.path.parent)).state is BaseState.NOT_A_MODEL
    assert base_availability("someone/tiny").state is BaseState.DOWNLOAD
    assert base_availability("Qwen/Qwen2.5-0.5B-Instruct").state is BaseState.DOWNLOAD  # dots are not suffixes
    assert base_availability("models/missing.gguf").state is BaseState.NOT_FOUND
    snapshot = hub_cache() / "models--someone--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")
    assert base_availability("someone/tiny").folder == snapshot


def test_the_download_size_comes_from_the_hub(tiny_model: TinyModel, hub: FakeHub) -> None:
    hub.repos["someone/tiny"] = HubRepo(tiny_model.path)
    wanted = [p for p in tiny_model.path.iterdir() if p.suffix in (".json", ".safetensors", ".jinja", ".txt")]
    assert asyncio.run(hub_download_bytes("someone/tiny")) == sum(p.stat().st_size for p in wanted)
    assert asyncio.run(hub_download_bytes("nobody/nothing")) is None


def test_gguf_steps_say_the_converters_download_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTUNE_TOOLS_CACHE", str(tmp_path / "empty-cache"))
    assert needs_now([LocalStep.GGUF], None).converters
    assert not needs_now([LocalStep.MERGE], None).converters
