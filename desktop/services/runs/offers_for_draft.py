"""Offers for the wizard's draft: every provider asked at once, each offer judged against the draft's sizing.

Providers are asked for on-demand and spot machines; each offer is judged (fits, hours, dollars) as
``rentune offers --model`` judges it.

Asking is async (:func:`ask_market`; a provider without a key is not asked, one that fails is left out with a
sentence saying why). Judging resolves the draft's model and may read the Hub, so :func:`judge_offers` blocks: run
it in an executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from desktop.core.runs.draft import ComputeDraft, RunDraft, gpu_pick_nodes, gpu_pick_training
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.memory import estimate_memory
from desktop.core.sizing.offers import OfferSizing, SizingJob, match_gpu
from desktop.core.sizing.plan import Fit, evaluate
from desktop.core.sizing.setup import Strategy
from desktop.services.data.prepare import manifest_tokens, read_manifest
from desktop.services.models.configs import ModelResolutionError, hub_config_fetcher, resolve_model
from desktop.services.models.sizing import SizingError, draft_workload, resolution_message, training_setup
from desktop.services.platform.secrets import MalformedSecretError, SecretStore, SecretStoreError
from desktop.services.providers.base import (
    AuthError,
    MissingKeyError,
    NoClustersError,
    Offer,
    OfferQuery,
    Provider,
    ProviderError,
    ProviderName,
    SpotUnavailableError,
)
from desktop.services.providers.key_entry import no_keyring_words
from desktop.services.providers.market import PROVIDER_TIMEOUT_S, size_offers
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.providers.words import plain_reason, without_terminal_advice
from desktop.services.runs.store import RunStore

OpenProvider = Callable[[ProviderName, SecretStore | None], Provider]
_FIT_ORDER = {Fit.FITS: 0, Fit.TIGHT: 1, Fit.NO: 2}


class ProviderStatus(StrEnum):
    """How a provider answered."""

    ANSWERED = "answered"
    NO_KEY = "no-key"
    NO_KEYRING = "no-keyring"
    REFUSED = "refused"  # the stored key was refused
    FAILED = "failed"  # an outage, a timeout, an answer that could not be read


@dataclass(frozen=True)
class ProviderAnswer:
    """One provider's part of the market.

    Attributes:
        provider: The provider.
        status: How it answered.
        words: A sentence for the page (what it has, or why it has nothing and what to do).
        count: Offers in stock it listed.
    """

    provider: ProviderName
    status: ProviderStatus
    words: str
    count: int = 0


@dataclass(frozen=True)
class Market:
    """What the providers rent out now.

    Attributes:
        offers: In-stock offers, on-demand and spot, of every provider that answered.
        answers: One answer per provider asked, in the order asked.
    """

    offers: list[Offer]
    answers: list[ProviderAnswer]

    def answer(self, name: ProviderName) -> ProviderAnswer | None:
        """The answer of ``name`` (None when it was not asked)."""
        return next((answer for answer in self.answers if answer.provider is name), None)


@dataclass(frozen=True)
class DraftOffer:
    """An offer judged against the draft.

    Attributes:
        offer: The provider's offer.
        fit: Fits, tight or does not fit (None when the draft could not be sized).
        hours: Billed hours (None when unknown: no sizing, or a GPU whose speed is unknown).
        total_usd: Hours times the machine's price (None when the hours are unknown).
        strategy: How its GPUs share the job (``ddp``, or ``fsdp`` where that does better on several GPUs).
        need_gb: Peak memory per GPU on this machine (None without sizing).
    """

    offer: Offer
    fit: Fit | None = None
    hours: float | None = None
    total_usd: float | None = None
    strategy: str = Strategy.DDP.value
    need_gb: float | None = None

    @property
    def key(self) -> tuple[str, str, bool]:
        """What identifies the offer across refreshes: provider, offer id and spot."""
        return offer_key(self.offer)

    @property
    def fits(self) -> bool:
        """Whether the job fits (tight counts)."""
        return self.fit in {Fit.FITS, Fit.TIGHT}


@dataclass(frozen=True)
class JudgedOffers:
    """The market judged against the draft.

    Attributes:
        offers: Ranked: what fits first, cheapest total first, then the rest by price.
        problem: Why the offers could not be judged (the draft cannot be sized, in a sentence), None when they were.
    """

    offers: list[DraftOffer]
    problem: str | None = None


@dataclass(frozen=True)
class OfferFilter:
    """What the user narrowed the table to.

    Attributes:
        provider: Only this provider (None: all).
        spot: Only spot (True), only on-demand (False), or both (None).
        max_price_per_hour: The whole machine's price at most (None: any).
        fits_only: Only offers the job fits on (tight counts).
    """

    provider: ProviderName | None = None
    spot: bool | None = False
    max_price_per_hour: float | None = None
    fits_only: bool = False

    def admits(self, item: DraftOffer) -> bool:
        """Whether ``item`` passes the filter."""
        offer = item.offer
        return (
            (self.provider is None or offer.provider is self.provider)
            and (self.spot is None or offer.spot == self.spot)
            and (self.max_price_per_hour is None or offer.price_per_hour <= self.max_price_per_hour)
            and (not self.fits_only or item.fits)
        )


def offer_key(offer: Offer) -> tuple[str, str, bool]:
    """Provider, offer id and spot: what identifies an offer across refreshes."""
    return offer.provider.value, offer.offer_id, offer.spot


# -- asking ----------------------------------------------------------------------------------------------------------


def offer_counts(draft: RunDraft) -> tuple[int | None, ...]:
    """The GPU counts to ask for: any (one for RunPod), and the Sizing step's count when it picked several GPUs."""
    picked = int(gpu_pick_training(draft.gpu_name).get("num_gpus", 1))
    return (None, picked) if picked > 1 else (None,)


