"""Rent or buy: a year of renting GPUs against owning a card, adjusted for speed, and the break-even hours (pure).

Renting costs what the user's rented training really cost per hour of training (the effective training hour: every
billed dollar, paid idle included, over the hours of training) times the hours of training a year. Owning costs the
card's loss of value per year (its price less its resale after the years it is kept, spread over those years) plus
the electricity of the hours it needs for the same training: a card at a quarter of the rented GPUs' speed needs
four times their hours. Speeds are training throughput (a GPU type's TFLOPS times the share of them training
reaches, measured on the user's runs where there are any), so one job's speeds on two cards compare as the cards do.

The break-even is the yearly rented training at which both cost the same: above it owning is cheaper. There is none
when an hour of the card's electricity costs as much as the rented hour it replaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.setup import Strategy
from desktop.core.sizing.throughput import scaling_factor

#: Hours in a year: a card cannot train more than this.
HOURS_PER_YEAR = 24 * 365
#: The history the yearly hours are extrapolated from.
HISTORY_DAYS = 90


def training_speed(gpu: GpuSpec, gpus_per_machine: int = 1, machines: int = 1) -> float:
    """Training throughput of ``machines`` machines of ``gpus_per_machine`` GPUs of this type, in achieved TFLOPS."""
    return gpu.bf16_tflops * gpu.mfu * scaling_factor(gpus_per_machine, Strategy.DDP, gpu) * machines


@dataclass(frozen=True)
class OwnedCard:
    """A card the user considers buying, as the cards table in ``resources/`` and the user's edits describe it.

    Attributes:
        id: The table's id (``rtx4090``).
        name: What people call it.
        gpu: Its GPU type in the catalog (its memory and speed).
        price_usd: What it costs to buy.
        watts: What the computer draws while it trains (the card and the rest of the computer).
        resale_percent: What it sells for after ``years``, in percent of its price.
        years: How long it is kept.
        source: Where the table's figures come from, and when.
    """

    id: str
    name: str
    gpu: GpuSpec
    price_usd: float
    watts: float
    resale_percent: float
    years: float
    source: str = ""

    @property
    def owning_words(self) -> str:
        """``owning an RTX 4090``; ``training on this computer (…)`` for one already owned (no price)."""
        return (
            f"training on {self.name[:1].lower()}{self.name[1:]}" if self.price_usd == 0 else f"owning an {self.name}"
        )

    @property
    def subject(self) -> str:
        """The card as a sentence's subject: ``the RTX 4090``, ``this computer (…)``."""
        return f"{self.name[:1].lower()}{self.name[1:]}" if self.price_usd == 0 else f"the {self.name}"

    @property
    def doing(self) -> str:
        """What the owned side is, in two words: ``owning`` a card, ``training here`` on this computer."""
        return "training here" if self.price_usd == 0 else "owning"

    @property
    def loss_per_year_usd(self) -> float:
        """The card's loss of value per year kept."""
        return self.price_usd * (1 - self.resale_percent / 100) / self.years


@dataclass(frozen=True)
class RentedSample:
    """One run's rented training in the history: its hours of training, all its dollars, and its machines' speed.

    Attributes:
        training_hours: Hours it trained while a machine billed.
        usd: Everything its machines billed in the window (paid idle included).
        speed: Its machines' training throughput (:func:`training_speed`).
        gpu_name: The rented GPU type's name.
        vram_gib: Memory per rented GPU.
    """

    training_hours: float
    usd: float
    speed: float
    gpu_name: str
    vram_gib: float


@dataclass(frozen=True)
class RentedTraining:
    """Rented training a year to compare owning against.

    Attributes:
        hours_per_year: Hours of training a year on rented machines.
        usd_per_training_hour: What an hour of that training costs (the effective training hour).
        speed: The rented machines' throughput, averaged over hours of training.
        gpu_names: The GPU types rented, most hours first.
        vram_gib: The most memory per GPU among them.
        history_hours: Hours of training in the history (None: not from history, from a list price).
    """

    hours_per_year: float
    usd_per_training_hour: float
    speed: float
    gpu_names: tuple[str, ...]
    vram_gib: float
    history_hours: float | None = None

    def with_hours(self, hours_per_year: float) -> RentedTraining:
        """The same training at other yearly hours (the user's own figure)."""
        return replace(self, hours_per_year=hours_per_year)


def rented_from_history(samples: Iterable[RentedSample], days: float = HISTORY_DAYS) -> RentedTraining | None:
    """The user's rented training of the last ``days`` days as a year: None when none of it trained.

    Dollars of runs that never trained count too (they were paid for training that did not happen), so the rate is
    all the dollars over all the hours of training.
    """
    samples = list(samples)
    hours = sum(s.training_hours for s in samples)
    if hours <= 0:
        return None
    by_gpu: dict[str, float] = {}
    for sample in samples:
        by_gpu[sample.gpu_name] = by_gpu.get(sample.gpu_name, 0.0) + sample.training_hours
    return RentedTraining(
        hours_per_year=hours * 365 / days,
        usd_per_training_hour=sum(s.usd for s in samples) / hours,
        speed=sum(s.training_hours * s.speed for s in samples) / hours,
        gpu_names=tuple(sorted((n for n in by_gpu if by_gpu[n] > 0), key=lambda n: -by_gpu[n])),
        vram_gib=max(s.vram_gib for s in samples if s.training_hours > 0),
        history_hours=hours,
    )


