"""The checks before a launch: red for what would waste money or fail, amber for what is worth a look, each naming
the step that fixes it; the facts read from the prepared files themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keyring.backends.fail
import keyring.backends.null
import pytest

from desktop.core.runs.draft import ComputeDraft, RunDraft, TargetDraft
from desktop.core.sizing.plan import Fit
from desktop.services.machines.probe import NO_GPU
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.providers.base import Offer, ProviderName
from desktop.services.runs.offers_for_draft import DraftOffer
from desktop.services.runs.preflight import (
    ReviewFacts,
    Severity,
    after_training_usd,
    is_gated,
    preflight,
    read_review_facts,
    secret_rows,
)
from tests.fixtures.memory_keyring import using_keyring

PICK = {
    "provider": "vast",
    "offer_id": "5001",
    "gpu": "RTX 4090",
    "gpu_id": "RTX 4090",
    "vram_gb": 24.0,
    "price_per_hour": 0.4,
}


def rented_draft(**compute: Any) -> RunDraft:
    return RunDraft(
        train_file="/data/train.jsonl",
        base_model="qwen2.5-7b",
        compute=ComputeDraft.model_validate({**PICK, **compute}),
    )


def judged(draft: RunDraft, fit: Fit, total: float | None = 2.0, need: float = 20.0) -> DraftOffer:
    compute = draft.compute
    offer = Offer(
        ProviderName(compute.provider), compute.offer_id, compute.gpu, compute.gpu_id, compute.count,
        compute.vram_gb, compute.price_per_hour, compute.spot, None, "",
    )  # fmt: skip
    return DraftOffer(offer, fit, 5.0 if total else None, total, "ddp", need)


def headlines(draft: RunDraft, facts: ReviewFacts) -> list[tuple[str, str]]:
    return [(check.severity.value, check.headline) for check in preflight(draft, facts)]


def test_a_rented_machine_the_job_fits_with_room_has_nothing_to_say() -> None:
    draft = rented_draft()
    assert preflight(draft, ReviewFacts(pick=judged(draft, Fit.FITS))) == []


def test_a_machine_too_small_is_red_and_names_the_sizes() -> None:
    draft = rented_draft()
    (check,) = preflight(draft, ReviewFacts(pick=judged(draft, Fit.NO, need=31.4)))
    assert check.severity is Severity.DANGER and not check.required and check.step == "compute"
    assert check.headline == "The job does not fit the picked machine"
    assert "29.2 GiB" in check.details and "24 GiB per GPU" in check.details  # 31.4 decimal GB, in the card's unit


def test_a_machine_too_small_proposes_qlora_only_where_another_method_is_chosen() -> None:
    draft = rented_draft()
    draft.method = "full"
    (check,) = preflight(draft, ReviewFacts(pick=judged(draft, Fit.NO, need=31.4)))
    assert "choose QLoRA" in check.details
    draft.method = "qlora"
    (check,) = preflight(draft, ReviewFacts(pick=judged(draft, Fit.NO, need=31.4)))
    assert "QLoRA" not in check.details, "the advice names what can still change"
    assert "Pick a machine with more memory, or choose a shorter sequence length" in check.details


def test_spot_tight_and_an_estimate_above_the_budget_are_amber() -> None:
    draft = rented_draft(spot=True)
    draft.budget_usd = 1.0
    found = headlines(draft, ReviewFacts(pick=judged(draft, Fit.TIGHT, total=3.0)))
    assert found == [
        ("warning", "Memory is tight"),
        ("warning", "Spot machine: it can be taken away at any time"),
        ("warning", "The estimate is above your budget"),
    ]


def test_an_unknown_gpu_speed_is_amber() -> None:
    draft = rented_draft()
    assert headlines(draft, ReviewFacts(pick=judged(draft, Fit.FITS, total=None))) == [
        ("warning", "Time and cost unknown on this GPU")
    ]


def test_missing_parts_come_first_and_cannot_be_launched_anyway() -> None:
    draft = RunDraft()
    checks = preflight(draft, ReviewFacts())
    assert [(c.headline, c.step) for c in checks] == [
        ("The data is not prepared", "data"),
        ("No base model chosen", "model"),
        ("No machine picked", "compute"),
    ]
    assert all(c.required and c.severity is Severity.DANGER for c in checks)


def test_an_own_server_without_a_gpu_or_a_tested_key_is_red() -> None:
    target = TargetDraft(host="box", user="me", host_key="ssh-ed25519 AAAA", fingerprint="SHA256:x", gpu=NO_GPU)
    draft = RunDraft(train_file="/t.jsonl", base_model="qwen2.5-7b", target=target)
    assert not draft.renting, "a draft naming a server trains there"
    assert headlines(draft, ReviewFacts()) == [("danger", "Your server has no GPU")]
    draft.target = target.model_copy(update={"host_key": "", "gpu": ""})
    (check,) = preflight(draft, ReviewFacts())
    assert check.required and check.headline == "The server's connection is not tested"


def test_an_own_server_whose_gpu_is_too_small_is_red(tmp_path: Path) -> None:
    target = TargetDraft(host="box", user="me", host_key="k", gpu="NVIDIA GeForce RTX 3060, 12288 MiB")
    draft = RunDraft(train_file="/t.jsonl", base_model="qwen2.5-7b", method="lora", target=target)
    facts = read_review_facts(draft, SecretStore())
    found = preflight(draft, facts)
    assert [c.headline for c in found] == ["The job does not fit your server's GPU"]
    assert "about 11.6 GiB usable" in found[0].details  # 12288 MiB less what the driver keeps, in one unit


def test_a_gated_model_without_a_token_is_red_and_with_one_it_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert is_gated("llama-3.1-8b") and is_gated("meta-llama/Llama-3.1-8B-Instruct")
    assert not is_gated("qwen2.5-7b") and not is_gated("")
    draft = rented_draft()
    draft.base_model = "llama-3.1-8b"
    facts = read_review_facts(draft, SecretStore())
    assert facts.gated and not facts.hf_token
    assert ("danger", "llama-3.1-8b needs a Hugging Face token") in headlines(draft, facts)
    token = next(check for check in preflight(draft, facts) if "token" in check.headline)
    assert token.required  # not even "Launch anyway": the machine would bill while its download is refused
    SecretStore().set(SecretName.HUGGINGFACE, "hf_" + "x" * 30)
    facts = read_review_facts(draft, SecretStore())
    assert facts.hf_token and all("token" not in headline for _, headline in headlines(draft, facts))


def test_a_model_that_cannot_be_sized_is_red_on_the_model_step() -> None:
    draft = rented_draft()
    draft.base_model = "no-such-model-anywhere"
    facts = read_review_facts(draft, SecretStore())
    (check,) = [c for c in preflight(draft, facts) if c.headline == "The run cannot be sized"]
    assert check.step == "model" and check.details.startswith("no-such-model-anywhere is not a model Rentune knows")
    assert check.details.endswith(".") and "rentune" not in check.details, "no command lines in the app"


def write_rows(path: Path, texts: list[str]) -> Path:
    with path.open("w") as handle:
        for text in texts:
            row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": text}]}
            handle.write(json.dumps(row) + "\n")
    return path


def test_rows_that_look_like_secrets_are_counted_in_the_prepared_files(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "train.jsonl", ["fine", "my key is hf_" + "a" * 30, "AKIAABCDEFGHIJKLMNOP"])
    evaluation = write_rows(tmp_path / "eval.jsonl", ["-----BEGIN RSA PRIVATE KEY-----"])
    assert secret_rows(str(train), str(evaluation)) == 3
    write_rows(train, ["all clean now"])
    assert secret_rows(str(train), "") == 0, "counted again when the file changes"


def manifest(**tokens: Any) -> dict[str, Any]:
    return {
        "counts": {"train": 90, "eval": 5, "with_errors": 7, "duplicates_removed": 2},
        "tokens": {"seq_len": 2048, "too_long": 0, "cut": 0, "trained_per_epoch": 9000, **tokens},
        "tokenizer": "tokenizer and chat template of Qwen/Qwen2.5-7B-Instruct",
    }


def test_the_data_warnings_name_rows_left_out_secrets_truncation_and_another_tokenizer() -> None:
    draft = rented_draft()
    facts = ReviewFacts(manifest=manifest(too_long=3, cut=1200), secret_rows=2, pick=judged(draft, Fit.FITS))
    found = headlines(draft, facts)
    assert found == [
        ("warning", "3 examples are longer than the sequence length"),
        ("warning", "2 rows kept in the training data look like they hold a secret"),
        ("warning", "7 rows with errors left out"),
        ("warning", "The tokens were counted for another model"),
    ]
    truncation = preflight(draft, facts)[0]
    assert "1,200 tokens" in truncation.details and "--seq-len" not in truncation.details


def test_data_checked_for_another_sequence_length_says_so() -> None:
    draft = rented_draft()
    draft.training = {**draft.training, "seq_len": 4096}
    facts = ReviewFacts(manifest=manifest(too_long=3), pick=judged(draft, Fit.FITS))
    (first, *_) = preflight(draft, facts)
    assert first.headline == "The data was checked for another sequence length"
    assert "2,048 tokens" in first.details and "4,096" in first.details


def test_a_keyring_that_stores_nothing_blocks_renting_with_one_line() -> None:
    draft = rented_draft()
    with using_keyring(keyring.backends.null.Keyring()):
        facts = read_review_facts(draft, SecretStore())
    assert facts.secret_store is not None and facts.secret_store.blocks_renting
    blocking = [check for check in preflight(draft, facts) if check.headline.startswith("The keyring")]
    assert len(blocking) == 1
    (check,) = blocking
    assert check.severity is Severity.DANGER and check.required and check.step == "compute"
    assert check.details == facts.secret_store.problem
    assert check.details.startswith("the keyring backend keyring.backends.null.Keyring stores nothing: unset ")


def test_without_any_keyring_renting_is_not_blocked_and_an_own_server_is_never_probed() -> None:
    draft = rented_draft()
    with using_keyring(keyring.backends.fail.Keyring()):
        facts = read_review_facts(draft, SecretStore())
    assert facts.secret_store is not None and not facts.secret_store.blocks_renting, "run keys go to a file"
    assert not any(check.headline.startswith("The keyring") for check in preflight(draft, facts))
    target = TargetDraft(host="box", user="me", host_key="k", gpu="NVIDIA H100 80GB HBM3, 81559 MiB")
    own = RunDraft(train_file="/t.jsonl", base_model="qwen2.5-7b", target=target)
    with using_keyring(keyring.backends.null.Keyring()):
        assert read_review_facts(own, SecretStore()).secret_store is None


def test_a_malformed_key_in_the_environment_blocks_the_launch_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VAST_API_KEY", "abc def0123456789")
    monkeypatch.setenv("RUNPOD_API_KEY", "not used\tby this draft")
    draft = rented_draft()  # a Vast.ai offer
    facts = read_review_facts(draft, SecretStore())
    (check,) = [check for check in preflight(draft, facts) if check.headline.startswith("A key")]
    assert check.required and check.details.startswith("VAST_API_KEY holds a Vast.ai API key with a space inside")


def test_work_after_training_that_the_budget_would_cut_off_is_amber_and_says_what_happens() -> None:
    draft = rented_draft(provider="vast")
    draft.method, draft.eval_file = "qlora", "/data/eval.jsonl"
    facts = read_review_facts(draft, None)
    assert facts.sizing is not None and facts.pick is not None and facts.pick.total_usd is not None
    train = facts.pick.total_usd
    draft.budget_usd = train + 0.04  # the training fits with 4 cents to spare
    draft.export_on_machine = []  # everything at home: nothing after training
    assert after_training_usd(draft, facts) == 0.0 and preflight(draft, facts) == []
    draft.judge_on_machine = True  # a 7 B model's 50 rows, twice: a few cents at $0.40 per hour
    judging = after_training_usd(draft, facts)
    assert judging > 0.04
    [check] = [check for check in preflight(draft, facts) if "budget" in check.headline]
    assert (check.severity, check.headline) == (Severity.WARNING, "The work after training is above your budget")
    assert f"About ${train:,.2f} to train and ${judging:,.2f} for what the machine does after it" in check.details
    assert "the adapter comes home, then the budget stops the machine before that work ends" in check.details
    draft.budget_usd = train - 0.5  # the training itself is over: the old words
    assert "The estimate is above your budget" in [c.headline for c in preflight(draft, facts)]
    draft.budget_usd = train + judging + 0.01
    assert not [c for c in preflight(draft, facts) if "budget" in c.headline], "room for both"
