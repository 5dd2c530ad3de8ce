"""The market across providers: asked at once, merged, out-of-stock and failing providers left out with a note, and
offers joined with the sizing engine (fits, tight, no; unknown GPUs judged on memory alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from desktop.core.sizing.offers import SizingJob, match_gpu
from desktop.core.sizing.plan import Fit, Workload
from desktop.core.sizing.setup import Method, TrainingSetup
from desktop.services.models.configs import load_gpus, resolve_model
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import (
    AuthError,
    Instance,
    InstanceState,
    MissingKeyError,
    Offer,
    OfferQuery,
    Provider,
    ProviderName,
    RentRequest,
    named_in,
    offer_matches,
)
from desktop.services.providers.key_entry import key_state
from desktop.services.providers.listing import Listing, Unread
from desktop.services.providers.market import gather_instances, gather_offers, size_offers

RUNPOD, VAST, LAMBDA = ProviderName.RUNPOD, ProviderName.VAST, ProviderName.LAMBDA


def offer(
    provider: ProviderName, gpu: str, price: float, *, count: int = 1, vram: float = 24, in_stock: bool = True
) -> Offer:
    """An offer with an id made of its provider, GPU and price."""
    return Offer(
        provider, f"{provider.value}:{gpu}:{price}", gpu, gpu.lower(), count, vram, price, False, None, "EU", in_stock
    )


@dataclass
class MemoryProvider:
    """A provider held in memory: its offers and machines, an optional failure, a delay, and what was done to it."""

    name: ProviderName
    stock: list[Offer] = field(default_factory=list)
    machines: list[Instance] = field(default_factory=list)
    failure: Exception | None = None
    delay: float = 0.0
    terminated: list[str] = field(default_factory=list)
    closed: bool = False
    unread: list[Unread] = field(default_factory=list)

    async def _answer(self) -> None:
        await asyncio.sleep(self.delay)
        if self.failure is not None:
            raise self.failure

    async def check_key(self) -> None:
        """Fails like the provider would."""
        await self._answer()

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """The offers matching ``query``, out-of-stock ones included (as the interface says)."""
        await self._answer()
        return [o for o in self.stock if offer_matches(o, query)]

    async def create(self, request: RentRequest) -> Instance:
        """The market never rents: a call is a test failure."""
        raise AssertionError(f"the market rented {request.label}")

    async def get(self, instance_id: str) -> Instance:
        """The machine by id (terminated once it is forgotten, as providers answer)."""
        await self._answer()
        found = [i for i in self.machines if i.instance_id == instance_id]
        return found[0] if found else Instance(self.name, instance_id, "", InstanceState.TERMINATED, 0.0)

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """The market never rents: a call is a test failure."""
        raise AssertionError(f"the market completed a create of {instance_id}")

    async def named(self, label: str) -> list[Instance]:
        """The machines named ``label`` that are not gone."""
        await self._answer()
        return named_in(self.machines, label)

    async def stop(self, instance_id: str) -> None:
        """The market never stops a machine: a call is a test failure."""
        raise AssertionError(f"the market stopped {instance_id}")

    async def terminate(self, instance_id: str) -> None:
        """Records the termination and forgets the machine."""
        await self._answer()
        self.terminated.append(instance_id)
        self.machines = [i for i in self.machines if i.instance_id != instance_id]

    async def instances(self) -> list[Instance]:
        """Every machine."""
        await self._answer()
        return list(self.machines)

    async def listing(self) -> Listing:
        """Every machine, and the rows or parts a test says could not be read."""
        await self._answer()
        return Listing(self.name, list(self.machines), list(self.unread))

    async def aclose(self) -> None:
        """Remembers that the client was closed."""
        self.closed = True


def opener(*providers: MemoryProvider) -> Callable[[ProviderName, SecretStore | None], Provider]:
    """Opens the given providers; any other has no key."""
    by_name = {p.name: p for p in providers}

    def open_one(name: ProviderName, secrets: SecretStore | None) -> Provider:
        if name not in by_name:
            raise MissingKeyError(name, "no API key")
        return by_name[name]

    return open_one


def machine(provider: ProviderName, instance_id: str, name: str, state: InstanceState, price: float) -> Instance:
    """A machine at a provider."""
    return Instance(provider, instance_id, name, state, price)


async def test_offers_of_every_provider_are_merged_and_out_of_stock_left_out() -> None:
    runpod = MemoryProvider(RUNPOD, [offer(RUNPOD, "RTX 4090", 0.69), offer(RUNPOD, "H100 SXM", 2.99, in_stock=False)])
    lam = MemoryProvider(LAMBDA, [offer(LAMBDA, "A10", 0.75), offer(LAMBDA, "H100 SXM", 2.49, vram=80)])
    market = await gather_offers(OfferQuery(), [RUNPOD, VAST, LAMBDA], open=opener(runpod, lam))
    assert sorted(o.offer_id for o in market.offers) == [
        "lambda:A10:0.75",
        "lambda:H100 SXM:2.49",
        "runpod:RTX 4090:0.69",
    ]
    assert market.notes == ["Vast.ai skipped: no API key; rentune keys set vast"]
    assert market.unkeyed == [VAST]
    assert runpod.closed and lam.closed


async def test_the_query_reaches_the_providers() -> None:
    lam = MemoryProvider(LAMBDA, [offer(LAMBDA, "A10", 0.75), offer(LAMBDA, "H100 SXM", 2.49, vram=80)])
    market = await gather_offers(OfferQuery(min_vram_gb=40), [LAMBDA], open=opener(lam))
    assert [o.gpu for o in market.offers] == ["H100 SXM"]


async def test_a_failing_provider_is_skipped_with_its_own_message() -> None:
    refused = AuthError(RUNPOD, "the API key was refused (Unauthorized); set a valid key")
    runpod = MemoryProvider(RUNPOD, [offer(RUNPOD, "RTX 4090", 0.69)], failure=refused)
    vast = MemoryProvider(VAST, [offer(VAST, "RTX 3090", 0.22)])
    market = await gather_offers(OfferQuery(), [RUNPOD, VAST], open=opener(runpod, vast))
    assert [o.offer_id for o in market.offers] == ["vast:RTX 3090:0.22"]
    assert market.notes == ["RunPod skipped: the API key was refused (Unauthorized); set a valid key"]
    assert market.unkeyed == []
    assert runpod.closed


async def test_a_slow_provider_is_left_out_after_the_time_limit() -> None:
    slow = MemoryProvider(VAST, [offer(VAST, "RTX 3090", 0.22)], delay=5)
    lam = MemoryProvider(LAMBDA, [offer(LAMBDA, "A10", 0.75)])
    market = await gather_offers(OfferQuery(), [VAST, LAMBDA], open=opener(slow, lam), limit_s=0.05)
    assert [o.gpu for o in market.offers] == ["A10"]
    assert market.notes == ["Vast.ai skipped: no answer in 0.05 s; try again later"]
    assert slow.closed


async def test_instances_are_gathered_the_same_way() -> None:
    running = machine(RUNPOD, "pod-1", "rentune-x", InstanceState.RUNNING, 0.69)
    runpod = MemoryProvider(RUNPOD, machines=[running])
    broken = MemoryProvider(LAMBDA, failure=AuthError(LAMBDA, "the API key was refused"))
    found = await gather_instances([RUNPOD, VAST, LAMBDA], open=opener(runpod, broken))
    assert found.instances == [running]
    assert found.notes == [
        "Vast.ai skipped: no API key; rentune keys set vast",
        "Lambda skipped: the API key was refused",
    ]
    assert found.unkeyed == [VAST]


@pytest.fixture(scope="module")
def qwen14b_job() -> SizingJob:
    """QLoRA on Qwen2.5-14B with the defaults: about 21.7 GB per GPU (fits a 4090, tight on an A10 or L4)."""
    return SizingJob(resolve_model("qwen2.5-14b"), TrainingSetup(), Workload())


def test_offers_that_fit_come_first_cheapest_total_first(qwen14b_job: SizingJob) -> None:
    offers = [
        offer(VAST, "RTX 4090", 0.40),
        offer(LAMBDA, "A10", 0.75),
        offer(RUNPOD, "H100 SXM", 2.50, vram=80),
        offer(VAST, "Tesla T4", 0.10, vram=16),  # unknown to the catalog, too small
        offer(VAST, "Radeon W7900", 0.90, vram=48),  # unknown to the catalog, large enough
    ]
    ranked = size_offers(offers, qwen14b_job, list(load_gpus()))
    got = [(s.offer.gpu, s.sizing.fit if s.sizing else None) for s in ranked]
    assert got == [
        ("RTX 4090", Fit.FITS),
        ("H100 SXM", Fit.FITS),
        ("A10", Fit.TIGHT),
        ("Radeon W7900", Fit.FITS),
        ("Tesla T4", Fit.NO),
    ]
    totals = [s.sizing.total_usd for s in ranked if s.sizing]
    assert totals[:3] == sorted(totals[:3])  # type: ignore[type-var]
    for sized in ranked[:3]:
        assert sized.sizing and sized.sizing.hours
        assert sized.sizing.total_usd == pytest.approx(sized.sizing.hours * sized.offer.price_per_hour, abs=0.01)


def test_an_unknown_gpu_gets_no_hours_and_no_dollars(qwen14b_job: SizingJob) -> None:
    (sized,) = size_offers([offer(VAST, "Radeon W7900", 0.90, vram=48)], qwen14b_job, list(load_gpus()))
    assert sized.sizing is not None
    assert (sized.sizing.fit, sized.sizing.hours, sized.sizing.total_usd) == (Fit.FITS, None, None)


def test_a_job_too_big_for_the_gpus_does_not_fit_and_several_gpus_can_help() -> None:
    full = SizingJob(resolve_model("qwen2.5-7b"), TrainingSetup(method=Method.FULL), Workload())
    one, eight = offer(RUNPOD, "RTX 4090", 0.69), offer(RUNPOD, "H100 SXM", 24.0, count=8, vram=80)
    ranked = size_offers([one, eight], full, list(load_gpus()))
    assert [(s.offer.count, s.sizing.fit if s.sizing else None) for s in ranked] == [(8, Fit.FITS), (1, Fit.NO)]
    assert ranked[1].sizing and ranked[1].sizing.hours is not None  # a catalog GPU keeps its hours even when too small


def test_without_a_plan_offers_are_ranked_by_price() -> None:
    offers = [offer(LAMBDA, "A10", 0.75), offer(VAST, "RTX 3090", 0.22), offer(RUNPOD, "RTX 4090", 0.69)]
    ranked = size_offers(offers, None, list(load_gpus()))
    assert [s.offer.price_per_hour for s in ranked] == [0.22, 0.69, 0.75]
    assert all(s.sizing is None for s in ranked)


def test_a_gpu_name_is_matched_with_its_memory() -> None:
    gpus = list(load_gpus())
    assert (match_gpu(gpus, ("A100",), 40) or gpus[0]).id == "a100-40gb"
    assert (match_gpu(gpus, ("A100",), 80) or gpus[0]).id == "a100-80gb"
    assert (match_gpu(gpus, ("nope", "NVIDIA A10"), 24) or gpus[0]).id == "a10"
    assert (match_gpu(gpus, ("H100", "gpu_1x_h100_pcie"), 80) or gpus[0]).id == "h100-pcie"  # the id tells the form
    assert (match_gpu(gpus, ("A100 SXM4",), 80) or gpus[0]).id == "a100-80gb"
    assert (match_gpu(gpus, ("A100 PCIe", "NVIDIA A100 80GB PCIe"), 80) or gpus[0]).id == "a100-80gb"
    assert match_gpu(gpus, ("RTX 4090",), 48) is None  # a name with the wrong memory is not trusted


async def test_a_malformed_key_in_the_environment_is_named_not_called_a_missing_keyring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_ key")
    market = await gather_offers(OfferQuery(), [RUNPOD], secrets=SecretStore())
    [note] = market.notes
    assert note.startswith("RunPod skipped: RUNPOD_API_KEY holds a RunPod API key with a space inside")
    assert "keyring" in note and "no keyring on this computer" not in note
    assert market.unkeyed == [RUNPOD]
    state = key_state(RUNPOD, SecretStore())
    assert not state.present and state.words.startswith("RUNPOD_API_KEY holds a RunPod API key with a space inside")
