"""What every page of the main window has in common."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget


class BasePage(QWidget):
    """A page in the main window's stack: a title, a one-line purpose, and content below.

    Subclasses fill ``self.body`` and may override :meth:`load` to fetch what they show without blocking the UI.
    """

    #: Short name used by ``rentune --screenshot --page NAME`` and the sidebar.
    page_name = ""
    #: The sidebar label and page heading.
    title = ""
    #: One sentence under the heading saying what the page is for.
    purpose = ""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(f"{self.page_name}_page")
        self.setAccessibleName(f"{self.title} page")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(28, 24, 28, 24)
        outer.setSpacing(12)
        heading = QLabel(self.title)
        heading.setObjectName("page_heading")
        font = heading.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        heading.setFont(font)
        outer.addWidget(heading)
        if self.purpose:
            purpose = QLabel(self.purpose)
            purpose.setWordWrap(True)
            outer.addWidget(purpose)
        self.body = QVBoxLayout()
        self.body.setSpacing(14)
        outer.addLayout(self.body, 1)

    async def load(self) -> None:
        """Fetches what the page shows; called when the window opens. The default does nothing to fetch."""
