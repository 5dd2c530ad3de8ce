"""The Export dialog's outputs that cannot be made look it, in light and in dark: greyed words and a greyed box.

They looked enabled: the app's stylesheet gave every widget the text colour whatever its state, and a disabled tick
box was drawn with the same white (or dark) box as one that can be ticked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QCheckBox, QStyle, QStyleOptionButton, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.export.compatibility import OutputFormat, Verdict
from desktop.core.settings import Theme
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.adapters import ReturnedAdapter
from desktop.services.runs.outputs import AdapterSource
from desktop.ui.design.palette import Palette
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.local_dialogs import ExportDialog

REASON = "llama.cpp does not recognise the tokenizer"


@pytest.fixture
def light_afterwards() -> Iterator[None]:
    yield
    apply_theme(Theme.LIGHT)


def _dialog(qtbot: QtBot, parent: QWidget, folder: Path) -> ExportDialog:
    source = AdapterSource(folder, None, None, "run-a")  # no base: nothing is judged in the background
    adapter = ReturnedAdapter("run-a", source, 1000, 0.0, 60.0, 0.12, True, None, None, True)
    dialog = ExportDialog(parent, adapter, SecretStore())
    impossible = Verdict(False, REASON)
    dialog.show_verdicts({OutputFormat.GGUF: impossible, OutputFormat.LORA_GGUF: impossible})
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def _ink(image: QImage, background: QColor) -> float:
    """How far the most contrasting pixel of ``image`` is from ``background`` in lightness (0 to 1)."""
    far = 0.0
    for x in range(image.width()):
        for y in range(image.height()):
            far = max(far, abs(QColor(image.pixel(x, y)).lightnessF() - background.lightnessF()))
    return far


def _box_fill(check: QCheckBox) -> QColor:
    """The colour inside the tick box, at its centre."""
    option = QStyleOptionButton()
    check.initStyleOption(option)
    box = check.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, option, check)
    return QColor(check.grab().toImage().pixel(box.center()))


@pytest.mark.parametrize("theme", [Theme.LIGHT, Theme.DARK])
def test_an_output_that_cannot_be_made_looks_disabled(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path, theme: Theme, light_afterwards: None
) -> None:
    palette: Palette = apply_theme(theme)
    parent = QWidget()  # held here: qtbot keeps only a weak reference
    qtbot.addWidget(parent)
    dialog = _dialog(qtbot, parent, tmp_path)
    qloop.run_until_complete(asyncio.sleep(0.05))
    refused, free = dialog.lora_check, dialog.mlx_check  # both unticked; only the first is impossible
    assert not refused.isEnabled() and free.isEnabled() and not refused.isChecked() and not free.isChecked()
    window = QColor(palette.window)
    refused_ink, free_ink = _ink(refused.grab().toImage(), window), _ink(free.grab().toImage(), window)
    assert refused_ink < free_ink * 0.8, f"greyed words: {refused_ink:.2f} vs {free_ink:.2f}"
    refused_box, free_box = _box_fill(refused), _box_fill(free)
    assert refused_box != free_box, f"the impossible option's box is greyed ({refused_box.name()} vs {free_box.name()})"
    types = list(dialog.type_checks.values())
    assert all(not check.isEnabled() for check in types)
    assert all(_box_fill(check) == refused_box for check in types), "the GGUF types look as disabled as GGUF"


def test_every_output_keeps_its_full_height_when_the_reasons_come_after_the_dialog_opened(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The GGUF types vanished into an empty gap at 1024x700: the reasons made the dialog taller than it was opened."""
    parent = QWidget()
    qtbot.addWidget(parent)
    source = AdapterSource(tmp_path, None, None, "run-a")
    adapter = ReturnedAdapter("run-a", source, 1000, 0.0, 60.0, 0.12, True, None, None, True)
    dialog = ExportDialog(parent, adapter, SecretStore())
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.move(dialog.x(), dialog.screen().availableGeometry().bottom() - dialog.frameGeometry().height())
    long_reason = (
        f"{REASON} of /home/someone/models/a-rather-long-folder-name/tiny-llama (its pre-tokenizer is not one "
        "llama.cpp knows), so it cannot be converted to GGUF; merge and MLX still work"
    )
    impossible = Verdict(False, long_reason)
    verdicts = {OutputFormat.GGUF: impossible, OutputFormat.LORA_GGUF: impossible, OutputFormat.OLLAMA: impossible}
    dialog.show_verdicts(verdicts)
    qloop.run_until_complete(asyncio.sleep(0.2))
    checks = [check for group in dialog._format_checks().values() for check in group]
    for check in checks:
        assert check.height() >= check.minimumSizeHint().height(), f"{check.text()!r} is squeezed: {check.height()}"
    boxes = [
        check.geometry().translated(check.parentWidget().mapTo(dialog, check.pos()) - check.pos()) for check in checks
    ]
    for index, box in enumerate(boxes):
        for other in boxes[index + 1 :]:
            assert not box.intersects(other), "two options drawn over each other"
    assert dialog.verdict_label.text().count(REASON) == 1, f"one reason said once: {dialog.verdict_label.text()}"
    screen = dialog.screen().availableGeometry()
    assert screen.contains(dialog.frameGeometry()), f"the dialog stays on the screen: {dialog.frameGeometry()}"
    assert dialog.body_scroll.verticalScrollBar().maximum() == 0, "with room on the screen, all shows without scrolling"
