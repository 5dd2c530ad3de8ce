"""Rent or buy from the user's own runs (:mod:`desktop.core.costs.rent_or_buy`).

The rented side is the last 90 days of the ledger: each run's dollars in that window and its hours of training (its
bill split by phase), at the speed of the GPUs it rented; the owned side is a card from ``resources/owned_cards.json``
with the user's edits. Speeds are the GPU catalog's, corrected by what the user's runs measured.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace

from desktop.core.costs.rent_or_buy import (
    HISTORY_DAYS,
    CardsTable,
    OwnedCard,
    RentedSample,
    RentedTraining,
    RentOrBuy,
    cards_from_json,
    rented_at_list_price,
    rented_from_history,
    training_speed,
)
from desktop.core.runs.bill_phases import BilledStretch, split_bill
from desktop.core.settings import RentOrBuyChoice
from desktop.core.sizing.gpus import GpuSpec, find_gpu
from desktop.services.billing.ledger import Ledger, Rental
from desktop.services.platform.resources import resource_bytes
from desktop.services.runs.bill import BillEvents
from desktop.services.runs.estimates import calibrated_gpus
from desktop.services.runs.store import RunStore

#: The rented GPU compared against when the user has no rented training yet.
DEFAULT_RENTED_GPU = "h100-sxm"
DEFAULT_RENTED_NAME = "H100 SXM"
#: This computer's id among the cards, and what it is taken to draw while it trains (the user edits it).
THIS_COMPUTER = "this-computer"
THIS_COMPUTER_WATTS = 120.0
THIS_COMPUTER_SOURCE = (
    "Speed: measured by your newest trial, run {run} (its tokens per second times the training FLOPs per token). "
    "Price: already yours, so none; power: an assumption of 120 W while it trains."
)
_COUNT = re.compile(r"^(\d+)\s*x\s+(.+)$", re.IGNORECASE)


class RentOrBuyError(ValueError):
    """The comparison cannot be made as asked; the message says what to change."""


@dataclass(frozen=True)
class RentOrBuyReport:
    """A rent-or-buy comparison with what it rests on.

    Attributes:
        comparison: Renting against owning the card (None: no hours to compare, see ``missing``).
        table: The cards table.
        card: The card weighed, with the user's edits.
        history: The last 90 days' rented training as a year (None: none trained).
        left_out: Runs in the window on GPU types Rentune does not know (their speed is unknown).
        measured: GPU types whose speed comes from the user's runs.
        missing: Why there is no comparison, and what to do.
    """

    comparison: RentOrBuy | None
    table: CardsTable
    card: OwnedCard
    history: RentedTraining | None
    left_out: int
    measured: tuple[str, ...]
    missing: str = ""


def load_cards_table(gpus: list[GpuSpec], store: RunStore | None = None) -> CardsTable:
    """The cards table shipped in ``resources/``, with the speeds of ``gpus``.

    With ``store``, this computer comes first when a trial measured its speed (see :func:`this_computer`).
    """
    table = cards_from_json(json.loads(resource_bytes("owned_cards.json")), gpus)
    here = this_computer(store) if store is not None else None
    return replace(table, cards=(here, *table.cards)) if here is not None else table


def this_computer(store: RunStore) -> OwnedCard | None:
    """This computer as a card, at the speed its newest trial measured: already paid for, so only its power costs.

    None before any trial measured it. Its memory is what the trial trained in (the GPU's, or the computer's).
    """
    trials = [r for r in store.all() if _measured(r.spec.get("trial"))]
    if not trials:
        return None
    newest = max(trials, key=lambda record: record.updated)
    trial = newest.spec["trial"]
    memory = float(trial.get("memory_gb") or 0.0)
    gpu = GpuSpec(THIS_COMPUTER, "this computer", memory, float(trial["achieved_tflops"]), "pcie", 0.0, 1.0)
    where = {"gpu": "its GPU", "mlx": "MLX"}.get(str(trial.get("backend")), "its CPU")
    source = THIS_COMPUTER_SOURCE.format(run=newest.id)
    return OwnedCard(THIS_COMPUTER, f"This computer ({where})", gpu, 0.0, THIS_COMPUTER_WATTS, 0.0, 1.0, source)


def rented_gpu(gpus: list[GpuSpec], label: str) -> tuple[GpuSpec | None, int]:
    """The catalog GPU a rental names (``H100 SXM``, ``2x RTX 4090``) and how many of it each machine has."""
    match = _COUNT.match(label.strip())
    count, name = (int(match.group(1)), match.group(2)) if match else (1, label.strip())
    return find_gpu(gpus, name), max(1, count)


def rented_samples(
    store: RunStore,
    gpus: list[GpuSpec],
    *,
    ledger: Ledger | None = None,
    events: BillEvents | None = None,
    now: float | None = None,
    days: float = HISTORY_DAYS,
) -> tuple[list[RentedSample], int]:
    """Each run's rented training in the last ``days`` days (blocking), and how many runs' GPUs are unknown."""
    moment = time.time() if now is None else now
    start = moment - days * 86400
    by_run: dict[str, list[Rental]] = {}
    for rental in (ledger or Ledger()).rentals():
        if rental.made and rental.end(moment) > start:
            by_run.setdefault(rental.run_id, []).append(rental)
    events = events or BillEvents()
    samples, unknown = [], 0
    for run_id, rentals in by_run.items():
        gpu, count = rented_gpu(gpus, rentals[0].gpu)
        if gpu is None:
            unknown += 1
            continue
        stretches = [BilledStretch(max(r.started, start), r.end(moment), r.price_per_hour) for r in rentals]
        split = split_bill(stretches, store.transitions(run_id), events.of(store.runs_dir / run_id))
        machines = len({r.node for r in rentals if r.node is not None}) or 1
        speed = training_speed(gpu, count, machines)
        samples.append(RentedSample(split.training_hours, split.usd, speed, gpu.name, gpu.vram_gib))
    return samples, unknown


def _measured(trial: object) -> bool:
    speed = trial.get("achieved_tflops") if isinstance(trial, dict) else None
    return isinstance(speed, int | float) and speed > 0


def weigh_card(table: CardsTable, choice: RentOrBuyChoice) -> OwnedCard:
    """The card ``choice`` names with the user's figures in place of the table's.

    Raises:
        RentOrBuyError: The table has no such card.
    """
    card = table.card(choice.card)
    if card is None:
        known = ", ".join(card.id for card in table.cards)
        raise RentOrBuyError(f"no card {choice.card!r} in the cards table; choose one of {known}")
    return replace(
        card,
        price_usd=_given(choice.price_usd, card.price_usd),
        watts=_given(choice.watts, card.watts),
        resale_percent=_given(choice.resale_percent, card.resale_percent),
        years=_given(choice.years, card.years),
    )


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def rent_or_buy(
    choice: RentOrBuyChoice,
    store: RunStore,
    *,
    ledger: Ledger | None = None,
    events: BillEvents | None = None,
    now: float | None = None,
) -> RentOrBuyReport:
    """Renting as the user has rented (or a GPU type at its list price) against owning the chosen card (blocking).

    Raises:
        RentOrBuyError: The card or the rented GPU type is unknown.
        LedgerError: The ledger cannot be read.
    """
    gpus, calibrations = calibrated_gpus(store)
    table = load_cards_table(gpus, store)
    card = weigh_card(table, choice)
    samples, unknown = rented_samples(store, gpus, ledger=ledger, events=events, now=now)
    history = rented_from_history(samples)
    measured = tuple(gpu.name for gpu in gpus if gpu.id in calibrations)
    report = RentOrBuyReport(None, table, card, history, unknown, measured)
    rented = _rented(choice, history, gpus)
    if rented is None:
        return replace(report, missing=_no_hours(unknown))
    kwh = choice.kwh_usd if choice.kwh_usd is not None else table.kwh_usd
    return replace(report, comparison=RentOrBuy(rented, card, kwh))


def _rented(choice: RentOrBuyChoice, history: RentedTraining | None, gpus: list[GpuSpec]) -> RentedTraining | None:
    """What renting means here: the user's history, or a GPU type at its list price; None without hours.

    A GPU type chosen with no hours given does the history's work: its hours are those of the history's speed.
    """
    if choice.rent_gpu is None and history is not None:
        return history if choice.hours_per_year is None else history.with_hours(choice.hours_per_year)
    gpu = find_gpu(gpus, choice.rent_gpu or DEFAULT_RENTED_GPU)
    if gpu is None:
        known = ", ".join(gpu.id for gpu in gpus)
        raise RentOrBuyError(f"no GPU type {choice.rent_gpu!r} in the catalog; choose one of {known}")
    hours = choice.hours_per_year
    if hours is None and history is not None:
        hours = history.hours_per_year * history.speed / training_speed(gpu)
    return None if hours is None else rented_at_list_price(gpu, hours)


def _no_hours(unknown: int) -> str:
    """Why there is nothing to compare yet: no rented training in the window."""
    runs = "1 run rented a GPU type" if unknown == 1 else f"{unknown} runs rented GPU types"
    unknown_words = f" ({runs} Rentune does not know)" if unknown else ""
    return (
        f"no rented training in the last {HISTORY_DAYS} days{unknown_words}: give the hours of training you expect a "
        "year"
    )
