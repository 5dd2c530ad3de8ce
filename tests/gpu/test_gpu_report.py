"""The GPU check's reading of payload events and its report, on the events a GPU run writes (no GPU needed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.gpu.gpu_check import (
    FIT_SHAPE,
    FULL_SHAPE,
    NO_FIT_SHAPE,
    Check,
    Outcome,
    Prediction,
    Report,
    Row,
    exit_code,
    judge_fit,
    judge_fit_peak,
    judge_no_fit,
    outcome_of,
    plan_gpu,
    render,
    run_all,
)
from tests.gpu.serve_check import ServeRow


def step(number: int, allocated: float, reserved: float, rate: float | None) -> dict[str, object]:
    return {
        "event": "step",
        "step": number,
        "loss": 2.0 - number / 10,
        "tokens_per_s": rate,
        "gpu_mem_allocated_gb": allocated,
        "gpu_mem_reserved_gb": reserved,
    }


GPU_FACTS = {"python": "3.12.3", "torch": "2.8.0+cu128", "cuda": True, "gpu": "NVIDIA H200", "gpu_gib": 139.8}
TORCH = {"version": "2.8.0+cu128", "where": "/usr/lib/python3/site-packages/torch/__init__.py"}


def test_outcome_of_a_finished_gpu_run_takes_the_peaks_and_the_settled_median_rate(tmp_path: Path) -> None:
    rates = [None, 100.0, 900.0, 1000.0, 1100.0, 1000.0, 1200.0]
    events = [step(i + 1, 10.0 + i, 12.0 + i, rate) for i, rate in enumerate(rates)]
    events.append({"event": "done", "metrics": {}})
    outcome = outcome_of(events, 0, 42.0, tmp_path / "payload.log")
    assert outcome.status == "ok"
    assert (outcome.peak_allocated_gb, outcome.peak_reserved_gb) == (16.0, 18.0)
    assert outcome.tokens_per_s == 1050.0  # the first of the six rates is dropped as warm-up
    assert outcome.steps == 7 and outcome.final_loss == 2.0 - 0.7


def test_a_job_that_never_fits_counts_only_when_it_ends_as_oom_at_micro_batch_one_with_a_hint(tmp_path: Path) -> None:
    message = "RuntimeError: out of memory at micro-batch 1 with activation checkpointing on: this job does not fit"
    oom = {"event": "error", "kind": "oom", "message": message, "hint": "reduce it"}
    outcome = outcome_of([oom], 1, 20.0, tmp_path / "payload.log")
    assert (outcome.status, outcome.error_kind) == ("failed: oom", "oom")
    assert judge_no_fit(outcome) == "ok: ended as error kind oom at micro-batch 1, with a hint"
    assert judge_no_fit(Outcome(status="failed: oom", error_kind="oom", message=message)) == "failed: no hint"
    early = Outcome(status="failed: oom", error_kind="oom", hint="h", message="CUDA out of memory")
    assert judge_no_fit(early) == "failed: oom without trying micro-batch 1"
    assert judge_no_fit(Outcome(status="ok")) == "failed: trained without running out of memory"
    assert judge_no_fit(Outcome(status="failed: internal", error_kind="internal")) == "failed: internal"


def test_a_job_too_big_counts_as_fitted_only_when_the_payload_made_it_smaller_and_finished(tmp_path: Path) -> None:
    fit = {"event": "fit", "micro_batch": 64, "grad_accum": 2, "gradient_checkpointing": True, "reason": "oom"}
    outcome = outcome_of([fit, {"event": "done", "metrics": {}}], 0, 30.0, tmp_path / "payload.log")
    assert outcome.fits == ["micro-batch 64 x grad-accum 2, checkpointing on"]
    assert judge_fit(outcome) == "ok: fitted to micro-batch 64 x grad-accum 2, checkpointing on and finished"
    assert judge_fit(Outcome(status="ok")) == "failed: trained without running out of memory"
    assert judge_fit(Outcome(status="failed: oom", error_kind="oom")) == "failed: oom"


def calibrated(peak_gb: float | None, status: str = "ok") -> Outcome:
    calibration = {"event": "calibration", "seq_len": 8192, "micro_batch": 1, "grad_accum": 128}
    calibration["peak_allocated_gb"] = peak_gb
    return Outcome(status=status, calibration=calibration)


def test_the_peak_after_a_fit_must_be_the_fitted_setups_own_within_half_the_models_weights() -> None:
    weights_gb = 0.99  # Qwen2.5 0.5B in bf16: a failed attempt's model still held adds at least this much
    fitted = judge_fit_peak(calibrated(31.20), calibrated(31.00), weights_gb)
    assert fitted == "ok: 31.20 GB after the fit, 31.00 GB afresh"
    held = judge_fit_peak(calibrated(32.10), calibrated(31.00), weights_gb)
    assert held.startswith("failed: 32.10 GB after the fit, 31.00 GB afresh, apart by more than half the model's 0.99")
    assert judge_fit_peak(calibrated(30.40), calibrated(31.00), weights_gb).startswith("failed: 30.40 GB")
    assert judge_fit_peak(calibrated(None), calibrated(31.0), weights_gb) == "failed: no calibration peak to compare"
    assert judge_fit_peak(calibrated(31.0), calibrated(None, "failed: oom"), weights_gb) == "failed: oom"
    refitted = calibrated(31.0)
    refitted.fits = ["micro-batch 1 x grad-accum 128, checkpointing on"]
    assert judge_fit_peak(calibrated(31.0), refitted, weights_gb).startswith("failed: the fitted setup ran out")


def test_a_payload_that_dies_without_events_is_a_failure_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "payload.log"
    log.write_text("Traceback (most recent call last):\nImportError: libcudart.so.12: cannot open shared object\n")
    outcome = outcome_of([], 1, 3.0, log)
    assert outcome.status == "failed: exit 1 without a done event"
    assert "libcudart" in (outcome.message or "")
    assert outcome_of([], None, 240.0, log).status == "failed: timed out"


def gpu_report() -> Report:
    prediction = Prediction(total_gb=20.4, context_gb=0.4, fit="fits", tokens_per_s=2000.0)
    measured = Outcome(status="ok", peak_allocated_gb=19.0, peak_reserved_gb=25.0, tokens_per_s=2500.0, seconds=61)
    fitted = Outcome(status="ok: fitted to micro-batch 1 x grad-accum 128, checkpointing on and finished")
    oom = Outcome(status="ok: ended as error kind oom at micro-batch 1, with a hint", error_kind="oom", message="x")
    report = Report("full (real shapes)", GPU_FACTS, "H200 (the card found)", {"torch": TORCH}, {"torch": TORCH})
    report.rows.append(Row("qwen2.5-7b", "lora", FULL_SHAPE, prediction, measured))
    report.fit = Row("qwen2.5-0.5b", "full", FIT_SHAPE, Prediction(450.0, 0.4, "does not fit", 10.0), fitted)
    report.no_fit = Row("qwen2.5-0.5b", "full", NO_FIT_SHAPE, Prediction(300.0, 0.4, "does not fit", 1.0), oom)
    return report


def test_the_gpu_report_sets_measurements_beside_the_plan() -> None:
    text = render(gpu_report())
    row = next(line for line in text.splitlines() if line.startswith("| qwen2.5-7b | lora"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3:13] == ["ok", "25.00", "19.00", "20.00", "fits", "-20%", "2,500", "2,000", "-20%", "n/a"]
    assert "torch unchanged: 2.8.0+cu128" in text
    assert "| fit: qwen2.5-0.5b full | seq 8192 x batch 128, 2 steps | does not fit (450 GB) | ok: fitted to" in text
    assert "| ok: ended as error kind oom at micro-batch 1, with a hint | nothing | oom |" in text
    assert exit_code(gpu_report()) == 0


def test_the_fitted_setup_started_afresh_is_a_row_of_the_fit_table_and_its_failure_fails_the_check() -> None:
    report = gpu_report()
    afresh = calibrated(31.0, "ok: 31.20 GB after the fit, 31.00 GB afresh")
    report.fit_afresh = Row("qwen2.5-0.5b", "full", replace(FIT_SHAPE, micro_batch=1), None, afresh)
    text = render(report)
    assert "| fitted setup afresh: qwen2.5-0.5b full | seq 8192 x batch 1, 2 steps | n/a | ok: 31.20 GB" in text
    assert "| qwen2.5-0.5b | full | seq 8192 x micro-batch 1 x grad-accum 128 |" in text
    assert exit_code(report) == 0
    afresh.status = "failed: 32.10 GB after the fit, 31.00 GB afresh, apart by more than half the model's weights"
    assert exit_code(report) == 1


def test_a_replaced_torch_or_a_failed_run_fails_the_check() -> None:
    replaced = gpu_report()
    replaced.after = {"torch": {"version": "2.13.0", "where": "/repo/.gpu-site/site-packages/torch/__init__.py"}}
    assert "REPLACED: torch changed once" in render(replaced)
    assert exit_code(replaced) == 1
    failed = gpu_report()
    failed.rows[0].outcome = Outcome(status="failed: oom", message="OutOfMemoryError: CUDA out of memory")
    assert "- qwen2.5-7b lora: OutOfMemoryError: CUDA out of memory" in render(failed)
    assert exit_code(failed) == 1


def test_models_past_the_time_budget_are_listed_as_skipped_not_failed(tmp_path: Path) -> None:
    gpu, _ = plan_gpu(GPU_FACTS, None)
    report = Report("full (real shapes)", GPU_FACTS, gpu.name, {"torch": TORCH}, {"torch": TORCH})
    check = Check(False, tmp_path / "site", tmp_path, -1.0, 240.0, gpu, report, None)
    run_all(check, ("qwen2.5-7b",), ("qlora", "lora"), FULL_SHAPE)
    assert [(row.model, row.method, row.outcome.status) for row in report.rows] == [
        ("qwen2.5-7b", "qlora", "skipped: time budget of -1 s spent"),
        ("qwen2.5-7b", "lora", "skipped: time budget of -1 s spent"),
    ]
    assert "| qwen2.5-7b | lora | seq 2048 x batch 2, 20 steps | skipped: time budget" in render(report)
    assert exit_code(report) == 0


def test_the_vllm_serving_pass_is_a_table_on_a_gpu_and_its_failure_fails_the_check() -> None:
    report = gpu_report()
    report.serve = ServeRow("ok: served 'tuned' with vllm, both counted", 41.5, 812.3, 2, "128 tokens in 0.2 s")
    assert "| ok: served 'tuned' with vllm, both counted | 41.5 s | 812.3 | 2 | 128 tokens in 0.2 s |" in render(report)
    assert exit_code(report) == 0
    report.serve = ServeRow("failed: it never served (vLLM exited: CUDA out of memory)")
    assert "failed: it never served (vLLM exited: CUDA out of memory)" in render(report)
    assert exit_code(report) == 1
