"""A run's history as a row of phases, each with how long it took; the current one is highlighted."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from desktop.core.runs.progress import ENDED, PhaseSpan, format_duration

#: Phases shown at most; earlier ones are summarised in the first chip.
MAX_CHIPS = 9
_CHIP_STYLE = "QLabel {{ border: {width}px solid palette({role}); border-radius: 6px; padding: 4px 8px; }}"


class PhaseTimeline(QWidget):
    """Shows :class:`PhaseSpan` items left to right: ``Uploading · 12 s``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Run phases")
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(6)
        self._layout.addStretch(1)
        self.chips: list[QLabel] = []

    def show_spans(self, spans: Sequence[PhaseSpan]) -> None:
        """Shows these phases (the newest :data:`MAX_CHIPS`), reusing the labels already there."""
        hidden = max(0, len(spans) - MAX_CHIPS)
        shown = list(spans[hidden:])
        self._ensure_chips(len(shown))
        for chip, span in zip(self.chips, shown, strict=True):
            name = span.state.value.capitalize()
            ended = span.current and span.state in ENDED
            duration = "—" if ended else format_duration(span.seconds)
            chip.setText(f"{name}\n{duration}")
            chip.setAccessibleName(f"{name}, {duration}" + (", now" if span.current else ""))
            _style(chip, span.current)
        if hidden and self.chips:
            self.chips[0].setToolTip(f"{hidden} earlier phases are not shown")
        summary = ", ".join(chip.accessibleName() for chip in self.chips)
        self.setAccessibleDescription(summary)

    def _ensure_chips(self, count: int) -> None:
        while len(self.chips) < count:
            chip = QLabel()
            chip.setAlignment(Qt.AlignmentFlag.AlignCenter)
            chip.setProperty("current", None)
            self._layout.insertWidget(len(self.chips), chip)
            self.chips.append(chip)
        while len(self.chips) > count:
            chip = self.chips.pop()
            self._layout.removeWidget(chip)
            chip.deleteLater()


def _style(chip: QLabel, current: bool) -> None:
    if chip.property("current") == current:
        return
    chip.setProperty("current", current)
    font = chip.font()
    font.setBold(current)
    chip.setFont(font)
    chip.setStyleSheet(_CHIP_STYLE.format(width=2 if current else 1, role="highlight" if current else "mid"))
