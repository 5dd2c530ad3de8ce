"""The wizard's draft rents a machine: ``[compute]`` from the picked offer, old drafts still loading, Start over."""

from __future__ import annotations

import json
from pathlib import Path

from desktop.core.runs.draft import ComputeDraft, RunDraft, TargetDraft
from desktop.core.runs.spec import run_spec_from_dict
from desktop.services.runs.drafts import fresh_draft, load_draft

PICK = ComputeDraft(
    provider="runpod",
    offer_id="NVIDIA A100 80GB PCIe|SECURE|2",
    gpu="A100 PCIe",
    gpu_id="NVIDIA A100 80GB PCIe",
    count=2,
    vram_gb=80,
    price_per_hour=3.28,
    strategy="fsdp",
)


def test_a_draft_saved_before_renting_trains_where_it_did(tmp_path: Path) -> None:
    saved = tmp_path / "draft.json"
    old = {"schema_version": 1, "base_model": "org/m", "target": {"host": "box", "user": "me"}, "step": "target"}
    saved.write_text(json.dumps(old))
    assert not load_draft(saved).renting, "it named a server: it stays on the server"
    saved.write_text(json.dumps({"schema_version": 1, "base_model": "org/m"}))
    assert load_draft(saved).renting, "no server yet: the wizard offers renting"
    assert RunDraft().renting and not RunDraft(target=TargetDraft(host="box", user="me")).renting


def test_a_renting_draft_writes_compute_with_the_machines_gpus_and_a_price_cap(tmp_path: Path) -> None:
    draft = RunDraft(train_file="/d/train.jsonl", base_model="org/m", compute=PICK, budget_usd=20.0)
    draft.gpu_name = "H100 SXM"  # the Sizing step's pick does not decide the rented machine
    data = draft.spec_dict()
    assert "target" not in data
    spec = run_spec_from_dict(data, tmp_path)
    assert spec.compute is not None and spec.target is None
    assert (spec.compute.provider, spec.compute.gpu, spec.compute.count) == ("runpod", "A100 PCIe", 2)
    assert spec.compute.offer == PICK.offer_id and spec.compute.max_price_per_hour == 3.61
    assert (spec.training["num_gpus"], spec.training["strategy"]) == (2, "fsdp")
    assert spec.budget_usd == 20.0 and spec.hourly_rate_usd == 0.0, "a rented machine's price is known"
    capped = draft.model_copy(update={"compute": PICK.model_copy(update={"max_price_per_hour": 4.0})})
    assert capped.spec_dict()["compute"]["max_price_per_hour"] == 4.0


def test_without_a_pick_no_compute_is_written() -> None:
    data = RunDraft(base_model="org/m").spec_dict()
    assert "compute" not in data and "target" not in data and "num_gpus" not in data["training"]


def test_starting_over_keeps_the_data_and_the_machine_setup_only() -> None:
    target = TargetDraft(host="box", user="me", host_key="ssh-ed25519 AAAA", fingerprint="SHA256:x")
    draft = RunDraft(
        data_file="/d/chat.jsonl",
        train_file="/d/train.jsonl",
        eval_file="/d/eval.jsonl",
        base_model="org/m",
        method="full",
        training={"seq_len": 4096},
        gpu_name="H100 SXM",
        compute=PICK.model_copy(update={"python": "/opt/py", "user": "ubuntu"}),
        target=target,
        hourly_rate_usd=2.0,
        budget_usd=50.0,
        step="review",
    )
    fresh = fresh_draft(draft)
    assert (fresh.data_file, fresh.train_file, fresh.eval_file) == (draft.data_file, draft.train_file, draft.eval_file)
    assert fresh.target == target and fresh.hourly_rate_usd == 2.0 and fresh.renting == draft.renting
    assert (fresh.compute.python, fresh.compute.user) == ("/opt/py", "ubuntu") and not fresh.compute.picked
    assert fresh.base_model == "" and fresh.method == RunDraft().method and fresh.training == RunDraft().training
    assert fresh.gpu_name == "" and fresh.budget_usd == 0 and fresh.step == "data"