def offer_nodes(draft: RunDraft) -> int:
    """The machines to ask for as one cluster: the Sizing step's pick of several machines, else 1."""
    return gpu_pick_nodes(draft.gpu_name)


async def ask_market(
    secrets: SecretStore | None,
    counts: Sequence[int | None] = (None,),
    *,
    nodes: int = 1,
    names: Iterable[ProviderName] = tuple(ProviderName),
    open: OpenProvider = open_provider,
    limit_s: float = PROVIDER_TIMEOUT_S,
    on_answer: Callable[[ProviderAnswer], None] | None = None,
) -> Market:
    """Asks every provider with a key for its on-demand and spot offers, all at once.

    Args:
        secrets: Where the API keys are.
        counts: GPU counts to ask for (None: whatever the provider lists by default).
        nodes: Above 1, clusters of that many machines with the last count's GPUs each are asked for too, from
            the providers that rent clusters.
        names: The providers to ask.
        open: Opens a provider's client (tests inject their own).
        limit_s: Seconds each provider has to answer.
        on_answer: Called with each provider's answer as it arrives (progress for a page).
    """

    async def one(name: ProviderName) -> tuple[list[Offer], ProviderAnswer]:
        found, answer = await _ask(name, secrets, (counts, nodes), open, limit_s)
        if on_answer is not None:
            on_answer(answer)
        return found, answer

    results = await asyncio.gather(*(one(name) for name in names))
    return Market([offer for found, _ in results for offer in found], [answer for _, answer in results])


async def _ask(
    name: ProviderName,
    secrets: SecretStore | None,
    asked: tuple[Sequence[int | None], int],
    open: OpenProvider,
    limit_s: float,
) -> tuple[list[Offer], ProviderAnswer]:
    counts, nodes = asked
    try:
        provider = await asyncio.to_thread(open, name, secrets)  # the keyring may block or prompt
    except MissingKeyError:
        words = f"No {name.label} API key yet: add one to see its offers (find it at {PROVIDERS[name].console})."
        return [], ProviderAnswer(name, ProviderStatus.NO_KEY, words)
    except MalformedSecretError as exc:
        return [], ProviderAnswer(name, ProviderStatus.REFUSED, f"{str(exc)[0].upper()}{str(exc)[1:]}.")
    except SecretStoreError:
        return [], ProviderAnswer(name, ProviderStatus.NO_KEYRING, no_keyring_words(name))
    try:
        async with asyncio.timeout(limit_s):
            found, no_spot = await _offers(provider, counts)
            found += await _cluster_offers(provider, counts[-1], nodes)
    except (TimeoutError, ProviderError, ValueError, KeyError, TypeError) as exc:
        return [], _failure(name, exc, limit_s)
    finally:
        await provider.aclose()
    words = _stock_words(name, len(found)) + (f" {_no_spot_words(no_spot)}" if no_spot else "")
    return found, ProviderAnswer(name, ProviderStatus.ANSWERED, words, len(found))


