"""Export on the machine, the many cases in-process: an in-memory machine whose export writes or says what a test
scripts. End to end with real parts: test_export_on_machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path

import pytest

from desktop.core.runs.spec import JudgeSpec, RunSpec, RunSpecError, SshTarget, run_spec_from_dict
from desktop.core.runs.states import RunState
from desktop.services.local.inventory import exports_folder
from desktop.services.runs.engine import RunEngine
from desktop.services.runs.store import RunRecord
from tests.fixtures.fake_machine import FakeHost, Script
from tests.runs.test_engine_logic import host, make_engine, trains_to_the_end  # noqa: F401 - host: the fixture
from trainer_payload.protocol import EventKind


def create(engine: RunEngine, tmp_path: Path, on_machine: tuple[str, ...] = ("merged",)) -> str:
    train = tmp_path / "train.jsonl"
    train.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    target = SshTarget("trainer", "gpu.example", 22)
    spec = RunSpec("org/tiny-model", train, None, {"max_steps": 4}, target, export_on_machine=on_machine)
    return engine.create(spec).id


def merged_written(machine: FakeHost, folder: str) -> None:
    """The export a machine runs: a merged folder, hashed, and its ``exported`` event."""
    files = {"export/merged/config.json": b"{}", "export/merged/model.safetensors": b"merged weights"}
    for name, data in files.items():
        machine.files[f"{folder}/out/{name}"] = data
    machine.emit(EventKind.EXPORT, phase="merging: loading the base model", fraction=0.1)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    machine.emit(EventKind.EXPORTED, files=digests, outputs={"merged": "export/merged"}, merge_check={"ok": True})


async def trained_and_exported(
    machine: FakeHost, tmp_path: Path, export: Script | None, on_machine: tuple[str, ...] = ("merged",)
) -> tuple[RunRecord, list[str]]:
    """Drives a run that trains to the end, then exports on the machine as ``export`` scripts; the record and lines."""
    lines: list[str] = []
    engine = make_engine(machine, lines)
    run_id = create(engine, tmp_path, on_machine)
    machine.on_launch = trains_to_the_end
    if export is not None:
        machine.on_export = export
    return await asyncio.wait_for(engine.drive(run_id), 30), lines


async def test_the_outputs_come_home_into_the_runs_export_folder_before_the_run_finishes(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    final, lines = await trained_and_exported(host, tmp_path, merged_written)
    run_id = final.id
    assert final.state is RunState.FINISHED, final.error
    merged = exports_folder(run_id) / "merged"
    assert (merged / "model.safetensors").read_bytes() == b"merged weights"
    assert sorted(p.name for p in exports_folder(run_id).iterdir()) == ["merged"], "the partial folder is gone"
    assert final.spec["exported_on_machine"] == {"merged": "export/merged"}
    assert "on the machine: merging: loading the base model" in lines
    job = next(stdin for stdin in host.stdins if '"adapter"' in stdin)
    assert json.loads(job) == {"adapter": "adapter", "merged": True, "gguf": []}, "the job reaches it on stdin"


async def test_a_failed_export_finishes_the_run_with_its_adapter_and_says_why(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    failing: Script = lambda h, _f: h.emit(EventKind.EXPORTED, files={}, error="RuntimeError: out of disk")  # noqa: E731
    final, lines = await trained_and_exported(host, tmp_path, failing)
    run_id = final.id
    assert final.state is RunState.FINISHED and final.adapter is not None, "the adapter is home either way"
    assert final.spec["export_error"] == "RuntimeError: out of disk"
    assert any("the export on the machine failed: RuntimeError: out of disk" in line for line in lines)
    assert not exports_folder(run_id).exists() or not any(exports_folder(run_id).iterdir())


async def test_an_export_that_dies_without_a_word_is_said_with_its_logs_last_lines(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    final, _lines = await trained_and_exported(host, tmp_path, None)  # it ends silently (the kernel killed it, say)
    assert final.state is RunState.FINISHED
    assert str(final.spec["export_error"]).startswith("the export ended without a result")
    assert host.exports == 1, "started once, not again and again"


async def test_a_machine_naming_an_output_it_did_not_hash_gets_nothing_written(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    def lies(h: FakeHost, folder: str) -> None:
        h.files[f"{folder}/out/export/a.gguf"] = b"x"
        digest = hashlib.sha256(b"x").hexdigest()
        h.emit(EventKind.EXPORTED, files={"export/a.gguf": digest}, outputs={"merged": "export/merged"})

    final, _lines = await trained_and_exported(host, tmp_path, lies)
    assert final.state is RunState.FINISHED
    assert "named an output it did not send: 'export/merged'" in str(final.spec["export_error"])
    assert not (exports_folder(final.id) / "merged").exists()


def test_the_spec_takes_only_outputs_the_machine_can_make() -> None:
    base = {"model": {"base": "org/model"}, "data": {"train": "t.jsonl"}, "target": {"ssh": "ssh://u@h:22"}}
    spec = run_spec_from_dict({**base, "export": {"on_machine": ["merged", "gguf:Q8_0"]}}, Path("/tmp"))
    assert spec.export_on_machine == ("merged", "gguf:Q8_0")
    assert run_spec_from_dict({**base, "export": {"on_machine": ["gguf:Q4_K_M"]}}, Path("/tmp")).export_on_machine
    with pytest.raises(RunSpecError, match=r"the machine can make merged, gguf:F16, gguf:BF16, gguf:Q8_0, gguf:Q4_K_M"):
        run_spec_from_dict({**base, "export": {"on_machine": ["gguf:IQ2_XS"]}}, Path("/tmp"))
    with pytest.raises(RunSpecError, match=r'must be a list, like on_machine = \["merged", "gguf:Q8_0"\]'):
        run_spec_from_dict({**base, "export": {"on_machine": "merged"}}, Path("/tmp"))
    with pytest.raises(RunSpecError, match=r"does not know where"):
        run_spec_from_dict({**base, "export": {"where": "machine"}}, Path("/tmp"))
    full = {**base, "training": {"method": "full"}, "export": {"on_machine": ["merged"]}}
    with pytest.raises(RunSpecError, match="merges an adapter"):
        run_spec_from_dict(full, Path("/tmp"))


async def test_a_gguf_the_machine_could_not_make_is_said_and_the_rest_still_comes_home(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    no_compiler = "GGUF Q4_K_M could not be made on the machine: this machine has no cmake or C++ compiler"

    def merged_only(machine: FakeHost, folder: str) -> None:
        merged_written(machine, folder)
        exported = machine.events.pop()
        machine.emit(
            EventKind.EXPORTED,
            **{k: v for k, v in exported.items() if k not in ("ts", "seq", "event")},
            notes=[no_compiler],
        )

    final, lines = await trained_and_exported(host, tmp_path, merged_only, ("merged", "gguf:Q4_K_M"))
    assert final.state is RunState.FINISHED and final.spec["export_error"] is None
    assert (exports_folder(final.id) / "merged" / "model.safetensors").is_file()
    assert final.spec["export_notes"] == [no_compiler] and no_compiler in lines
    assert any("rm -rf" in c and "/out/export" in c and "/tools" in c for c in host.commands), (
        "the machine's disk freed"
    )


async def test_an_app_closed_while_the_machine_exports_follows_that_export_when_it_comes_back(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    engine = make_engine(host, lines)
    run_id = create(engine, tmp_path)

    def starts_and_keeps_going(machine: FakeHost, _folder: str) -> None:
        machine.export_running = True
        machine.emit(EventKind.EXPORT, phase="merging: loading the base model", fraction=0.0)

    host.on_launch, host.on_export = trains_to_the_end, starts_and_keeps_going
    first = asyncio.ensure_future(engine.drive(run_id))
    while "on the machine: merging: loading the base model" not in lines:
        await asyncio.sleep(0.01)
    first.cancel()  # the app is closed mid-export; the machine goes on
    with contextlib.suppress(asyncio.CancelledError):
        await first
    assert engine.store.get(run_id).state is RunState.PULLING

    again = make_engine(host, lines)  # the app opened again: a new engine on the same runs
    second = asyncio.ensure_future(again.drive(run_id))
    await asyncio.sleep(0.3)
    assert host.exports == 1, "the running export is followed, not started again"
    host.export_running = False
    merged_written(host, host.folder)  # it ends while the app watches
    final = await asyncio.wait_for(second, 30)
    assert final.state is RunState.FINISHED and final.spec["exported_on_machine"] == {"merged": "export/merged"}
    assert host.exports == 1 and (exports_folder(run_id) / "merged" / "model.safetensors").is_file()


# -- judging on the machine ------------------------------------------------------------------------------------------

ANSWERS = {
    "usable_rows": 9,
    "base_loss": 3.2,
    "tuned_loss": 0.4,
    "examples": [
        {"line": n, "prompt": f"q{n}", "reference": f"a{n}", "base_answer": "no idea", "tuned_answer": f"a{n}"}
        for n in range(1, 9)
    ],
}


def judged(answers: bytes) -> Script:
    """The machine's export when only judging is asked: its answers file, hashed, and the ``exported`` event."""

    def script(machine: FakeHost, folder: str) -> None:
        machine.files[f"{folder}/out/export/judge.json"] = answers
        machine.emit(EventKind.EXPORT, phase="judging: example 1 of 2", fraction=0.0)
        digest = hashlib.sha256(answers).hexdigest()
        machine.emit(EventKind.EXPORTED, files={"export/judge.json": digest}, outputs={"judge": "export/judge.json"})

    return script


