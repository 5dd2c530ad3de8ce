"""The objectives beyond SFT through the real payload on the CPU: DPO learns to reward the chosen answer (and survives
a kill -9 mid-run), the tuned model prefers the chosen answers more often than its base, ORPO trains and reports,
and continued pre-training on raw text lowers the held-out perplexity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.domain_text import write_domain_text
from tests.fixtures.preference_data import preference_pairs, write_preference_dataset
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel
from tests.payload.conftest import events_of, run_payload, start_payload
from tests.payload.test_training import wait_for_event
from trainer_payload.checkpoints import is_complete
from trainer_payload.protocol import EventKind

pytestmark = pytest.mark.slow


def preference_job(folder: Path, base: Path, form: str = "chat", **overrides: object) -> Path:
    """A job of 64 pairs (8 more held out) over the pattern, in ``form``."""
    folder.mkdir()
    write_preference_dataset(folder / "train.jsonl", 64, form)
    write_preference_dataset(folder / "eval.jsonl", 8, form)
    job = {"base_model": str(base), "train_file": "train.jsonl", "eval_file": "eval.jsonl", "output_dir": "out"}
    job |= {**TINY_TRAINING, "objective": "dpo", "max_steps": 30, "eval_steps": 10, **overrides}
    (folder / "job.json").write_text(json.dumps(job))
    return folder / "job.json"


def chosen_preferred(base: Path, adapter: Path | None) -> float:
    """The share of the distinct training pairs whose chosen answer the model finds likelier than the rejected one,
    per token (the answers differ in length: summed, the shorter one wins whatever the model learned)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()

    def logp(prompt: list[dict[str, str]], answer: list[dict[str, str]]) -> float:
        start = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
        ids = torch.tensor([tokenizer.apply_chat_template(prompt + answer, return_dict=True)["input_ids"]])
        first = len(start)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        picked = logits.gather(1, ids[0, 1:, None])[:, 0]
        return float(picked[first - 1 :].mean())

    distinct = {json.dumps(pair, sort_keys=True): pair for pair in preference_pairs(64)}.values()
    wins = [logp(p["prompt"], p["chosen"]) > logp(p["prompt"], p["rejected"]) for p in distinct]
    return sum(wins) / len(wins)


