"""How the Compute and Review steps word a machine: the pick, its estimate, the budget (shared words, no widgets)."""

from __future__ import annotations

from desktop.core.runs.draft import ComputeDraft
from desktop.core.sizing.report import format_hours
from desktop.core.units import card_text, memory_text
from desktop.services.providers.base import ProviderName
from desktop.services.runs.offers_for_draft import DraftOffer


def machine_words(count: int, gpu: str, vram_gb: float, nodes: int = 1) -> str:
    """``1 x RTX 4090 (24 GB)``, ``2 x A100 PCIe (80 GB each)``, or a cluster's machines.

    A cluster: ``a cluster of 2 machines with 8 x H100 SXM (80 GB each) each``.
    """
    memory = card_text(vram_gb) + (" each" if count > 1 else "")
    if nodes > 1:
        return f"a cluster of {nodes} machines with {count} x {gpu} ({memory}) each"
    return f"{count} x {gpu} ({memory})"


def kind_words(spot: bool) -> str:
    """``spot`` or ``on-demand``."""
    return "spot" if spot else "on-demand"


def estimate_words(item: DraftOffer | None) -> str:
    """``about 2 h 05 min, $1.38 in all`` (or why there is no estimate)."""
    if item is None or item.fit is None:
        return "no estimate (the run could not be sized)"
    if item.hours is None or item.total_usd is None:
        return "time and total unknown (no speed figures for this GPU)"
    return f"about {format_hours(item.hours)}, ${item.total_usd:,.2f} in all"


def pick_words(item: DraftOffer) -> str:
    """The pick in one line: provider, machine, kind, price, estimate."""
    offer = item.offer
    where = f" in {offer.location}" if offer.location else ""
    machine = machine_words(offer.count, offer.gpu, offer.vram_gb, offer.nodes)
    return (
        f"{offer.provider.label}: {machine}, {kind_words(offer.spot)}"
        f"{where}, ${offer.price_per_hour:,.2f} per hour; {estimate_words(item)}."
    )


def compute_pick_words(compute: ComputeDraft) -> str:
    """The draft's pick when its offer is not judged (the market not asked yet)."""
    machine = machine_words(compute.count, compute.gpu, compute.vram_gb, compute.nodes)
    provider = ProviderName(compute.provider).label
    return f"{provider}: {machine}, {kind_words(compute.spot)}, ${compute.price_per_hour:,.2f} per hour"


def budget_words(budget_usd: float, total_usd: float | None) -> tuple[str, str]:
    """What the budget means for the estimate: (words, severity)."""
    if budget_usd <= 0:
        return (
            "No budget: the run is not stopped for its cost. Set one to cap what it can spend.",
            "info",
        )
    stop = (
        f"The run is stopped (its newest checkpoint kept, the machine terminated) before it costs ${budget_usd:,.2f}."
    )
    if total_usd is None:
        return stop, "info"
    if total_usd > budget_usd:
        return f"The estimate (${total_usd:,.2f}) is above the budget: {stop[0].lower()}{stop[1:]}", "warning"
    return f"{stop} The estimate (${total_usd:,.2f}) is within it.", "success"


#: What to change when no offer fits: nothing on the Compute step can make one fit.
NONE_FITS_ADVICE = (
    "Make the run smaller on the Model step (QLoRA, a smaller model or a shorter sequence length), or choose "
    "several GPUs on the Sizing step."
)
#: What Next says then (the offers' own banner, scrolled into view under it, says how close the nearest comes).
NONE_FITS_NEXT = f"None of the offers can be picked. {NONE_FITS_ADVICE} The offers below say how close they come."


def none_fits_words(offers: list[DraftOffer]) -> str:
    """Why no offer fits, with the closest one's numbers, and what to change (when every offer is too small)."""
    sized = [item for item in offers if item.need_gb is not None]
    advice = f"{NONE_FITS_ADVICE} Nothing is rented until you launch."
    if not sized:
        return advice
    closest = min(sized, key=lambda item: (item.need_gb or 0.0) / max(item.offer.vram_gb, 1.0))
    offer, need_gb = closest.offer, closest.need_gb or 0.0
    machine = machine_words(offer.count, offer.gpu, offer.vram_gb, offer.nodes)
    return f"The run needs {memory_text(need_gb)} per GPU even on the closest, {machine}. {advice}"


def remembered_pick_note(remembered: ComputeDraft, found: DraftOffer | None) -> str:
    """What became of the machine picked before the app was closed: gone, repriced, or too small now ("" if same)."""
    machine = machine_words(remembered.count, remembered.gpu, remembered.vram_gb, remembered.nodes)
    earlier = f"{machine} at ${remembered.price_per_hour:,.2f}/h"
    if found is None:
        return f"Your earlier pick, {earlier}, is no longer offered."
    if found.fit is not None and not found.fits:
        return f"Your earlier pick, {earlier}, does not fit this run any more."
    if abs(found.offer.price_per_hour - remembered.price_per_hour) >= 0.005:
        return (
            f"Your earlier pick now costs ${found.offer.price_per_hour:,.2f}/h (it was "
            f"${remembered.price_per_hour:,.2f}/h)."
        )
    return ""
