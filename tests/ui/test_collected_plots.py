"""The harness drops only pyqtgraph's error for a plot item the garbage collector emptied (tests/conftest.py)."""

from __future__ import annotations

import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt

from tests.conftest import _in_pyqtgraph_teardown


def test_an_emptied_plot_label_asked_for_its_size_is_the_error_dropped(qapp: object) -> None:
    label = pg.LabelItem("loss")
    attributes = dict(label.__dict__)
    label.__dict__.clear()  # what the collector does to an object in a cycle before Qt deletes the scene
    with pytest.raises(AttributeError) as raised:
        label.sizeHint(Qt.SizeHint.PreferredSize, None)
    label.__dict__.update(attributes)
    assert _in_pyqtgraph_teardown(raised.value)


def test_any_other_error_while_collecting_still_fails_the_test() -> None:
    with pytest.raises(AttributeError) as raised:
        _ = object().missing  # type: ignore[attr-defined]
    assert not _in_pyqtgraph_teardown(raised.value)
    assert not _in_pyqtgraph_teardown(RuntimeError("wrapped C/C++ object has been deleted"))
