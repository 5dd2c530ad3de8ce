"""The market across clouds: every provider asked at once, each within a time limit.

A provider that cannot answer (no key, a refused key, an outage) is left out with a note instead of failing the
whole answer.

Offers can then be joined with a plan (:func:`size_offers`): for each, whether the job fits, its hours and dollars.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.offers import OfferSizing, SizingJob, match_gpu, size_offer, size_unknown_gpu
from desktop.core.sizing.plan import Fit
from desktop.services.platform.secrets import MalformedSecretError, SecretStore, SecretStoreError
from desktop.services.providers.base import (
    Instance,
    MissingKeyError,
    Offer,
    OfferQuery,
    Provider,
    ProviderError,
    ProviderName,
)
from desktop.services.providers.registry import PROVIDERS, open_provider

_T = TypeVar("_T")

#: Seconds each provider has to answer before it is left out.
PROVIDER_TIMEOUT_S = 20.0

OpenProvider = Callable[[ProviderName, SecretStore | None], Provider]


@dataclass(frozen=True)
class MarketOffers:
    """What the providers offer now.

    Attributes:
        offers: In-stock offers of every provider that answered.
        notes: One line per provider left out, and why.
        unkeyed: The providers left out for want of an API key.
        answered: The providers that answered.
    """

    offers: list[Offer]
    notes: list[str]
    unkeyed: list[ProviderName]
    answered: list[ProviderName]


@dataclass(frozen=True)
class MarketInstances:
    """The machines of the user's accounts.

    Attributes:
        instances: Every machine at every provider that answered (each row that could be read).
        notes: One line per provider left out, and why, then one per row or part of a list left out (``unread``).
        unkeyed: The providers left out for want of an API key.
        answered: The providers that answered (their lists are complete but for ``unread``).
        unread: One line per row or part of an answered provider's list that could not be read (a machine that
            may bill unseen).
    """

    instances: list[Instance]
    notes: list[str]
    unkeyed: list[ProviderName]
    answered: list[ProviderName]
    unread: list[str] = field(default_factory=list)


async def _ask(
    name: ProviderName,
    secrets: SecretStore | None,
    open: OpenProvider,
    call: Callable[[Provider], Awaitable[list[_T]]],
    limit_s: float,
) -> tuple[list[_T], str | None, bool]:
    """Asks one provider; returns (items, the note when it was left out, whether for want of a key)."""
    provider, unkeyed = _opened(name, secrets, open)
    if provider is None:
        return [], f"{name.label} skipped: {unkeyed}", True
    try:
        async with asyncio.timeout(limit_s):
            return await call(provider), None, False
    except TimeoutError:
        return [], f"{name.label} skipped: no answer in {limit_s:g} s; try again later", False
    except ProviderError as exc:
        return [], f"{name.label} skipped: {exc.message}", False
    except (ValueError, KeyError, TypeError) as exc:  # an answer the client could not read
        return [], f"{name.label} skipped: unexpected answer from its API ({exc})", False
    finally:
        await provider.aclose()


def _opened(name: ProviderName, secrets: SecretStore | None, open: OpenProvider) -> tuple[Provider | None, str]:
    """The provider's client, or None and why its key cannot be had."""
    try:
        return open(name, secrets), ""
    except MissingKeyError:
        return None, f"no API key; rentune keys set {name.value}"
    except MalformedSecretError as exc:
        return None, str(exc)
    except SecretStoreError:
        return None, f"no API key (no keyring on this computer; set {PROVIDERS[name].secret.env_var})"


async def _ask_all(
    names: list[ProviderName],
    secrets: SecretStore | None,
    open: OpenProvider,
    call: Callable[[Provider], Awaitable[list[_T]]],
    limit_s: float,
) -> tuple[list[_T], list[str], list[ProviderName], list[ProviderName]]:
    answers = await asyncio.gather(*(_ask(name, secrets, open, call, limit_s) for name in names))
    items = [item for found, _, _ in answers for item in found]
    notes = [note for _, note, _ in answers if note]
    unkeyed = [name for name, (_, _, missing) in zip(names, answers, strict=True) if missing]
    answered = [name for name, (_, note, _) in zip(names, answers, strict=True) if note is None]
    return items, notes, unkeyed, answered


async def gather_offers(
    query: OfferQuery,
    names: list[ProviderName],
    secrets: SecretStore | None = None,
    *,
    open: OpenProvider = open_provider,
    limit_s: float = PROVIDER_TIMEOUT_S,
) -> MarketOffers:
    """Asks every provider in ``names`` for offers matching ``query`` at once; out-of-stock offers are left out.

    Args:
        query: What the user asks for.
        names: The providers to ask.
        secrets: Where API keys are read (the keyring and the environment by default).
        open: Opens a provider's client (tests inject their own).
        limit_s: Seconds each provider has to answer.
    """

    async def offers(provider: Provider) -> list[Offer]:
        return [offer for offer in await provider.offers(query) if offer.in_stock]

    return MarketOffers(*await _ask_all(names, secrets, open, offers, limit_s))


async def gather_instances(
    names: list[ProviderName],
    secrets: SecretStore | None = None,
    *,
    open: OpenProvider = open_provider,
    limit_s: float = PROVIDER_TIMEOUT_S,
) -> MarketInstances:
    """Asks every provider in ``names`` for the account's machines at once (see :func:`gather_offers`).

    A provider that answered but left a row or a part of its list out (unreadable, or its cluster list failing)
    adds a note naming it, and its other machines are listed.
    """
    unread: list[str] = []

    async def instances(provider: Provider) -> list[Instance]:
        listing = await provider.listing()
        unread.extend(listing.notes)
        return listing.instances

    found, notes, unkeyed, answered = await _ask_all(names, secrets, open, instances, limit_s)
    return MarketInstances(found, notes + unread, unkeyed, answered, unread)


@dataclass(frozen=True)
class SizedOffer:
    """An offer and the plan on it (None when no plan was asked for)."""

    offer: Offer
    sizing: OfferSizing | None


def size_offers(offers: list[Offer], job: SizingJob | None, gpus: list[GpuSpec]) -> list[SizedOffer]:
    """Joins offers with a plan and ranks them: what fits first, cheapest total first, then the rest by price.

    Args:
        offers: The offers.
        job: The model, setup and workload (None: no plan, offers ranked by price).
        gpus: The GPU catalog.
    """
    return sorted((SizedOffer(offer, _sizing(offer, job, gpus)) for offer in offers), key=_rank)


def _sizing(offer: Offer, job: SizingJob | None, gpus: list[GpuSpec]) -> OfferSizing | None:
    if job is None:
        return None
    gpu = match_gpu(gpus, (offer.gpu, offer.gpu_id), offer.vram_gb)
    if gpu is None:
        return size_unknown_gpu(job, offer.count, offer.vram_gb, offer.nodes)
    return size_offer(job, gpu, offer.count, offer.price_per_hour, offer.nodes)


def _rank(sized: SizedOffer) -> tuple[int, float, float]:
    sizing, price = sized.sizing, sized.offer.price_per_hour
    if sizing is None or sizing.fit is Fit.NO:
        return (2, price, 0.0)
    if sizing.total_usd is None:  # fits, but at an unknown speed: after the ones with a known total
        return (1, price, 0.0)
    return (0, sizing.total_usd, price)