async def judged_run(machine: FakeHost, tmp_path: Path, answers: bytes) -> tuple[RunRecord, list[str]]:
    """Drives a run with ``[judge] on_machine`` (and no export) whose machine answers with ``answers``."""
    lines: list[str] = []
    engine = make_engine(machine, lines)
    train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    for path in (train, held_out):
        path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    target = SshTarget("trainer", "gpu.example", 22)
    spec = RunSpec("org/tiny-model", train, held_out, {"max_steps": 4}, target, judge=JudgeSpec(8, 16))
    run_id = engine.create(spec).id
    machine.on_launch, machine.on_export = trains_to_the_end, judged(answers)
    return await asyncio.wait_for(engine.drive(run_id), 30), lines


async def test_a_run_judged_on_its_machine_ends_with_the_compare_report_and_the_data_deleted_after(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
) -> None:
    final, lines = await judged_run(host, tmp_path, json.dumps(ANSWERS).encode())
    assert final.state is RunState.FINISHED, final.error
    compare = exports_folder(final.id) / "compare"
    assert sorted(p.name for p in exports_folder(final.id).iterdir()) == ["compare"]
    assert sorted(p.name for p in compare.iterdir()) == ["answers.json", "report.html", "report.json", "report.md"]
    report = json.loads((compare / "report.json").read_text())
    assert (report["outcome"], report["usable_rows"]) == ("better", 9)
    assert [(s["base_right"], s["tuned_right"]) for s in report["scores"]] == [(0, 8), (0, 8)]
    assert report["judged_on"] == "the rented machine, before it was let go"
    assert final.spec["judged_on_machine"] == str(compare / "report.md")
    assert any(line.startswith("judged on the machine: The fine-tune is better") for line in lines), lines
    job = json.loads(next(stdin for stdin in host.stdins if '"adapter"' in stdin))
    assert job == {
        "adapter": "adapter",
        "merged": False,
        "gguf": [],
        "judge": {"max_examples": 8, "max_new_tokens": 16},
    }
    export_at = next(i for i, c in enumerate(host.commands) if "trainer_payload export" in c)
    data_removed_at = next(i for i, c in enumerate(host.commands) if c.startswith("rm -rf") and c.endswith("/data"))
    assert export_at < data_removed_at, "the held-out rows stay on the machine until judged"


@pytest.mark.parametrize(
    ("answers", "why"),
    [
        (b"[1, 2]", "is not a JSON object"),
        (json.dumps({**ANSWERS, "examples": [{"line": "x"}]}).encode(), "not one Rentune wrote"),
        (json.dumps({**ANSWERS, "base_loss": "low"}).encode(), "not one Rentune wrote"),
        (b"\xff not json", "codec can't decode"),
    ],
)
async def test_answers_the_machine_garbled_are_said_and_the_run_still_finishes(
    host: FakeHost,  # noqa: F811
    tmp_path: Path,
    answers: bytes,
    why: str,
) -> None:
    final, lines = await judged_run(host, tmp_path, answers)
    assert final.state is RunState.FINISHED and final.adapter is not None
    said = [line for line in lines if line.startswith("the machine's answers could not be read")]
    assert said and why in said[0] and said[0].endswith("compare on the Models page instead"), lines
    assert not (exports_folder(final.id) / "compare").exists() and "judged_on_machine" not in final.spec
