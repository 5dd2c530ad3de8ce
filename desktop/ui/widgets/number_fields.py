"""Number fields that say why they changed what was typed, instead of silently putting the old number back."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QLabel, QSpinBox, QWidget

NumberBox = QSpinBox | QDoubleSpinBox


def explain_corrections(box: NumberBox, name: str, note: Callable[[str], None]) -> None:
    """Makes ``box`` take the nearest number it allows for one out of its range, and tell ``note`` why.

    Qt's default puts the previous value back without a word (epochs typed as 0.05 became 3.00 again). ``note`` gets
    a sentence naming the field, what was typed and what it is now, or "" once a number in range is typed.
    """
    box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
    last = {"typed": ""}
    box.lineEdit().textEdited.connect(lambda text: last.update(typed=text))

    def on_editing_finished() -> None:
        typed, last["typed"] = last["typed"], ""
        if typed:
            note(correction_words(box, name, typed))

    box.editingFinished.connect(on_editing_finished)


def correction_words(box: NumberBox, name: str, text: str) -> str:
    """Why ``text`` typed into ``box`` is not what it holds now ("" when it was taken as typed)."""
    text = text.strip().removeprefix(box.prefix().strip()).removesuffix(box.suffix().strip()).strip()
    number, ok = box.locale().toDouble(text)
    if not ok:
        return f"{name}: “{text}” is not a number, so it stays {box.text()}."
    if number < box.minimum():
        return f"{name}: {text} is below the lowest it takes, {_shown(box, box.minimum())}; it is that now."
    if number > box.maximum():
        return f"{name}: {text} is above the highest it takes, {_shown(box, box.maximum())}; it is that now."
    return ""


def _shown(box: NumberBox, value: float) -> str:
    """``value`` as ``box`` writes it."""
    return box.textFromValue(int(value)) if isinstance(box, QSpinBox) else box.textFromValue(float(value))


class CorrectionNote(QLabel):
    """A small line beside number fields saying why the last number typed was changed (hidden while it was not).

    Call :meth:`watch` for each field it speaks for.
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
        """Shows ``words`` ("" hides the line)."""
        self.setText(words)
        self.setVisible(bool(words))
