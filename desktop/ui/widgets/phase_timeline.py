"""A run's history as chips that wrap: its phases, the machines it ran on, and the phases still to come.

Each past phase shows how long it really took (from the recorded transitions); the phases to come are greyed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from desktop.core.runs.progress import ENDED, PhaseSpan, format_duration
from desktop.core.runs.timeline import MachineMark, TimelineItem
from desktop.ui.cost_words import rate
from desktop.ui.design.palette import Palette
from desktop.ui.run_words import phase_word, provider_word
from desktop.ui.theme import current_palette, theme_events
from desktop.ui.widgets.flow_layout import FlowLayout

#: Chips of the run's past shown at most; earlier ones are summed up in a first chip.
MAX_PAST = 14


class PhaseTimeline(QWidget):
    """Shows a run's :data:`~desktop.core.runs.timeline.TimelineItem` list: ``Uploading · 12 s``, ``Machine 2``.

    Attributes:
        chips: The labels shown, in reading order (reused from one update to the next).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Run phases")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self._flow = FlowLayout(self)
        self.chips: list[QLabel] = []
        self._shown: list[tuple[str, str, str, str]] = []
        theme_events().sig_changed.connect(self._restyle)

    def show_items(self, items: Sequence[TimelineItem], rented: bool = False) -> None:
        """Shows these items (the newest :data:`MAX_PAST` of the past, and every phase to come)."""
        past = [item for item in items if not (isinstance(item, PhaseSpan) and item.upcoming)]
        ahead = [item for item in items if isinstance(item, PhaseSpan) and item.upcoming]
        folded = _fold_earlier_machines(past, rented)
        hidden = max(0, len(folded) - MAX_PAST)
        chips: list[tuple[str, str, str, str]] = []  # (text, accessible name, tooltip, kind)
        if hidden:
            chips.append((f"+{hidden}\nearlier", f"{hidden} earlier phases", "", "summary"))
        chips += folded[hidden:]
        chips += [_chip(item, rented) for item in ahead]
        if chips == self._shown:
            return  # nothing changed (most polls): no text, style or layout work
        self._shown = chips
        self._ensure_chips(len(chips))
        for label, (text, name, tip, kind) in zip(self.chips, chips, strict=True):
            if label.text() != text:
                label.setText(text)
            label.setAccessibleName(name)
            label.setToolTip(tip)
            _style(label, kind)
        self.setAccessibleDescription(", ".join(name for _text, name, _tip, _kind in chips))
        self.updateGeometry()

    def _ensure_chips(self, count: int) -> None:
        while len(self.chips) < count:
            chip = QLabel()
            chip.setAlignment(Qt.AlignmentFlag.AlignCenter)
            chip.setProperty("kind", None)
            self._flow.insert_widget(len(self.chips), chip)
            self.chips.append(chip)
        while len(self.chips) > count:
            chip = self.chips.pop()
            self._flow.removeWidget(chip)
            chip.deleteLater()

    def hasHeightForWidth(self) -> bool:
        """The chips wrap: the height follows the width."""
        return True

    def heightForWidth(self, width: int) -> int:
        """The height the chips need at ``width``."""
        return self._flow.heightForWidth(width)

    def _restyle(self, _palette: object = None) -> None:
        for chip in self.chips:
            kind = chip.property("kind")
            chip.setProperty("kind", None)
            _style(chip, str(kind))


def _fold_earlier_machines(past: Sequence[TimelineItem], rented: bool) -> list[tuple[str, str, str, str]]:
    """The past as chips, each machine let go folded into one chip with its time (its phases in the tooltip).

    Only the newest machine's phases get a chip each: a run moved to a second machine kept three rows of chips at
    1024 pixels, pushing the loss chart out of view.
    """
    machines = [index for index, item in enumerate(past) if isinstance(item, MachineMark)]
    if len(machines) < 2:
        return [_chip(item, rented) for item in past]
    chips = [_chip(item, rented) for item in past[: machines[0]]]
    for start, end in itertools.pairwise(machines):
        mark = past[start]
        assert isinstance(mark, MachineMark)
        phases = [item for item in past[start + 1 : end] if isinstance(item, PhaseSpan)]
        chips.append(_folded_machine_chip(mark, phases, rented))
    return chips + [_chip(item, rented) for item in past[machines[-1] :]]


def _folded_machine_chip(mark: MachineMark, phases: Sequence[PhaseSpan], rented: bool) -> tuple[str, str, str, str]:
    text, name, tip, kind = _machine_chip(mark)
    total = format_duration(sum(phase.seconds for phase in phases))
    steps = ", ".join(f"{phase_word(phase.state, rented)} {format_duration(phase.seconds)}" for phase in phases)
    return f"{text} · {total}", f"{name}, {total}: {steps}", f"{tip}\n{steps}", kind


def _chip(item: TimelineItem, rented: bool) -> tuple[str, str, str, str]:
    if isinstance(item, MachineMark):
        return _machine_chip(item)
    name = phase_word(item.state, rented)
    if item.upcoming:
        return f"{name}\nto come", f"{name}, to come", "", "upcoming"
    clock = time.strftime("%H:%M:%S", time.localtime(item.started))
    if item.current and item.state in ENDED:
        at = time.strftime("%H:%M", time.localtime(item.started))
        return f"{name}\nat {at}", f"{name} at {at}", f"Since {clock}", "current"
    duration = format_duration(item.seconds)
    tip = f"From {clock}, for {duration}" + (" so far" if item.current else "")
    if item.current:
        return f"{name}\n{duration}", f"{name}, {duration}, now", tip, "current"
    return f"{name}\n{duration}", f"{name}, {duration}", tip, "past"


def _machine_chip(mark: MachineMark) -> tuple[str, str, str, str]:
    where = f"{mark.gpu} · {provider_word(mark.provider)}"
    started = time.strftime("%H:%M", time.localtime(mark.started))
    tip = f"Rented at {started} for {rate(mark.price_per_hour)}"
    if mark.stopped is not None:
        tip += f"; let go at {time.strftime('%H:%M', time.localtime(mark.stopped))}"
        tip += f" ({mark.why_stopped})" if mark.why_stopped else ""
    return f"Machine {mark.number}\n{where}", f"Machine {mark.number}: {where}", tip, "machine"


def _style(chip: QLabel, kind: str) -> None:
    if chip.property("kind") == kind:
        return
    chip.setProperty("kind", kind)
    font = chip.font()
    font.setBold(kind == "current")
    chip.setFont(font)
    chip.setStyleSheet(chip_style(current_palette(), kind))


def chip_style(palette: Palette, kind: str) -> str:
    """The stylesheet of a chip of ``kind`` (past, current, upcoming, machine, summary) in ``palette``."""
    border, background, colour = f"1px solid {palette.border}", palette.surface, palette.text
    if kind == "current":
        border, background = f"2px solid {palette.accent}", palette.info_bg
    elif kind == "upcoming":
        border, background, colour = f"1px dashed {palette.border}", "transparent", palette.text_muted
    elif kind == "machine":
        border, background = f"1px solid {palette.accent}", palette.surface_alt
    elif kind == "summary":
        colour = palette.text_muted
    return (
        f"QLabel {{ border: {border}; background: {background}; color: {colour}; border-radius: 6px;"
        " padding: 3px 8px; }"
    )