def rented_at_list_price(gpu: GpuSpec, hours_per_year: float) -> RentedTraining:
    """Renting one GPU of type ``gpu`` at its catalog price (no history: no idle counted)."""
    return RentedTraining(hours_per_year, gpu.list_price_usd_per_h, training_speed(gpu), (gpu.name,), gpu.vram_gib)


@dataclass(frozen=True)
class RentOrBuy:
    """A year of the rented training against doing it on an owned card.

    Attributes:
        rented: The rented training.
        card: The card considered.
        kwh_usd: The electricity price per kilowatt-hour.
    """

    rented: RentedTraining
    card: OwnedCard
    kwh_usd: float

    @property
    def hours_factor(self) -> float:
        """Hours the card needs per hour of rented training (its speed against the rented machines')."""
        return self.rented.speed / training_speed(self.card.gpu)

    @property
    def owned_usd_per_rented_hour(self) -> float:
        """The electricity of doing one rented hour's training on the card."""
        return self.hours_factor * self.card.watts / 1000 * self.kwh_usd

    def rent_usd(self, hours_per_year: float) -> float:
        """A year of renting ``hours_per_year`` hours of training."""
        return hours_per_year * self.rented.usd_per_training_hour

    def own_usd(self, hours_per_year: float) -> float:
        """A year of owning the card and doing that training on it."""
        return self.card.loss_per_year_usd + hours_per_year * self.owned_usd_per_rented_hour

    @property
    def owned_hours_per_year(self) -> float:
        """Hours the card trains a year for the rented training's work."""
        return self.rented.hours_per_year * self.hours_factor

    @property
    def fits_in_a_year(self) -> bool:
        """Whether one card can do the year's training in a year."""
        return self.owned_hours_per_year <= HOURS_PER_YEAR

    @property
    def break_even_hours(self) -> float | None:
        """The yearly hours of rented training above which owning is cheaper (None: owning never is)."""
        saved_per_hour = self.rented.usd_per_training_hour - self.owned_usd_per_rented_hour
        return self.card.loss_per_year_usd / saved_per_hour if saved_per_hour > 0 else None

    @property
    def owning_is_cheaper(self) -> bool:
        """Whether owning costs less at the rented training's hours."""
        return self.own_usd(self.rented.hours_per_year) < self.rent_usd(self.rented.hours_per_year)

    def as_dict(self) -> dict[str, Any]:
        """The comparison as the CLI's JSON gives it (dollars unrounded)."""
        hours = self.rented.hours_per_year
        return {
            "hours_per_year": hours,
            "rented": {
                "usd_per_training_hour": self.rented.usd_per_training_hour,
                "gpus": list(self.rented.gpu_names),
                "history_hours": self.rented.history_hours,
                "usd_per_year": self.rent_usd(hours),
            },
            "owned": {
                "card": self.card.id,
                "price_usd": self.card.price_usd,
                "watts": self.card.watts,
                "kwh_usd": self.kwh_usd,
                "resale_percent": self.card.resale_percent,
                "years": self.card.years,
                "hours_factor": self.hours_factor,
                "hours_per_year": self.owned_hours_per_year,
                "fits_in_a_year": self.fits_in_a_year,
                "loss_of_value_per_year_usd": self.card.loss_per_year_usd,
                "electricity_per_year_usd": hours * self.owned_usd_per_rented_hour,
                "usd_per_year": self.own_usd(hours),
            },
            "break_even_hours_per_year": self.break_even_hours,
            "cheaper": "own" if self.owning_is_cheaper else "rent",
        }


@dataclass(frozen=True)
class CardsTable:
    """The cards in ``resources/owned_cards.json``, with the electricity price and the computer's own draw.

    Attributes:
        cards: The cards (whole-computer watts: the card's and the rest's).
        kwh_usd: The default electricity price per kilowatt-hour.
        sources: Where the table's shared figures come from.
    """

    cards: tuple[OwnedCard, ...]
    kwh_usd: float
    sources: tuple[str, ...] = ()

    def card(self, card_id: str) -> OwnedCard | None:
        """The card with id ``card_id``, or None."""
        return next((card for card in self.cards if card.id == card_id), None)


def cards_from_json(data: dict[str, Any], gpus: Iterable[GpuSpec]) -> CardsTable:
    """The decoded cards table; a card whose GPU type the catalog lacks is left out (its speed is unknown).

    Raises:
        ValueError: The table lacks a field or holds a value of the wrong type.
    """
    catalog = {gpu.id: gpu for gpu in gpus}
    rest = float(data["rest_of_computer_watts"])
    try:
        cards = tuple(
            OwnedCard(
                id=str(raw["id"]),
                name=str(raw["name"]),
                gpu=catalog[str(raw["gpu_id"])],
                price_usd=float(raw["price_usd"]),
                watts=float(raw["card_watts"]) + rest,
                resale_percent=float(raw["resale_percent"]),
                years=float(raw["years"]),
                source=str(raw.get("source", "")),
            )
            for raw in data["cards"]
            if str(raw["gpu_id"]) in catalog
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a card lacks {exc} or has a value of the wrong type") from exc
    sources = tuple(str(data[key]) for key in ("electricity_source", "rest_of_computer_source") if key in data)
    return CardsTable(cards, float(data["electricity_usd_per_kwh"]), sources)
