"""The GPU check's logic, run end to end on the CPU in ``--smoke`` mode (the real run needs a GPU machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.gguf_models import build_once_per_run
from tests.gpu.gpu_check import REPO

# Three payload processes and two probes: about a minute alone, several on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def table_rows(report: str, heading: str) -> list[list[str]]:
    """The data rows of the first Markdown table after ``heading``, as lists of cells."""
    section = report.split(heading, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The smoke check's result and report, run once per test run (its tests may run on different workers)."""
    return build_once_per_run(tmp_path_factory, "gpu-smoke", run_smoke)


def run_smoke(out: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs ``gpu_check --smoke`` on this CPU with its report in ``out``."""
    env = os.environ | {"OUT": str(out), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "tests.gpu.gpu_check", "--smoke", "--site", str(out / "no-site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    return result, out / "gpu_check.md"


def test_smoke_mode_trains_lora_full_and_dpo_with_the_real_payload(smoke_report) -> None:
    result, path = smoke_report
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row[1]: row for row in table_rows(path.read_text(), "## Training")}
    assert set(rows) == {"qlora", "lora", "full", "lora+dpo"}
    for method in ("lora", "full", "lora+dpo"):
        model, _, shape, status, reserved, _, plan_gb, fit, _, tokens_per_s, plan_tokens_per_s = rows[method][:11]
        assert (model, shape, status, fit) == ("tiny-llama", "seq 64 x batch 2, 3 steps", "ok", "fits")
        assert reserved == "n/a"  # no GPU memory on a CPU
        assert float(tokens_per_s.replace(",", "")) > 0
        assert float(plan_gb) > 0 and float(plan_tokens_per_s.replace(",", "")) > 0
    assert rows["qlora"][3] == "skipped (no CUDA)"


def test_smoke_mode_fits_a_job_too_big_and_fails_one_that_never_fits_under_the_test_limit(smoke_report) -> None:
    _, path = smoke_report
    rows = {row[0]: row for row in table_rows(path.read_text(), "## Fitting on the machine")}
    _job, _shape, _plan, outcome, tried, kind, _peak, _message = rows["fit: tiny-llama full"]
    assert outcome == "ok: fitted to micro-batch 2 x grad-accum 4, checkpointing on and finished"
    assert tried == "micro-batch 4 x grad-accum 2, checkpointing on; micro-batch 2 x grad-accum 4, checkpointing on"
    assert kind == "none"
    _job, _shape, _plan, outcome, tried, kind, _peak, message = rows["no fit: tiny-llama full"]
    assert outcome == "ok: ended as error kind oom at micro-batch 1, with a hint" and kind == "oom"
    assert tried.endswith("micro-batch 1 x grad-accum 8, checkpointing on")
    assert "out of memory at micro-batch 1 with activation checkpointing on" in message


def test_smoke_mode_reports_each_runs_first_measured_steps(smoke_report) -> None:
    _, path = smoke_report
    rows = table_rows(path.read_text(), "## First measured steps")
    methods = {row[1] for row in rows}
    assert {"lora", "full"} <= methods
    for row in rows:
        assert row[2].startswith("seq 64 x micro-batch ")
        assert int(row[3]) >= 1 and float(row[4]) > 0 and float(row[5].replace(",", "")) > 0
    assert "seq 64 x micro-batch 2 x grad-accum 4" in [row[2] for row in rows], "the fitted job measured as it ran"


def test_smoke_mode_shows_torch_unchanged_and_writes_the_same_report_to_stdout(smoke_report) -> None:
    result, path = smoke_report
    report = path.read_text()
    torch_row = next(row for row in table_rows(report, "## Packages") if row[0] == "torch")
    assert torch_row[2] == "same"
    assert "torch unchanged: " in report
    assert report.strip() in result.stdout
    assert path.with_suffix(".json").is_file()


def test_smoke_mode_says_the_fsdp_pass_needs_two_gpus(smoke_report) -> None:
    result, path = smoke_report
    section = path.read_text().split("## FSDP on 2 GPUs", 1)[1]
    assert "skipped: FSDP needs 2 CUDA GPUs or more, this machine has 0" in section
    assert result.returncode == 0


def test_smoke_mode_says_the_vllm_serving_pass_needs_a_gpu(smoke_report) -> None:
    _, path = smoke_report
    section = path.read_text().split("## Serving on the machine: vLLM with the adapter as a LoRA module", 1)[1]
    assert section.strip().splitlines()[0] == "skipped (no CUDA)"
