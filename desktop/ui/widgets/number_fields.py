"""Number fields that say why they changed what was typed, instead of silently putting another number there.

Qt's own spin boxes refuse a keystroke that passes the highest number (epochs typed as 2000 stayed 200, a price typed
as -5 stayed "-") and put a number out of range back without a word. A watched field takes every keystroke that
still reads as a number, and when the number is taken (Enter, or leaving the field) it becomes the nearest one the
field allows, with a sentence quoting exactly what was typed, what the field holds now and what it takes.

Use :class:`CorrectionNote` beside each field (``note.watch(box, "Name")``), so each correction is said by its own
field; :func:`explain_corrections` is the same for a caller that shows the sentence itself.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QKeyEvent, QValidator
from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QLabel, QScrollArea, QSpinBox, QWidget

NumberBox = QSpinBox | QDoubleSpinBox
_TAKE_KEYS = {Qt.Key.Key_Return, Qt.Key.Key_Enter}


def explain_corrections(box: NumberBox, name: str, note: Callable[[str], None]) -> None:
    """Makes ``box`` take the nearest number it allows for one out of its range, and tell ``note`` why.

    ``note`` gets a sentence naming the field, quoting what was typed and saying what it is now, or "" once a number
    in range is typed.
    """
    box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
    watcher = _CorrectionWatcher(box, name, note)
    box.lineEdit().setValidator(_OutOfRangeValidator(box, watcher))
    box.installEventFilter(watcher)


class _OutOfRangeValidator(QValidator):
    """The box's own validator, except that a number out of range is shown as typed (intermediate, not refused)."""

    def __init__(self, box: NumberBox, parent: QObject) -> None:
        super().__init__(parent)
        self._box = box

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:
        """Qt's verdict, with a number outside the range let through so the user sees what they typed."""
        box = self._box
        if box.specialValueText() and text == box.specialValueText():
            return QValidator.State.Acceptable, text, pos
        # as Qt's own validator of a spin box's line: the prefix and suffix are kept when the whole text is typed over
        if box.prefix() and not text.startswith(box.prefix()):
            text, pos = box.prefix() + text, pos + len(box.prefix())
        if box.suffix() and not text.endswith(box.suffix()):
            text += box.suffix()
        state, text, pos = box.validate(text, pos)
        if state is QValidator.State.Invalid and _out_of_range(self._box, typed_number(self._box, text)):
            state = QValidator.State.Intermediate
        return state, text, pos

    def fixup(self, text: str) -> str:
        """The box's own fixup."""
        return self._box.fixup(text) or text


class _CorrectionWatcher(QObject):
    """Corrects and explains what was typed into one box when it is taken (Enter, or the focus leaving)."""

    def __init__(self, box: NumberBox, name: str, note: Callable[[str], None]) -> None:
        super().__init__(box)
        self._box, self._name, self._note = box, name, note
        self._edited = False
        box.lineEdit().textEdited.connect(self._on_edited)

    def _on_edited(self, _text: str) -> None:
        self._edited = True

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Takes the typed text before the box reads it (the box alone would make an unreadable number its least)."""
        taking = event.type() == QEvent.Type.FocusOut or (
            event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent) and event.key() in _TAKE_KEYS
        )
        if taking and watched is self._box and self._edited:
            self._edited = False
            self._note(self._take(self._box.lineEdit().text()))
        return False

    def _take(self, shown: str) -> str:
        """Puts the nearest allowed number (or the old one) in place of an unacceptable ``shown``; says why."""
        box = self._box
        if box.validate(shown, 0)[0] is QValidator.State.Acceptable:
            return ""
        typed = bare_text(box, shown)
        number = typed_number(box, typed)
        # nothing typed, not a number, or below a least that has a word ("No limit", "Any price": a mistyped -5
        # must not lift a cap): the number shown before comes back; else the nearest one allowed
        if number is None or (number < box.minimum() and box.specialValueText()):
            _put(box, box.value())
        else:
            _put(box, min(max(number, box.minimum()), box.maximum()))
        return correction_words(box, self._name, typed) if typed else ""


def _put(box: NumberBox, value: float) -> None:
    """Sets ``value`` (showing it again even when it is the value already held)."""
    if isinstance(box, QSpinBox):
        box.setValue(round(value))
    else:
        box.setValue(value)


def bare_text(box: NumberBox, text: str) -> str:
    """``text`` without the box's prefix, suffix and surrounding spaces."""
    return text.strip().removeprefix(box.prefix().strip()).removesuffix(box.suffix().strip()).strip()


def typed_number(box: NumberBox, text: str) -> float | None:
    """The number ``text`` (as shown in ``box``, prefix and suffix included) reads as, or None."""
    number, ok = box.locale().toDouble(bare_text(box, text))
    if not ok:
        try:
            number = float(bare_text(box, text))  # what the locale does not read: 2e-4 in a scientific box
        except ValueError:
            return None
    return number


def _out_of_range(box: NumberBox, number: float | None) -> bool:
    return number is not None and not box.minimum() <= number <= box.maximum()


def correction_words(box: NumberBox, name: str, typed: str) -> str:
    """Why ``typed`` (prefix and suffix included or not) is not what ``box`` holds now ("" when it was taken)."""
    typed = bare_text(box, typed)
    number = typed_number(box, typed)
    if number is None:
        what = f"“{typed}” is not a number, so it stays {box.text()}."
    elif number < box.minimum() and box.specialValueText():
        what = f"“{typed}” is below the lowest it takes, so it stays {box.text()}."
    elif number < box.minimum():
        what = f"“{typed}” is below the lowest it takes, so it is {box.text()} now."
    elif number > box.maximum():
        what = f"“{typed}” is above the highest it takes, so it is {box.text()} now."
    else:
        return ""
    return f"{name}: {what} {range_words(box)}"


def range_words(box: NumberBox) -> str:
    """``Type a number from 1 to 1,000.`` (with what the lowest number is called, when it has a word)."""
    low, high = _shown(box, box.minimum()), _shown(box, box.maximum())
    special = box.specialValueText()
    named = f" ({low} means {special})" if special else ""
    return f"Type a number from {low} to {high}{named}."


def _shown(box: NumberBox, value: float) -> str:
    """``value`` as ``box`` writes it."""
    return box.textFromValue(int(value)) if isinstance(box, QSpinBox) else box.textFromValue(float(value))


class CorrectionNote(QLabel):
    """A small line beside a number field saying why the last number typed was changed (hidden while it was not).

    Call :meth:`watch` for the field it speaks for: one note per field, so that each correction is said beside its
    own field and none replaces another's.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setProperty("role", "field_note")
        self.setAccessibleName("Why a number was changed")
        self.hide()

    def watch(self, box: NumberBox, name: str) -> None:
        """Speaks for ``box`` (named ``name`` in the sentence)."""
        explain_corrections(box, name, self.show_words)

    def show_words(self, words: str) -> None:
        """Shows ``words`` ("" hides the line), scrolled into view: a field reached by its shortcut may be out of it."""
        self.setText(words)
        self.setVisible(bool(words))
        if words:
            QTimer.singleShot(0, self, self._scroll_into_view)  # once the layout has made room for the line

    def _scroll_into_view(self) -> None:
        area = self.parentWidget()
        while area is not None and not isinstance(area, QScrollArea):
            area = area.parentWidget()
        if area is not None and self.isVisible():
            area.ensureWidgetVisible(self, 0, 8)
