"""Clusters in the wizard's services: the Sizing step offers several machines when one cannot train the job, the
Compute step asks RunPod for clusters of the picked shape, and the pick becomes ``[compute] nodes``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import run_spec_from_dict
from desktop.services.models.sizing import option_label, size_run
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import MissingKeyError, Provider, ProviderName
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.runs.offers_for_draft import (
    ProviderStatus,
    ask_market,
    judge_offers,
    offer_counts,
    offer_nodes,
    pick_of,
)
from tests.fakes.runpod import FakeRunPod


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    cloud = FakeRunPod(tmp_path / "runpod")
    yield cloud
    cloud.close()


def test_sizing_a_rented_run_no_single_machine_holds_offers_a_cluster() -> None:
    draft = RunDraft(base_model="llama-3.1-405b", method="full")
    options = size_run(draft, None).plan.options
    assert options[0].fits and options[0].nodes > 1, "what fits comes first: a cluster"
    cluster = next(o for o in options if o.nodes > 1 and o.gpu.id == "b200")
    assert option_label(cluster) == "4 machines x 8 x B200 (fsdp)"
    own = RunDraft(base_model="llama-3.1-405b", method="full", renting=False, target={"host": "box", "user": "me"})
    assert all(o.nodes == 1 for o in size_run(own, None).plan.options), "a server is one machine"
    fits_one = RunDraft(base_model="llama-2-70b", method="full")
    assert all(o.nodes == 1 for o in size_run(fits_one, None).plan.options), "one machine of MI300X or B200 holds it"


def test_a_picked_cluster_is_asked_for_judged_on_all_its_gpus_and_written_as_compute_nodes(fake: FakeRunPod) -> None:
    def open_provider(name: ProviderName, _secrets: object) -> Provider:
        if name is ProviderName.RUNPOD:
            return RunPodProvider(fake.valid_key, transport=fake.transport(), retry=RetryPolicy(first_delay=0.01))
        raise MissingKeyError(name, "no key")

    draft = RunDraft(
        base_model="qwen2.5-7b",
        method="full",
        train_file="/data/train.jsonl",
        gpu_name="2 machines x 8 x RTX 4090 (fsdp)",
    )
    assert (offer_counts(draft), offer_nodes(draft)) == ((None, 8), 2)
    market = asyncio.run(ask_market(SecretStore(), offer_counts(draft), nodes=2, open=open_provider))
    runpod = next(a for a in market.answers if a.provider is ProviderName.RUNPOD)
    assert runpod.status is ProviderStatus.ANSWERED
    clusters = [o for o in market.offers if o.nodes == 2]
    assert clusters and all(o.count == 8 and not o.spot for o in clusters)
    (cluster,) = [o for o in clusters if o.gpu == "RTX 4090"]
    assert (cluster.count, cluster.gpu) == (8, "RTX 4090") and cluster.price_per_hour == pytest.approx(0.69 * 16)
    (judged,) = judge_offers(draft, [cluster]).offers
    assert judged.need_gb is not None and judged.hours is not None
    single = judge_offers(draft, [o for o in market.offers if o.count == 8 and o.nodes == 1][:1]).offers[0]
    assert judged.need_gb < single.need_gb, "sharded over 16 GPUs, not 8"
    draft.compute = pick_of(judged, draft.compute)
    spec = run_spec_from_dict(draft.spec_dict(), Path("/runs"))
    assert spec.compute is not None and (spec.compute.nodes, spec.compute.count) == (2, 8)
    assert spec.training["num_gpus"] == 8 and spec.training["strategy"] == judged.strategy
