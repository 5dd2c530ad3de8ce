"""``rentune costs --rent-or-buy``: a year of renting as the user rents against owning a card, and the break-even.

The figures default to what the Costs page last used (the settings); each flag replaces one for this call. ``--json``
prints ``hours_per_year``, ``rented`` (``usd_per_training_hour``, ``gpus``, ``history_hours``, ``usd_per_year``),
``owned`` (the card's figures, ``hours_factor``: its hours per rented hour, ``hours_per_year``, ``fits_in_a_year``,
``loss_of_value_per_year_usd``, ``electricity_per_year_usd``, ``usd_per_year``), ``break_even_hours_per_year`` (null:
owning never pays) and ``cheaper`` (``rent`` or ``own``), dollars unrounded.
"""

from __future__ import annotations

import argparse
import json

from pydantic import ValidationError

from desktop.cli.errors import EXIT_OK, EXIT_USAGE, CliError
from desktop.core.costs.rent_or_buy import HISTORY_DAYS, HOURS_PER_YEAR, RentOrBuy
from desktop.core.settings import RentOrBuyChoice, SettingsError
from desktop.core.sizing.gpus import find_gpu
from desktop.services.models.configs import load_gpus
from desktop.services.platform.settings import load_settings
from desktop.services.runs.rent_or_buy import RentOrBuyError, RentOrBuyReport, rent_or_buy
from desktop.services.runs.store import RunStore

_FLAGS = {
    "card": "card",
    "hours": "hours_per_year",
    "price": "price_usd",
    "watts": "watts",
    "kwh": "kwh_usd",
    "resale": "resale_percent",
    "years": "years",
    "rent": "rent_gpu",
}


def choice_from_args(args: argparse.Namespace) -> RentOrBuyChoice:
    """The saved choice with the flags given in place of its figures.

    Raises:
        CliError: A flag's value is out of range, or the settings cannot be read.
    """
    try:
        saved = load_settings().rent_or_buy
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    given = {field: getattr(args, flag) for flag, field in _FLAGS.items() if getattr(args, flag, None) is not None}
    if "rent_gpu" in given:
        gpu = find_gpu(list(load_gpus()), given["rent_gpu"])
        given["rent_gpu"] = gpu.id if gpu is not None else str(given["rent_gpu"]).lower()
    try:
        return RentOrBuyChoice.model_validate(saved.model_dump() | given)
    except ValidationError as exc:
        problems = "; ".join(f"--{_flag(e['loc'])} {e['msg'].lower()}" for e in exc.errors())
        raise CliError(f"{problems}; see rentune costs --help", EXIT_USAGE) from exc


def _flag(loc: tuple[int | str, ...]) -> str:
    field = str(loc[0]) if loc else ""
    return next((flag for flag, name in _FLAGS.items() if name == field), field)


def print_rent_or_buy(args: argparse.Namespace) -> int:
    """Prints the comparison (``--json``: one object)."""
    choice = choice_from_args(args)
    try:
        report = rent_or_buy(choice, RunStore())
    except RentOrBuyError as exc:
        raise CliError(f"{exc} (--card, --rent)", EXIT_USAGE) from exc
    if report.comparison is None:
        raise CliError(f"{report.missing} (--hours H)", EXIT_USAGE)
    if args.json:
        print(json.dumps(report.comparison.as_dict(), indent=2))
    else:
        print("\n".join(rent_or_buy_text(report, report.comparison)))
    return EXIT_OK


def _usd(value: float) -> str:
    return f"${value:,.0f}" if abs(value) >= 100 else f"${value:,.2f}"


def rent_or_buy_text(report: RentOrBuyReport, comparison: RentOrBuy) -> list[str]:
    """The comparison in lines: renting, owning, which is cheaper, the break-even, and what the figures rest on."""
    rented, card, hours = comparison.rented, comparison.card, comparison.rented.hours_per_year
    gpus = ", ".join(rented.gpu_names)
    paid = " (paid idle included)" if rented.history_hours is not None else " (list price, no idle counted)"
    lines = [
        f"Rent or buy: {card.owning_words} against renting {gpus}",
        "",
        f"Renting  {hours:,.0f} h of training a year at {_usd(rented.usd_per_training_hour)} per training hour"
        f"{paid}: {_usd(comparison.rent_usd(hours))} a year",
    ]
    if rented.history_hours is not None:
        lines.append(f"         your runs trained {rented.history_hours:,.1f} h in the last {HISTORY_DAYS} days")
    electricity = hours * comparison.owned_usd_per_rented_hour
    bought = (
        f"{_usd(card.price_usd)}, {card.resale_percent:g} % back after {card.years:g} years: "
        f"{_usd(card.loss_per_year_usd)} a year of lost value"
    )
    lines += [
        f"Owning   {bought if card.price_usd else 'already yours: no price, no lost value'}",
        f"         {comparison.hours_factor:.2f}x the rented hours (its speed against theirs): "
        f"{comparison.owned_hours_per_year:,.0f} h a year at {card.watts:,.0f} W and ${comparison.kwh_usd:.2f}/kWh: "
        f"{_usd(electricity)} of electricity",
        f"         {_usd(comparison.own_usd(hours))} a year",
        "",
        _verdict(comparison),
        *_caveats(report, comparison),
    ]
    return lines


def _verdict(comparison: RentOrBuy) -> str:
    hours = comparison.rented.hours_per_year
    gap = abs(comparison.rent_usd(hours) - comparison.own_usd(hours))
    doing = comparison.card.doing
    cheaper = f"{doing if comparison.owning_is_cheaper else 'renting'} is cheaper by {_usd(gap)} a year"
    even = comparison.break_even_hours
    if even is None:
        return f"{cheaper}; {doing} never pays back: an hour of its electricity costs more than a rented hour"
    return f"{cheaper}; break-even at {even:,.0f} h of rented training a year (above it {doing} costs less)"


def _caveats(report: RentOrBuyReport, comparison: RentOrBuy) -> list[str]:
    card = comparison.card
    lines = []
    if not comparison.fits_in_a_year:
        lines.append(
            f"{card.subject} alone cannot do this: it needs {comparison.owned_hours_per_year:,.0f} h, "
            f"more than the {HOURS_PER_YEAR:,} hours of a year"
        )
    if comparison.rented.vram_gib > card.gpu.vram_gib:
        lines.append(
            f"{card.subject} has {card.gpu.vram_gib:g} GB; the GPUs rented had {comparison.rented.vram_gib:g} GB: "
            "jobs that need more do not fit on it"
        )
    if report.left_out:
        runs = "1 run on a GPU type" if report.left_out == 1 else f"{report.left_out} runs on GPU types"
        lines.append(f"{runs} Rentune does not know {'was' if report.left_out == 1 else 'were'} left out")
    measured = f"; measured on your runs: {', '.join(report.measured)}" if report.measured else ""
    lines.append(f"speeds: the GPU catalog's planning figures{measured}")
    lines.append("figures: resources/owned_cards.json (sources there); --price, --watts, --kwh, --resale, --years")
    return lines
