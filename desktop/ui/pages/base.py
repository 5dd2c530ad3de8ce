"""What every page of the main window has in common."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

from desktop.ui.design.palette import METRICS
from desktop.ui.widgets.blocks import ContentColumn, caption, heading, set_role


class BasePage(QWidget):
    """A page in the main window's stack: a title, a one-line purpose, and content below.

    The content sits in a centred column at most :data:`METRICS.content_width` wide. Pages whose content is longer
    than a small window scroll (``scrolls = True``); pages that fill the height themselves (tables, chat) do not.
    Subclasses fill ``self.body`` and may override :meth:`load` to fetch what they show without blocking the UI.
    """

    #: Short name used by ``rentune --screenshot --page NAME`` and the sidebar.
    page_name = ""
    #: The sidebar label and page heading.
    title = ""
    #: One sentence under the heading saying what the page is for.
    purpose = ""
    #: The sidebar icon (a Lucide name).
    icon_name = ""
    #: Whether the page body scrolls vertically inside its column.
    scrolls = True

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"{self.page_name}_page")
        self.setAccessibleName(f"{self.title} page")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(28, 22, 28, 16)
        column_layout = self._column(outer)
        title = heading(self.title, METRICS.title_scale)
        set_role(title, "heading")
        title.setObjectName("page_heading")
        column_layout.addWidget(title)
        if self.purpose:
            column_layout.addWidget(caption(self.purpose))
        self.body = QVBoxLayout()
        self.body.setSpacing(METRICS.gap)
        column_layout.addLayout(self.body, 1)

    def _column(self, outer: QVBoxLayout) -> QVBoxLayout:
        if self.scrolls:
            column = ContentColumn()
            outer.addWidget(column)
            return column.body
        row = QHBoxLayout()
        inner = QWidget()
        inner.setMaximumWidth(METRICS.content_width)
        row.addWidget(inner, 1)
        outer.addLayout(row, 1)
        layout = QVBoxLayout(inner)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(METRICS.gap)
        return layout

    async def load(self) -> None:
        """Fetches what the page shows; called when the window opens. The default does nothing to fetch."""
