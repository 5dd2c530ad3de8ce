"""``rentune plan``: sizing from the command line, JSON shape, and one clear line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from desktop.cli import main
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_json(capsys, "--model", "llama-3.1-8b")
    assert plan["params_b"] == pytest.approx(8.03, abs=0.01)
    assert plan["trainable_params"] == 41_943_040
    memory = plan["memory_gb"]
    assert isinstance(memory, dict)
    assert {"weights", "lora_adapter", "activations", "logits", "cuda_context", "per_gpu_total"} <= set(memory)
    options = plan["options"]
    assert isinstance(options, list) and options
    assert {"gpu", "count", "strategy", "fits", "headroom_gb", "tokens_per_s", "hours", "cost_usd"} <= set(options[0])
    assert options[0]["fits"] is True


def test_defaults_follow_the_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    setup = plan_json(capsys, "--model", "qwen2.5-7b")["setup"]
    assert setup == {
        "lora_r": 16,
        "targets": "all-linear",
        "seq_len": 2048,
        "micro_batch": 2,
        "grad_accum": 4,
        "grad_ckpt": True,
        "num_gpus": 1,
        "strategy": "ddp",
        "objective": "sft",
    }


def test_gpu_and_count_restrict_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_json(
        capsys, "--model", "llama-3.3-70b", "--method", "lora", "--gpu", "h100", "--gpus", "4", "--strategy", "fsdp"
    )
    options = plan["options"]
    assert isinstance(options, list)
    assert [(o["gpu"], o["count"], o["strategy"]) for o in options] == [("H100 SXM", 4, "fsdp")]


def test_human_output_itemises_memory_and_ranks_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "mistral-7b", "--method", "lora", "--tokens", "2000000"]) == 0
    out = capsys.readouterr().out
    for text in ("base weights", "activations", "logits + loss", "CUDA context", "total", "headroom", "$"):
        assert text in out


def test_dataset_tokens_feed_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dataset = write_chat_dataset(tmp_path / "d.jsonl", count=500)
    plan = plan_json(capsys, "--model", "qwen2.5-0.5b", "--dataset", str(dataset), "--epochs", "2")
    tokens = plan["tokens"]
    assert isinstance(tokens, dict)
    assert 1_000 < tokens["per_epoch"] < 30_000
    assert tokens["epochs"] == 2
    assert "usable examples" in tokens["source"] and "estimate" in tokens["source"]


def test_local_model_folder_is_sized_from_its_config(capsys: pytest.CaptureFixture[str], tiny_model: TinyModel) -> None:
    plan = plan_json(capsys, "--model", str(tiny_model.path), "--gpu", "rtx4090")
    assert 0 < plan["params_b"] < 0.001  # ~134k parameters


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-9000"], "unknown model 'llama-9000'"),
        (["--model", "qwen 7b"], "did you mean"),
        (["--model", "llama-3.1-8b", "--seq-len", "-5"], "--seq-len -5 is out of range"),
        (["--model", "llama-3.1-8b", "--micro-batch", "100000"], "--micro-batch 100000 is out of range"),
        (["--model", "llama-3.1-8b", "--gpu", "gtx-280"], "unknown GPU 'gtx-280'"),
        (["--model", "llama-3.1-8b", "--epochs", "0"], "--epochs 0 is out of range"),
        (["--model", "llama-3.1-8b", "--tokens", "-1"], "--tokens -1 is out of range"),
        (["--model", "llama-3.1-8b", "--dataset", "missing.jsonl"], "does not exist"),
        (["--model", "llama-3.1-8b", "--gpus", "0"], "--gpus 0 is out of range"),
        ([], "--model is required"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_config_without_needed_fields_and_encoder_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 100}))
    assert main(["plan", "--model", str(tmp_path / "broken")]) == 2
    assert "hidden size" in capsys.readouterr().err
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    assert main(["plan", "--model", str(tmp_path / "bert")]) == 2
    assert "decoder-only" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{nope")
    assert main(["plan", "--model", str(tmp_path / "junk.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_unknown_hub_model_offline_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "some-org/some-model-that-is-not-cached"]) == 2
    err = capsys.readouterr().err
    assert "Hugging Face Hub" in err and "catalog" in err


def test_list_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--list-models"]) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 25


def test_plan_does_not_import_torch_or_qt() -> None:
    probe = (
        "import sys; from desktop.cli import main; main(['plan', '--model', 'llama-3.1-8b', '--json']); "
        "print(sorted(m for m in ('torch', 'transformers', 'PySide6', 'huggingface_hub') if m in sys.modules),"
        " file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stderr.strip() == "[]"


def test_a_job_that_fits_nowhere_gets_flags_to_rerun_with_and_structured_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--model", "llama-3.3-70b", "--method", "lora", "--gpu", "rtx4090", "--gpus", "1"]
    assert main(["plan", *args]) == 0
    text = capsys.readouterr().out
    assert "Changes that make it fit:" in text
    lines = [line for line in text.splitlines() if line.startswith("  - use ")]  # the CLI's words: its flags
    assert lines and all("--method qlora" in line and "--gpus 8 --strategy fsdp (" in line for line in lines)
    assert all("a 4-bit base model takes a quarter of the memory" in line for line in lines)
    plan = plan_json(capsys, *args)
    suggestions = plan["suggestions"]
    assert isinstance(suggestions, list) and suggestions
    changes = suggestions[0]["changes"]
    method = next(change for change in changes if change["setting"] == "method")
    assert (method["from"], method["to"]) == ("lora", "qlora")
    assert all(set(change) == {"setting", "from", "to", "why"} for change in changes)


def test_a_job_no_single_machine_holds_is_planned_across_machines_unless_told_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "llama-2-70b", "--method", "full", "--gpu", "h100-sxm"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 machines x 8 x H100 SXM fsdp" in out and "3200 Gb/s infiniband between them" in out
    assert main([*args, "--max-nodes", "1"]) == 0
    assert "machines" not in capsys.readouterr().out


def test_a_machine_limit_out_of_range_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-2-70b", "--max-nodes", "0"]) == 2
    assert "--max-nodes 0 is out of range: use a whole number from 1 to 8" in capsys.readouterr().err
