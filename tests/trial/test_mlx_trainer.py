"""The MLX trial: mlx-lm trains the tiny Llama on the CPU, every step is reported, and its adapter works in PEFT.

mlx[cpu] runs mlx-lm's trainer here as it runs on Apple Silicon (Metal there, the CPU here); the PEFT adapter it
leaves must compute what mlx-lm's own model with the adapter computes, logit for logit.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from desktop.core.runs.trial import TrialStep
from desktop.services.trial.errors import TrialError
from desktop.services.trial.mlx_trainer import (
    CONFIG_FILE,
    MLX_ADAPTER_DIR,
    MlxTraining,
    mlx_adapter_to_peft,
    train_with_mlx,
)
from tests.fixtures.chat_data import write_chat_dataset
from tests.fixtures.tiny_models import TinyModel

STEPS = 40
#: mlx-lm (MLX, float32) and PEFT (torch, float32) compute the same logits to about 1e-6 on the tiny model.
LOGITS_TOLERANCE = 1e-4

# mlx-lm's own model with mlx-lm's own adapter, in a child (MLX stays out of the test process): the logits of argv[3].
_MLX_LOGITS = """
import sys
import mlx.core as mx
import numpy as np
from mlx_lm import load
model, _ = load(sys.argv[1], adapter_path=sys.argv[2])
ids = [int(t) for t in sys.argv[3].split(",")]
np.save(sys.argv[4], np.array(model(mx.array([ids])).astype(mx.float32)))
"""


def _data(folder: Path, rows: int = 96) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_chat_dataset(folder / "train.jsonl", count=rows)
    write_chat_dataset(folder / "valid.jsonl", count=8, seed=1)
    return folder


@pytest.fixture(scope="module")
def trained(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[MlxTraining, list[TrialStep]]:
    """Forty steps of the tiny Llama with mlx-lm, and the steps ``on_step`` received as they came."""
    work = tmp_path_factory.mktemp("mlx-trial")
    seen: list[TrialStep] = []
    training = asyncio.run(
        train_with_mlx(
            sys.executable,
            tiny_model.path,
            _data(work / "data"),
            work / "out",
            steps=STEPS,
            seq_len=128,
            rank=8,
            learning_rate=0.003,
            batch_size=4,
            lora_alpha=16,
            on_step=seen.append,
        )
    )
    return training, seen


@pytest.mark.slow
def test_forty_steps_learn_and_report_every_step_as_it_comes(trained: tuple[MlxTraining, list[TrialStep]]) -> None:
    training, seen = trained
    losses = [step.loss for step in training.steps]

    assert [step.step for step in training.steps] == list(range(1, STEPS + 1))
    assert seen == list(training.steps)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2, f"the loss must visibly go down: {losses}"
    assert all(step.tokens_per_s is not None and step.tokens_per_s > 0 for step in training.steps)
    assert training.peak_memory_gb is not None and 0 < training.peak_memory_gb < 4
    assert 0 < training.seconds < 300
    assert training.adapter.name == "adapter"
    assert {p.name for p in training.adapter.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    assert not list((training.adapter.parent / MLX_ADAPTER_DIR).glob("0*_adapters.safetensors"))  # no checkpoints


@pytest.mark.slow
def test_the_peft_adapter_computes_what_mlx_lm_computes_with_its_own(
    trained: tuple[MlxTraining, list[TrialStep]], tiny_model: TinyModel, tmp_path: Path
) -> None:
    """Same logits, so the conversion (transposes, names and the scale as lora_alpha) is exact."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    training, _ = trained
    ids = AutoTokenizer.from_pretrained(tiny_model.path)("What is two plus three?")["input_ids"]
    mlx_adapter = training.adapter.parent / MLX_ADAPTER_DIR
    command = [sys.executable, "-c", _MLX_LOGITS, str(tiny_model.path), str(mlx_adapter), ",".join(map(str, ids))]
    result = subprocess.run([*command, str(tmp_path / "mlx.npy")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    mlx_logits = np.load(tmp_path / "mlx.npy")
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(tiny_model.path)(torch.tensor([ids])).logits.numpy()
        base = AutoModelForCausalLM.from_pretrained(tiny_model.path)
        tuned = PeftModel.from_pretrained(base, training.adapter)(torch.tensor([ids])).logits.numpy()

    assert np.abs(tuned - plain).max() > 100 * LOGITS_TOLERANCE, "the adapter must change the model"
    assert np.abs(tuned - mlx_logits).max() < LOGITS_TOLERANCE


def _hand_made_adapter(folder: Path, scale: float, num_layers: int) -> dict[str, np.ndarray]:
    """An mlx-lm adapter of rank 3 on layer 1's q_proj and down_proj (in 4, out 6 and in 5, out 4)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    weights = {
        "model.layers.1.self_attn.q_proj.lora_a": rng.normal(size=(4, 3)).astype(np.float32),
        "model.layers.1.self_attn.q_proj.lora_b": rng.normal(size=(3, 6)).astype(np.float32),
        "model.layers.1.mlp.down_proj.lora_a": rng.normal(size=(5, 3)).astype(np.float32),
        "model.layers.1.mlp.down_proj.lora_b": rng.normal(size=(3, 4)).astype(np.float32),
    }
    folder.mkdir()
    save_file(weights, str(folder / "adapters.safetensors"))
    config = {"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": {"rank": 3, "scale": scale}}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return weights


def test_an_mlx_adapter_becomes_the_same_function_in_peft_s_layout(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    mlx = _hand_made_adapter(tmp_path / "mlx", scale=2.5, num_layers=1)

    peft_dir = mlx_adapter_to_peft(tmp_path / "mlx", tmp_path / "peft", "org/base")

    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    prefix = "base_model.model.model.layers.1.self_attn.q_proj"
    a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
    assert (a.shape, b.shape) == ((3, 4), (6, 3))
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    mlx_delta = (
        2.5 * (x @ mlx["model.layers.1.self_attn.q_proj.lora_a"]) @ mlx["model.layers.1.self_attn.q_proj.lora_b"]
    )
    peft_delta = config["lora_alpha"] / config["r"] * (x @ a.T) @ b.T
    np.testing.assert_allclose(peft_delta, mlx_delta, rtol=1e-5)
    assert len(tensors) == 4
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (3, 7.5, "org/base")
    assert config["target_modules"] == ["down_proj", "q_proj"]
    assert config["layers_to_transform"] == [1]  # mlx-lm adapted the last block only


def test_an_adapter_of_every_block_names_no_layers_and_an_integer_alpha(tmp_path: Path) -> None:
    _hand_made_adapter(tmp_path / "mlx", scale=20.0, num_layers=-1)

    config = json.loads(
        (mlx_adapter_to_peft(tmp_path / "mlx", tmp_path / "peft", "b") / "adapter_config.json").read_text()
    )

    assert "layers_to_transform" not in config
    assert config["lora_alpha"] == 60 and isinstance(config["lora_alpha"], int)


def test_what_peft_cannot_hold_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    _hand_made_adapter(tmp_path / "mlx", scale=1.0, num_layers=-1)
    config = json.loads((tmp_path / "mlx" / "adapter_config.json").read_text())
    (tmp_path / "mlx" / "adapter_config.json").write_text(json.dumps({**config, "fine_tune_type": "dora"}))
    with pytest.raises(TrialError, match="'dora', not LoRA"):
        mlx_adapter_to_peft(tmp_path / "mlx", tmp_path / "peft", "b")

    (tmp_path / "mlx" / "adapter_config.json").write_text(json.dumps(config))
    save_file(
        {"model.layers.0.mlp.switch_mlp.up_proj.lora_a": np.zeros((2, 4, 3), np.float32)},
        str(tmp_path / "mlx" / "adapters.safetensors"),
    )
    with pytest.raises(TrialError, match="PEFT has no place for"):
        mlx_adapter_to_peft(tmp_path / "mlx", tmp_path / "peft", "b")
    assert not (tmp_path / "peft").exists()


async def test_a_missing_model_or_data_is_said_before_anything_starts(tiny_model: TinyModel, tmp_path: Path) -> None:
    async def train(model: Path, data: Path) -> MlxTraining:
        return await train_with_mlx(
            sys.executable, model, data, tmp_path / "out", steps=2, seq_len=64, rank=4, learning_rate=1e-3, batch_size=2
        )

    with pytest.raises(TrialError, match=r"no model in .*nowhere \(it has no config\.json\): download"):
        await train(tmp_path / "nowhere", _data(tmp_path / "data"))
    with pytest.raises(TrialError, match=r"no training data in .*empty \(it has no train\.jsonl\)"):
        await train(tiny_model.path, tmp_path / "empty")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for a Python without MLX")
async def test_a_python_without_mlx_is_told_to_install_the_local_tools(tiny_model: TinyModel, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # -S: no site-packages, so no mlx
    python.chmod(0o755)

    with pytest.raises(TrialError, match=r"MLX is not installed for .*python: .*local tools"):
        await train_with_mlx(
            str(python),
            tiny_model.path,
            _data(tmp_path / "data"),
            tmp_path / "out",
            steps=2,
            seq_len=64,
            rank=4,
            learning_rate=1e-3,
            batch_size=2,
        )


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for the Python")
async def test_the_trainer_gets_no_secret_and_the_settings_in_its_config(
    tiny_model: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not-for-children")
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_not-for-children")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nenv > "{tmp_path / "env.txt"}"\necho "Model type x not supported."\nexit 1\n')
    python.chmod(0o755)

    with pytest.raises(TrialError, match=r"exit 1\): mlx-lm cannot train this model's architecture"):
        await train_with_mlx(
            str(python),
            tiny_model.path,
            _data(tmp_path / "data"),
            tmp_path / "out",
            steps=7,
            seq_len=96,
            rank=4,
            learning_rate=2e-3,
            batch_size=3,
            lora_alpha=8,
        )

    env = (tmp_path / "env.txt").read_text()
    assert "not-for-children" not in env and "HF_HUB_OFFLINE=1" in env
    config = json.loads((tmp_path / "out" / CONFIG_FILE).read_text())
    assert (config["iters"], config["max_seq_length"], config["batch_size"], config["learning_rate"]) == (
        7,
        96,
        3,
        2e-3,
    )
    assert config["lora_parameters"] == {"rank": 4, "scale": 2.0, "dropout": 0.0}
    assert (config["steps_per_report"], config["num_layers"], config["fine_tune_type"]) == (1, -1, "lora")
    assert config["save_every"] > 7 and config["steps_per_eval"] > 7  # no checkpoint, validation at both ends only


@pytest.mark.slow
async def test_a_failing_trainer_is_reported_with_its_last_lines_and_a_fix(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    data = _data(tmp_path / "data", rows=2)  # fewer rows than one batch: mlx-lm exits 1

    with pytest.raises(TrialError) as caught:
        await train_with_mlx(
            sys.executable,
            tiny_model.path,
            data,
            tmp_path / "out",
            steps=5,
            seq_len=64,
            rank=4,
            learning_rate=1e-3,
            batch_size=4,
        )

    message = str(caught.value)
    assert message.startswith("mlx-lm's LoRA training failed (exit 1): the slice has fewer rows than one batch")
    assert "Dataset must have at least batch_size=4 examples but only has 2" in message
    assert "\x1b[" not in message


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the child through /proc")
async def test_cancelling_the_trial_stops_the_trainer(tiny_model: TinyModel, tmp_path: Path) -> None:
    first_step = asyncio.Event()
    out = tmp_path / "out"
    task = asyncio.create_task(
        train_with_mlx(
            sys.executable,
            tiny_model.path,
            _data(tmp_path / "data"),
            out,
            steps=100_000,
            seq_len=128,
            rank=8,
            learning_rate=1e-3,
            batch_size=4,
            on_step=lambda _step: first_step.set(),
        )
    )
    await asyncio.wait_for(first_step.wait(), 120)
    assert _processes_mentioning(str(out / CONFIG_FILE))

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert _processes_mentioning(str(out / CONFIG_FILE)) == [], "the child must be gone"
