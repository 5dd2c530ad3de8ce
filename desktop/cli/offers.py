"""``rentune offers``: live offers of every provider in one table; with ``--model``, what fits and what it costs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from desktop.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from desktop.cli.sizing_flags import training_setup
from desktop.cli.sizing_flags import workload as sizing_workload
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.offers import SizingJob
from desktop.core.sizing.plan import Fit
from desktop.core.units import card_text
from desktop.services.models.configs import ModelResolutionError, resolve_model
from desktop.services.platform.secrets import SecretStore
from desktop.services.providers.base import OfferQuery, ProviderName
from desktop.services.providers.market import SizedOffer, gather_offers, size_offers

# The flag of each training setting (an error names the flag the user typed).
_FIT_WORDS = {Fit.FITS: "fits", Fit.TIGHT: "tight", Fit.NO: "no"}


def provider_names(choice: str) -> list[ProviderName]:
    """The providers ``--provider`` asks for ("all": every one)."""
    return list(ProviderName) if choice == "all" else [ProviderName(choice)]


def sizing_job(args: argparse.Namespace) -> SizingJob | None:
    """The plan the offers are judged against (None without ``--model``)."""
    if not args.model:
        if args.dataset is not None:
            raise CliError("--dataset needs --model (the model whose tokenizer counts the tokens)")
        return None
    setup = training_setup(args)
    workload, _ = sizing_workload(args, setup.seq_len)
    try:
        arch = resolve_model(args.model)
    except (ModelResolutionError, ArchitectureError) as exc:
        raise CliError(str(exc)) from exc
    return SizingJob(arch, setup, workload)


def offer_query(args: argparse.Namespace) -> OfferQuery:
    """The filters as a query, each checked."""
    if args.gpus is not None and not 1 <= args.gpus <= 16:
        raise CliError(f"--gpus {args.gpus} is out of range: use a whole number from 1 to 16")
    for flag, value in (("--min-vram", args.min_vram), ("--max-price", args.max_price)):
        if value is not None and value <= 0:
            raise CliError(f"{flag} {value:g} must be above 0")
    if not 1 <= args.nodes <= 250:
        raise CliError(f"--nodes {args.nodes} is out of range: a cluster has 2 to 250 machines (1: one machine)")
    if args.nodes > 1 and args.spot:
        raise CliError("--nodes: clusters are not sold as spot machines; drop --spot")
    return OfferQuery(
        count=args.gpus,
        min_vram_gb=args.min_vram,
        max_price_per_hour=args.max_price,
        spot=args.spot,
        nodes=args.nodes,
    )


def offer_dict(sized: SizedOffer) -> dict[str, Any]:
    """One offer as ``--json`` prints it."""
    offer, sizing = sized.offer, sized.sizing
    return {
        "provider": offer.provider.value,
        "offer_id": offer.offer_id,
        "gpu": offer.gpu,
        "count": offer.count,
        "nodes": offer.nodes,
        "vram_gb": offer.vram_gb,
        "price_per_hour": offer.price_per_hour,
        "spot": offer.spot,
        "reliability": offer.reliability,
        "location": offer.location,
        "fits": _FIT_WORDS[sizing.fit] if sizing else None,
        "hours": sizing.hours if sizing else None,
        "total_usd": sizing.total_usd if sizing else None,
    }


def _cell(value: object, form: str) -> str:
    return "-" if value is None else format(value, form)


def _row(sized: SizedOffer) -> list[str]:
    item = offer_dict(sized)
    return [
        sized.offer.provider.label,
        f"{item['nodes']} machines x {item['gpu']} x{item['count']}"
        if item["nodes"] > 1
        else f"{item['gpu']} x{item['count']}",
        card_text(item["vram_gb"]),
        f"${item['price_per_hour']:.2f}",
        "spot" if item["spot"] else "",
        _cell(item["reliability"], ".2f"),
        item["location"],
        item["fits"] or "-",
        _cell(item["hours"], ".1f"),
        "-" if item["total_usd"] is None else f"${item['total_usd']:.2f}",
    ]


_HEADER = ["PROVIDER", "GPU", "VRAM", "$/H", "SPOT", "RELIABILITY", "LOCATION", "FIT", "HOURS", "TOTAL"]
_RIGHT = {2, 3, 5, 8, 9}  # numbers line up on the right


def offers_table(offers: list[SizedOffer]) -> str:
    """The offers as an aligned table, a header first."""
    rows = [_HEADER, *(_row(sized) for sized in offers)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = [
        "  ".join(
            cell.rjust(w) if i in _RIGHT else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def _relax_hint(args: argparse.Namespace) -> str:
    given = [
        f"{flag} {value:g}" if not isinstance(value, bool) else flag
        for flag, value in (
            ("--min-vram", args.min_vram),
            ("--gpus", args.gpus),
            ("--max-price", args.max_price),
            ("--spot", args.spot),
        )
        if value not in (None, False)
    ]
    if args.provider != "all":
        given.append(f"--provider {args.provider}")
    if not given:
        return "no offers in stock right now; try again in a few minutes"
    return f"no offers match {' '.join(given)}; relax {' or '.join(given)}"


def _no_keys(names: list[ProviderName]) -> CliError:
    first = names[0].value
    which = "any provider" if len(names) > 1 else names[0].label
    return CliError(f"no API key for {which}; add one with rentune keys set {first}", EXIT_FAILED)


def run_offers(args: argparse.Namespace) -> int:
    """Prints the offers of the providers asked (a table, or ``--json``), notes on stderr."""
    query, job, names = offer_query(args), sizing_job(args), provider_names(args.provider)
    market = asyncio.run(gather_offers(query, names, SecretStore()))
    if len(market.unkeyed) == len(names):
        raise _no_keys(names)
    for note in market.notes:
        print(note, file=sys.stderr)
    if not market.answered:
        raise CliError("no provider answered (see above); check the network and the keys, then try again", EXIT_FAILED)
    from desktop.services.runs.estimates import calibrated_gpus

    gpus, _ = calibrated_gpus()  # speeds measured on the user's finished runs replace the estimates
    ranked = size_offers(market.offers, job, gpus)
    if args.json:
        print(json.dumps([offer_dict(sized) for sized in ranked], indent=2))
    elif ranked:
        print(offers_table(ranked))
    if not ranked:
        print(_relax_hint(args), file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