def _failure(name: ProviderName, exc: Exception, limit_s: float) -> ProviderAnswer:
    """Why a provider with a key gave no offers, and what to do."""
    label = name.label
    if isinstance(exc, TimeoutError):
        words = f"{label} did not answer within {limit_s:g} seconds. Press Refresh to ask again."
    elif isinstance(exc, AuthError):
        words = f"{label} refused the stored key. Replace it with a valid one from {PROVIDERS[name].console}."
        return ProviderAnswer(name, ProviderStatus.REFUSED, words)
    elif isinstance(exc, ProviderError):
        words = f"{label} could not list its offers: {plain_reason(exc)}. Press Refresh to try again."
    else:  # an answer the client could not read
        words = f"{label} sent an answer Rentune could not read ({exc}). Press Refresh to try again."
    return ProviderAnswer(name, ProviderStatus.FAILED, words)


async def _offers(provider: Provider, counts: Sequence[int | None]) -> tuple[list[Offer], SpotUnavailableError | None]:
    """In-stock on-demand and spot offers, and why spot offers are missing (None when they are not)."""
    queries = [OfferQuery(count=count, spot=spot) for count in counts for spot in (False, True)]
    answers = await asyncio.gather(*(_listed(provider, query) for query in queries))
    unique = {offer_key(offer): offer for found, _ in answers for offer in found if offer.in_stock}
    return list(unique.values()), next((missing for _, missing in answers if missing), None)


async def _listed(provider: Provider, query: OfferQuery) -> tuple[list[Offer], SpotUnavailableError | None]:
    """The offers for one query; a spot market that cannot be read gives none and why (on-demand offers stay)."""
    try:
        return await provider.offers(query), None
    except SpotUnavailableError as exc:
        return [], exc


def _no_spot_words(exc: SpotUnavailableError) -> str:
    label = exc.provider.label
    return f"No spot offers: {label} could not list them ({plain_reason(exc)}). Press Refresh to try again."


async def _cluster_offers(provider: Provider, count: int | None, nodes: int) -> list[Offer]:
    """Clusters of ``nodes`` machines with ``count`` GPUs each, where the provider rents clusters (none elsewhere)."""
    if nodes <= 1:
        return []
    try:
        found = await provider.offers(OfferQuery(count=count or 1, nodes=nodes))
    except NoClustersError:
        return []
    return [offer for offer in found if offer.in_stock]


def _stock_words(name: ProviderName, count: int) -> str:
    if count == 0:
        return f"{name.label} has no machines in stock right now. Press Refresh later."
    return f"{count:,} offer{'s' if count != 1 else ''} in stock."


# -- judging ---------------------------------------------------------------------------------------------------------


def draft_job(draft: RunDraft, secrets: SecretStore | None = None) -> SizingJob:
    """The draft's model, setup and workload (the data's real token count when it is prepared); blocking.

    Raises:
        SizingError: The draft cannot be sized; the message says how to fix it.
    """
    if not draft.base_model:
        raise SizingError("choose a base model on the Model step first")
    setup = training_setup(draft.method, draft.training)
    try:
        arch = resolve_model(draft.base_model, hub_config_fetcher(secrets))
    except ModelResolutionError as exc:
        raise SizingError(resolution_message(draft.base_model, exc)) from exc
    except ArchitectureError as exc:
        raise SizingError(f"{draft.base_model} cannot be sized: {exc}; choose another model on the Model step") from exc
    manifest = read_manifest(draft.train_file)
    workload, _ = draft_workload(draft.training, setup, manifest_tokens(manifest) if manifest else None)
    return SizingJob(arch, setup, workload)


def judge_offers(
    draft: RunDraft, offers: Sequence[Offer], secrets: SecretStore | None = None, store: RunStore | None = None
) -> JudgedOffers:
    """Judges every offer against the draft and ranks them (blocking: the model may come from the Hub).

    Speeds measured on the user's finished runs replace the catalog's estimates, as ``rentune offers`` does.
    """
    from desktop.services.runs.estimates import calibrated_gpus

    gpus, _ = calibrated_gpus(store)
    job: SizingJob | None = None
    problem: str | None = None
    try:
        job = draft_job(draft, secrets)
    except SizingError as exc:
        problem = sentence(without_terminal_advice(str(exc)), keep=draft.base_model)
    ranked = size_offers(list(offers), job, gpus)
    judged = [_judged(sized.offer, sized.sizing, job, gpus) for sized in ranked]
    return JudgedOffers(judged, problem)