def test_dpo_learns_the_preference_resumes_after_a_kill_and_the_tuned_model_prefers_chosen(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    job = preference_job(tmp_path / "dpo", tiny_model.path)
    process = start_payload(job, tmp_path / "payload.log")
    wait_for_event(job, lambda e: e["event"] == "checkpoint" and e["step"] == 10)
    process.kill()
    process.wait()

    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(job)
    training = [e for e in events if e["event"] == "state" and e["state"] == "training"]
    assert training[-1]["resume_from"] == "checkpoint-10" and "rejected" in training[-1]["loss_on"]
    steps = {e["step"]: e for e in events if e["event"] is EventKind.STEP}
    assert sorted(steps) == list(range(1, 31)), "every step reported once the resume retrained nothing twice"
    early = [steps[s]["reward_accuracy"] for s in range(1, 6)]
    late = [steps[s]["reward_accuracy"] for s in range(26, 31)]
    assert sum(late) / 5 >= 0.9 > sum(early) / 5, f"preference accuracy rises: {early} -> {late}"
    assert sum(steps[s]["reward_margin"] for s in range(26, 31)) / 5 > 0.1 > abs(steps[1]["reward_margin"])
    assert all(steps[s]["reward_chosen"] > steps[s]["reward_rejected"] for s in range(26, 31))
    evals = [e for e in events if e["event"] is EventKind.EVAL]
    assert [e["step"] for e in evals][-2:] == [20, 30] and evals[-1]["reward_accuracy"] >= 0.75
    assert evals[-1]["reward_margin"] > 0, "the held-out pairs are preferred too"
    done = next(e for e in events if e["event"] is EventKind.DONE)
    adapter = job.parent / "out" / done["adapter_path"]
    assert is_complete(adapter)

    base, tuned = chosen_preferred(tiny_model.path, None), chosen_preferred(tiny_model.path, adapter)
    assert tuned >= 0.8 and tuned > base + 0.2, f"chosen preferred: base {base:.0%}, tuned {tuned:.0%}"


def test_a_full_dpo_computes_its_reference_once_and_resumes_from_a_kill_against_the_base(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    """Every epoch trained: TRL computes the reference log-probabilities before the first step (no frozen copy). After
    a kill -9 the resumed run computes them again from the base (the checkpoint loads only in train): the rewards of
    the resumed steps go on from where they were, not from zero as they would against the trained weights."""
    from trainer_payload.protocol import JobSpec
    from trainer_payload.train import training_config

    keys = {**TINY_TRAINING, "base_model": "b", "train_file": "t", "output_dir": "o", "objective": "dpo"}
    for method, max_steps, precomputed in (("full", 0, True), ("full", 20, False), ("lora", 0, False)):
        spec = JobSpec.from_dict({**keys, "method": method, "max_steps": max_steps})
        assert training_config(spec, False, False).precompute_ref_log_probs is precomputed, (method, max_steps)
    job = preference_job(tmp_path / "full", tiny_model.path, method="full", max_steps=0, epochs=2, eval_file=None,
                         learning_rate=1e-4, checkpoint_steps=16)  # fmt: skip
    process = start_payload(job, tmp_path / "payload.log")
    wait_for_event(job, lambda e: e["event"] == "checkpoint" and e["step"] == 16)
    process.kill()
    process.wait()
    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(job)
    assert [e["resume_from"] for e in events if e["event"] == "state" and e["state"] == "training"][-1] == (
        "checkpoint-16"
    )
    steps = {e["step"]: e for e in events if e["event"] is EventKind.STEP}
    assert sorted(steps) == list(range(1, 33)), "two epochs of 16 steps, each step reported once"
    assert steps[17]["reward_margin"] > 0.5 * steps[16]["reward_margin"] > 0, "measured against the base still"
    assert sum(steps[s]["reward_accuracy"] for s in range(28, 33)) / 5 >= 0.8


def test_orpo_trains_on_plain_text_pairs_and_reports_its_rewards(tiny_model: TinyModel, tmp_path: Path) -> None:
    job = preference_job(tmp_path / "orpo", tiny_model.path, "plain", objective="orpo", max_steps=12, eval_file=None)
    result = run_payload(job)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(job)
    steps = [e for e in events if e["event"] is EventKind.STEP]
    assert len(steps) == 12 and all({"reward_accuracy", "reward_margin"} <= set(e) for e in steps)
    assert all(e["tokens_per_s"] is None for e in steps), "TRL's ORPO counts no tokens: no speed rather than 0/s"
    assert steps[-1]["loss"] < steps[0]["loss"], "ORPO's loss (the chosen answer's, and its odds) goes down"
    assert "odds" in next(e for e in events if e["event"] == "state" and e["state"] == "training")["loss_on"]
    assert events[-1]["state"] == "done"


def test_continued_pretraining_on_raw_text_lowers_the_held_out_perplexity(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    folder = tmp_path / "cpt"
    folder.mkdir()
    write_domain_text(folder / "train.txt", 30, seed=0)
    write_domain_text(folder / "eval.txt", 3, seed=1)
    job = {"base_model": str(tiny_model.path), "train_file": "train.txt", "eval_file": "eval.txt", "output_dir": "out"}
    job |= {**TINY_TRAINING, "objective": "cpt", "max_steps": 30, "eval_steps": 10}
    (folder / "job.json").write_text(json.dumps(job))
    result = run_payload(folder / "job.json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = events_of(folder / "job.json")
    assert [e["step"] for e in events if e["event"] is EventKind.EVAL] == [0, 10, 20, 30], "the base is measured first"
    steps = [e for e in events if e["event"] is EventKind.STEP]
    assert steps[-1]["tokens"] >= 0.98 * 30 * 4 * 128, "sequences packed full (only a document's last one is short)"
    metrics = next(e for e in events if e["event"] is EventKind.DONE)["metrics"]
    assert metrics["perplexity"] < 0.8 * metrics["base_perplexity"], metrics
