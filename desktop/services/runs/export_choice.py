"""Where the fine-tuned model is made after training: at home (the default), or on the machine when it must be.

The review proposes the export on the machine when merging would not fit this computer's memory or disk, with the
machine's paid minutes and dollars; the user's own choice (the draft's ``export_on_machine``) always wins. Judging
base against tuned on the machine (:func:`judge_estimate`) is the user's choice alone, with its price beside it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from desktop.core.export.on_machine import (
    ON_MACHINE_OUTPUTS,
    HomeRoom,
    OnMachineCost,
    on_machine_cost,
    why_on_machine,
)
from desktop.core.judging.on_machine import judge_cost
from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import JudgeSpec
from desktop.services.local.inventory import exports_root
from desktop.services.models.sizing import Sizing


@dataclass(frozen=True)
class ExportChoice:
    """What the review shows about the export after training.

    Attributes:
        outputs: What the machine will make (empty: everything is made at home, on the Models page).
        proposed: The review proposes the machine (the user has not chosen, and the merge does not fit here).
        reason: Why the merge does not fit this computer (None: it fits, or this computer's room is unknown).
        cost: The machine's paid minutes and dollars for :data:`ON_MACHINE_OUTPUTS`.
    """

    outputs: tuple[str, ...]
    proposed: bool
    reason: str | None
    cost: OnMachineCost


def home_room() -> HomeRoom:
    """This computer's memory and the free disk where exports are written (None where it cannot be read)."""
    try:
        memory: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        memory = None
    folder: Path = exports_root()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free: int | None = shutil.disk_usage(folder).free
    except OSError:
        free = None
    return HomeRoom(memory, free)


def export_choice(draft: RunDraft, sizing: Sizing | None, room: HomeRoom | None) -> ExportChoice | None:
    """Where the draft's model will be made, and why; None for a full fine-tune (no adapter to merge) or unsized."""
    if sizing is None or draft.method not in ("qlora", "lora"):
        return None
    params = sizing.plan.arch.total_params
    reason = why_on_machine(params, room, not Path(draft.base_model).is_dir()) if room else None
    chosen = draft.export_on_machine
    outputs = tuple(chosen) if chosen is not None else (ON_MACHINE_OUTPUTS if reason else ())
    price = draft.compute.price_per_hour if draft.renting else draft.hourly_rate_usd
    return ExportChoice(
        outputs, chosen is None and bool(reason), reason, on_machine_cost(params, ON_MACHINE_OUTPUTS, price)
    )


def judge_estimate(draft: RunDraft, sizing: Sizing | None) -> OnMachineCost | None:
    """The machine's paid minutes (at most) and dollars for judging the draft's held-out rows there.

    None for a full fine-tune (no adapter to switch off for the base's answers) or an unsized draft.
    """
    if sizing is None or draft.method not in ("qlora", "lora"):
        return None
    price = draft.compute.price_per_hour if draft.renting else draft.hourly_rate_usd
    judge = JudgeSpec()
    return judge_cost(sizing.plan.arch.total_params, judge.max_examples, judge.max_new_tokens, price)
