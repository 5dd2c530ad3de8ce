"""A trial with mlx-lm's own LoRA trainer (``mlx[cpu]`` on Linux stands in for Apple Silicon): the loss falls on the
slice and the adapter comes home in PEFT form, listed like a run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from desktop.cli import main
from desktop.core.runs.states import RunState
from desktop.services.runs.store import RunStore
from tests.fixtures.tiny_models import TinyModel
from tests.trial.test_trial_on_the_cpu import write_spec

pytestmark = pytest.mark.slow


def test_rentune_trial_on_mlx_trains_the_slice_and_keeps_a_peft_adapter(
    tmp_path: Path, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, str(tiny_model.path))
    assert main(["trial", str(spec), "--steps", "60", "--on", "mlx", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["plan"]["backend"] == "mlx" and result["backend"] == "mlx"
    assert result["loss_falls"], result["losses"]
    assert len(result["losses"]) == 60 and result["tokens_per_s"] > 0 and result["peak_memory_gb"] > 0
    record = RunStore().get(result["run_id"])
    assert record.state is RunState.FINISHED and record.spec["trial"]["backend"] == "mlx"
    config = json.loads((Path(result["adapter"]) / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(tiny_model.path)
    assert len(result["answers"]) == 3
