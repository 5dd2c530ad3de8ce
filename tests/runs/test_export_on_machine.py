"""Export on the machine, end to end: a rented machine (a real sshd behind the fake RunPod) trains a tiny Llama with
the real payload, judges base against tuned on the held-out rows, merges the adapter, writes a Q8_0 GGUF with
llama.cpp's converter and a Q4_K_M one with a quantise tool it builds over llama.cpp's library (about 140 CPU
seconds), and all come home verified before the machine is terminated. The machine's Q4_K_M is byte for byte the
file llama-cpp-python's full build writes at home.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.local.common import no_progress
from desktop.services.local.gguf import convert_to_gguf, quantize_gguf
from desktop.services.local.inventory import exports_folder
from desktop.services.runs.store import RunStore
from tests.fixtures.adapters import PATTERN
from tests.fixtures.tiny_models import TinyModel
from tests.runs.pattern_spec import write_pattern_spec
from tests.runs.test_rented_runs import CloudUnderTest, _assert_ledger_matches, _nothing_left, runpod  # noqa: F401

# The machine builds its quantise tool (about 140 CPU seconds) besides training.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _exporting_spec(folder: Path, base: Path, cloud: CloudUnderTest, on_machine: list[str], judge: str = "") -> Path:
    extra = f"[export]\non_machine = {json.dumps(on_machine)}\n{judge}"
    return write_pattern_spec(folder, base, cloud, extra=extra, held_out=bool(judge))


def _greedy(model: object, tokenizer: object) -> list[str]:
    answers = []
    for question, _ in PATTERN:
        inputs = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)  # type: ignore[attr-defined]
        answers.append(tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip())  # type: ignore[attr-defined]
    return answers


def _gguf_greedy(path: Path) -> list[str]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, verbose=False, seed=0)
    answers = []
    for question, _ in PATTERN:
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": question}], temperature=0.0, max_tokens=16
        )
        answers.append(str(reply["choices"][0]["message"]["content"]).strip())
    llm.close()
    return answers


def _quantized_at_home(merged: Path, folder: Path) -> Path:
    """Q4_K_M of ``merged`` made here: llama.cpp's converter to F16, then llama-cpp-python's own library."""

    folder.mkdir()

    async def make() -> Path:
        f16 = await convert_to_gguf(merged, folder / "home-F16.gguf", progress=no_progress)
        return (await quantize_gguf(f16, folder / "home-Q4_K_M.gguf", "Q4_K_M", progress=no_progress)).path

    return asyncio.run(make())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.longest  # about 4 minutes on a loaded 2-core machine
def test_the_machine_merges_and_converts_and_both_come_home_before_it_is_terminated(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture, imported
    gguf_tiny_model: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    judge = "[judge]\non_machine = true\nmax_new_tokens = 32\n"
    spec = _exporting_spec(tmp_path, gguf_tiny_model, runpod, ["merged", "gguf:Q8_0", "gguf:Q4_K_M"], judge)
    assert main(["run", str(spec)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "on the machine: merging" in out and "on the machine: building llama.cpp's quantise tool" in out
    assert "on the machine: judging: example 4 of 4" in out
    assert "judged on the machine: Leaning better" in out or "judged on the machine: The fine-tune is better" in out
    assert "made on the machine and verified at home: merged, gguf:Q8_0, gguf:Q4_K_M" in out
    # 64-wide rows cannot be K-quantised: said as the local export says it, from the file that came home
    fallbacks = [line for line in out.splitlines() if "weight tensors are stored as" in line]
    assert fallbacks and all(line.startswith("Q4_K_M: ") for line in fallbacks)
    assert all(line.endswith("it works as it is, nothing to do") for line in fallbacks)
    [run] = RunStore().all()
    assert run.state is RunState.FINISHED and run.spec.get("export_error") is None
    folder = exports_folder(run.id)
    merged, gguf, q4 = folder / "merged", folder / "model-Q8_0.gguf", folder / "model-Q4_K_M.gguf"
    assert (merged / "config.json").is_file() and gguf.is_file() and q4.is_file()
    assert sorted(p.name for p in folder.iterdir()) == ["compare", "merged", "model-Q4_K_M.gguf", "model-Q8_0.gguf"]
    report = json.loads((folder / "compare" / "report.json").read_text())
    assert [row["tuned_answer"] for row in report["rows"]] == [answer for _, answer in PATTERN]
    assert not any(row["base_answer"] == row["reference"] for row in report["rows"])
    assert report["tuned_loss"] < report["base_loss"] and report["judged_on"].startswith("the rented machine")

    [instance] = runpod.fake.instances.values()
    arrived = max(p.stat().st_mtime for p in [gguf, q4, *merged.iterdir(), *(folder / "compare").iterdir()])
    assert instance.terminated is not None and arrived <= instance.terminated, "terminated after they arrived"
    _nothing_left(runpod.fake)
    _assert_ledger_matches(runpod.fake, run.id)

    tokenizer = AutoTokenizer.from_pretrained(gguf_tiny_model)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(gguf_tiny_model), str(run.adapter))
    expected = _greedy(peft, tokenizer)
    assert expected == [answer for _, answer in PATTERN], "the run taught the pattern"
    assert _greedy(AutoModelForCausalLM.from_pretrained(merged), tokenizer) == expected
    assert _gguf_greedy(gguf) == expected
    # 5-bit weights of a random 64-wide model may flip a token; most answers must still be the pattern's
    assert sum(a == b for a, b in zip(_gguf_greedy(q4), expected, strict=True)) >= 3
    # the machine's slim build (no compute backend, llama.cpp's own sources at -O0) quantises exactly as the full one
    assert _sha256(q4) == _sha256(_quantized_at_home(merged, tmp_path / "home")), "the same Q4_K_M as at home"


def test_a_gguf_the_converter_would_refuse_is_refused_before_anything_is_rented(
    runpod: CloudUnderTest,  # noqa: F811 - the fixture, imported
    tiny_model: TinyModel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _exporting_spec(tmp_path, tiny_model.path, runpod, ["merged", "gguf:Q8_0"])  # a tokenizer llama.cpp lacks
    assert main(["run", str(spec)]) != 0
    err = capsys.readouterr().err
    assert "[export] on_machine asks for a GGUF, and llama.cpp does not recognise the tokenizer" in err
    assert "Nothing was rented" in err
    assert runpod.fake.instances == {} and RunStore().all() == [], "no machine, and no run recorded"
