"""Offers for the wizard's draft: each provider's answer in a sentence (offers, no key, a refused key, an outage, a
timeout), on-demand and spot merged, every offer judged for the draft, and the pick carried to and from the draft."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from desktop.core.runs.draft import ComputeDraft, RunDraft
from desktop.core.sizing.plan import Fit
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import AuthError, MissingKeyError, Offer, Provider, ProviderError, ProviderName
from desktop.services.providers.http import RetryPolicy
from desktop.services.providers.runpod import RunPodProvider
from desktop.services.runs.offers_for_draft import (
    DraftOffer,
    OfferFilter,
    ProviderStatus,
    ask_market,
    cheapest_fitting,
    judge_offers,
    judge_pick,
    offer_counts,
    offer_of_pick,
    pick_of,
)
from tests.fakes.runpod import FakeRunPod
from tests.providers.test_market import MemoryProvider, offer, opener

RUNPOD, VAST, LAMBDA = ProviderName.RUNPOD, ProviderName.VAST, ProviderName.LAMBDA


def spot(item: Offer) -> Offer:
    return replace(item, spot=True, price_per_hour=round(item.price_per_hour / 2, 2))


def test_each_provider_answers_in_a_sentence() -> None:
    runpod = MemoryProvider(RUNPOD, [offer(RUNPOD, "RTX 4090", 0.69), spot(offer(RUNPOD, "RTX 4090", 0.69))])
    vast = MemoryProvider(VAST, failure=AuthError(VAST, "the API key was refused (bad); rentune keys set vast"))
    lam = MemoryProvider(LAMBDA, failure=ProviderError(LAMBDA, "HTTP 503: down for maintenance; run rentune doctor"))
    heard: list[ProviderName] = []
    market = asyncio.run(
        ask_market(SecretStore(), open=opener(runpod, vast, lam), on_answer=lambda a: heard.append(a.provider))
    )
    assert sorted(heard) == sorted(ProviderName), "every answer is announced as it arrives"
    assert [(o.gpu, o.spot) for o in market.offers] == [("RTX 4090", False), ("RTX 4090", True)]
    answers = {answer.provider: answer for answer in market.answers}
    assert answers[RUNPOD].status is ProviderStatus.ANSWERED and answers[RUNPOD].count == 2
    assert answers[VAST].status is ProviderStatus.REFUSED
    assert answers[VAST].words.startswith("Vast.ai refused the stored key.")
    assert answers[LAMBDA].status is ProviderStatus.FAILED
    assert answers[LAMBDA].words == (
        "Lambda could not list its offers: HTTP 503: down for maintenance. Press Refresh to try again."
    )
    assert all("rentune" not in answer.words for answer in market.answers), "no command lines in the app's words"
    assert runpod.closed and vast.closed and lam.closed


def test_a_provider_without_a_key_is_not_asked_and_a_slow_one_is_left_out() -> None:
    slow = MemoryProvider(VAST, [offer(VAST, "A100", 1.1, vram=80)], delay=5)
    market = asyncio.run(ask_market(SecretStore(), open=opener(slow), limit_s=0.2))
    answers = {answer.provider: answer for answer in market.answers}
    assert answers[RUNPOD].status is ProviderStatus.NO_KEY and "add one to see its offers" in answers[RUNPOD].words
    assert answers[VAST].status is ProviderStatus.FAILED
    assert answers[VAST].words == "Vast.ai did not answer within 0.2 seconds. Press Refresh to ask again."
    assert market.offers == []


def test_out_of_stock_and_repeated_offers_are_left_out() -> None:
    listed = [offer(RUNPOD, "A10", 0.5), offer(RUNPOD, "H100 SXM", 2.99, vram=80, in_stock=False)]
    market = asyncio.run(ask_market(SecretStore(), (None, 2), open=opener(MemoryProvider(RUNPOD, listed))))
    assert [o.gpu for o in market.offers] == ["A10"], "asked for two counts, listed once"
    assert market.answer(RUNPOD) is not None and market.answer(RUNPOD).count == 1  # type: ignore[union-attr]


def test_several_gpus_picked_on_the_sizing_step_are_asked_for_too() -> None:
    assert offer_counts(RunDraft()) == (None,)
    assert offer_counts(RunDraft(gpu_name="4 x H100 SXM (fsdp)")) == (None, 4)


def test_offers_are_judged_for_the_draft_and_the_cheapest_that_fits_is_found() -> None:
    offers = [
        offer(RUNPOD, "RTX 4090", 0.44),
        offer(VAST, "A100 SXM4", 1.1, vram=80),
        offer(VAST, "RTX 3090", 0.52, count=2),
        offer(LAMBDA, "H100", 2.49, vram=80),
    ]
    judged = judge_offers(RunDraft(base_model="qwen2.5-7b", method="lora"), offers)
    assert judged.problem is None
    fits = {item.offer.gpu: item.fit for item in judged.offers}
    assert fits["RTX 4090"] is Fit.NO and fits["A100 SXM4"] is Fit.FITS
    best = cheapest_fitting(judged.offers)
    assert (
        best is not None
        and best.fits
        and best.total_usd == min(item.total_usd for item in judged.offers if item.fits and item.total_usd is not None)
    )
    pair = next(item for item in judged.offers if item.offer.count == 2)
    assert pair.strategy in {"ddp", "fsdp"} and pair.need_gb is not None
    too_small = next(item for item in judged.offers if item.offer.gpu == "RTX 4090")
    assert too_small.need_gb is not None and too_small.need_gb > 24


def test_a_draft_that_cannot_be_sized_lists_its_offers_unjudged_by_price() -> None:
    offers = [offer(VAST, "A100 SXM4", 1.1, vram=80), offer(RUNPOD, "RTX 4090", 0.44)]
    judged = judge_offers(RunDraft(base_model="no-such-model-anywhere"), offers)
    assert judged.problem is not None and judged.problem.startswith(
        "no-such-model-anywhere is not a model Rentune knows"
    )
    assert "rentune" not in judged.problem
    assert [item.offer.price_per_hour for item in judged.offers] == [0.44, 1.1]
    assert cheapest_fitting(judged.offers) is None


def test_the_filter_admits_by_provider_kind_price_and_fit() -> None:
    cheap = DraftOffer(offer(RUNPOD, "RTX 4090", 0.44), Fit.NO)
    good = DraftOffer(spot(offer(VAST, "A100", 1.2, vram=80)), Fit.FITS)
    assert OfferFilter().admits(cheap) and not OfferFilter().admits(good), "on-demand only by default"
    assert OfferFilter(spot=None, fits_only=True).admits(good) and not OfferFilter(fits_only=True).admits(cheap)
    assert not OfferFilter(spot=None, provider=RUNPOD).admits(good)
    assert not OfferFilter(max_price_per_hour=0.4).admits(cheap)


def test_a_pick_goes_into_the_draft_and_is_judged_again_from_it() -> None:
    judged = judge_offers(RunDraft(base_model="qwen2.5-0.5b"), [offer(VAST, "RTX 3090", 0.52, count=2)])
    (item,) = judged.offers
    previous = ComputeDraft(python="/opt/py", user="ubuntu")
    compute = pick_of(item, previous, max_price_per_hour=0.3)
    assert (compute.provider, compute.offer_id, compute.count, compute.strategy) == (
        "vast",
        item.offer.offer_id,
        2,
        item.strategy,
    )
    assert compute.python == "/opt/py" and compute.max_price_per_hour == 0.0, "a limit below the price is no cap"
    assert pick_of(item, previous, max_price_per_hour=0.8).max_price_per_hour == 0.8
    assert offer_of_pick(compute) == replace(item.offer, in_stock=True)
    draft = RunDraft(base_model="qwen2.5-0.5b", compute=compute)
    again = judge_pick(draft)
    assert again is not None and again.key == item.key and again.total_usd == item.total_usd
    draft.training = {**draft.training, "epochs": 6}
    longer = judge_pick(draft)
    assert longer is not None and longer.total_usd is not None and longer.total_usd > (item.total_usd or 0)
    assert judge_pick(RunDraft()) is None


def test_spot_offers_runpod_cannot_list_are_missing_in_words_and_its_on_demand_offers_stay(tmp_path: Path) -> None:
    """RunPod's GraphQL (spot only) is retired: its on-demand offers are listed, and the answer says spot is missing."""
    fake = FakeRunPod(tmp_path / "runpod")
    fake.graphql_status = 410

    def open_runpod(name: ProviderName, _secrets: SecretStore | None) -> Provider:
        if name is not RUNPOD:
            raise MissingKeyError(name, "no API key")
        return RunPodProvider(fake.valid_key, transport=fake.transport(), retry=RetryPolicy(first_delay=0.01))

    try:
        market = asyncio.run(ask_market(SecretStore(), open=open_runpod))
    finally:
        fake.close()
    answer = market.answer(RUNPOD)
    assert answer is not None and answer.status is ProviderStatus.ANSWERED
    assert market.offers and not any(o.spot for o in market.offers), "on-demand offers stay, no spot ones"
    assert answer.count == len(market.offers)
    assert "No spot offers: RunPod could not list them (GraphQL answered 410" in answer.words
    assert answer.words.startswith(f"{answer.count} offers in stock.") and "rentune" not in answer.words