def _judged(offer: Offer, sizing: OfferSizing | None, job: SizingJob | None, gpus: list[GpuSpec]) -> DraftOffer:
    if job is None or sizing is None:
        return DraftOffer(offer)
    strategy = _strategy(job, offer, gpus)
    need = estimate_memory(job.arch, job.setup.with_gpus(offer.count, strategy, offer.nodes)).per_gpu_total
    return DraftOffer(offer, sizing.fit, sizing.hours, sizing.total_usd, strategy.value, need)


def _strategy(job: SizingJob, offer: Offer, gpus: list[GpuSpec]) -> Strategy:
    """DDP or FSDP, whichever does better on the offer's GPUs (the choice :func:`size_offer` judged by)."""
    if offer.count * offer.nodes == 1:
        return Strategy.DDP
    setups = [job.setup.with_gpus(offer.count, s, offer.nodes) for s in (Strategy.DDP, Strategy.FSDP)]
    gpu = match_gpu(gpus, (offer.gpu, offer.gpu_id), offer.vram_gb)
    if gpu is None:  # speed unknown: the one that needs less memory
        return min(setups, key=lambda setup: estimate_memory(job.arch, setup).per_gpu_total).strategy
    priced = replace(gpu, list_price_usd_per_h=offer.price_per_hour / (offer.count * offer.nodes))
    options = [evaluate(job.arch, setup, priced, job.workload) for setup in setups]
    best = min(options, key=lambda o: (_FIT_ORDER[o.fit], o.hours if o.fits else -o.headroom_gb))
    return best.strategy


def cheapest_fitting(offers: Sequence[DraftOffer]) -> DraftOffer | None:
    """The offer to preselect: the cheapest that fits with room, else the cheapest tight one (offers are ranked)."""
    for wanted in (Fit.FITS, Fit.TIGHT):
        found = next((item for item in offers if item.fit is wanted), None)
        if found is not None:
            return found
    return None


# -- the pick ---------------------------------------------------------------------------------------------------------


def pick_of(item: DraftOffer, previous: ComputeDraft, max_price_per_hour: float = 0.0) -> ComputeDraft:
    """The draft's compute choice for a picked offer (the machine settings of ``previous`` kept).

    Args:
        item: The offer picked.
        previous: The draft's choice so far (its Python, user and image stay).
        max_price_per_hour: The user's price limit (0: the pick's price plus the margin).
    """
    offer = item.offer
    return previous.model_copy(
        update={
            "provider": offer.provider.value,
            "offer_id": offer.offer_id,
            "gpu": offer.gpu,
            "gpu_id": offer.gpu_id,
            "count": offer.count,
            "vram_gb": offer.vram_gb,
            "price_per_hour": offer.price_per_hour,
            "spot": offer.spot,
            "reliability": offer.reliability,
            "location": offer.location,
            "nodes": offer.nodes,
            "strategy": item.strategy,
            "max_price_per_hour": max_price_per_hour if max_price_per_hour >= offer.price_per_hour else 0.0,
        }
    )


def offer_of_pick(compute: ComputeDraft) -> Offer:
    """The picked offer as the provider listed it (for judging it again when the draft changes)."""
    return Offer(
        provider=ProviderName(compute.provider),
        offer_id=compute.offer_id,
        gpu=compute.gpu,
        gpu_id=compute.gpu_id,
        count=compute.count,
        vram_gb=compute.vram_gb,
        price_per_hour=compute.price_per_hour,
        spot=compute.spot,
        reliability=compute.reliability,
        location=compute.location,
        nodes=compute.nodes,
    )


def judge_pick(draft: RunDraft, secrets: SecretStore | None = None, store: RunStore | None = None) -> DraftOffer | None:
    """The draft's picked offer judged against the draft as it is now (None when nothing is picked); blocking."""
    if not draft.compute.picked:
        return None
    judged = judge_offers(draft, [offer_of_pick(draft.compute)], secrets, store)
    return judged.offers[0]


def sentence(text: str, keep: str = "") -> str:
    """``text`` as a sentence: a capital first (unless it starts with ``keep``, a name), a full stop last."""
    text = text.strip()
    if not (keep and text.startswith(keep)):
        text = f"{text[:1].upper()}{text[1:]}"
    return text + ("" if text.endswith((".", "!", "?")) else ".")
