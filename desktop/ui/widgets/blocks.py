"""The building blocks every page is made of: cards, banners, badges, empty states and the two button roles.

Their look comes from the app stylesheet (:mod:`desktop.ui.design.stylesheet`) through the ``role`` and
``severity`` properties, so they follow a theme switch without code of their own.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QScrollBar,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from desktop.ui.design.icons import IconColor, tint
from desktop.ui.design.palette import METRICS

SEVERITY_ICONS = {"success": "circle-check", "warning": "triangle-alert", "danger": "circle-alert", "info": "info"}


def severity_color(severity: str) -> IconColor:
    """The foreground colour of ``severity`` (success, warning, danger, info) in whichever palette is current."""
    return lambda palette: palette.severity(severity)[0]


def set_role(widget: QWidget, role: str, severity: str | None = None) -> None:
    """Gives ``widget`` a look from the stylesheet (and a severity colour) and restyles it now."""
    widget.setProperty("role", role)
    if severity is not None:
        widget.setProperty("severity", severity)
    widget.style().unpolish(widget)
    widget.style().polish(widget)


def primary_button(text: str, icon_name: str | None = None, accessible_name: str | None = None) -> QPushButton:
    """The one main action of a page or dialog (Next, Launch, Export), in the accent colour."""
    button = QPushButton(text)
    set_role(button, "primary")
    _decorate(button, icon_name, accessible_name, "accent_text")
    return button


def destructive_button(text: str, icon_name: str | None = None, accessible_name: str | None = None) -> QPushButton:
    """An action that stops, deletes or spends (Stop, Delete, Launch anyway), in the danger colour."""
    button = QPushButton(text)
    set_role(button, "destructive")
    _decorate(button, icon_name, accessible_name, None)
    return button


def plain_button(text: str, icon_name: str | None = None, accessible_name: str | None = None) -> QPushButton:
    """A secondary action, with an optional icon."""
    button = QPushButton(text)
    _decorate(button, icon_name, accessible_name, None)
    return button


def _decorate(button: QPushButton, icon_name: str | None, accessible_name: str | None, color: str | None) -> None:
    if icon_name:
        tint(button, icon_name, color or "text")
    button.setAccessibleName(accessible_name or text_of(button))


def text_of(button: QPushButton) -> str:
    """A button's text without its mnemonic ampersand."""
    return button.text().replace("&", "")


def caption(text: str = "") -> QLabel:
    """Secondary, wrapped text in the muted colour."""
    label = QLabel(text)
    label.setWordWrap(True)
    set_role(label, "caption")
    return label


def heading(text: str, scale: float = METRICS.section_scale) -> QLabel:
    """A bold title ``scale`` times the body text."""
    label = QLabel(text)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * scale)
    font.setBold(True)
    label.setFont(font)
    set_role(label, "section")
    return label


class Badge(QLabel):
    """A small coloured pill: ``OK``, ``3 errors``, ``Spot``. Severity is colour *and* words, never colour alone."""

    def __init__(self, text: str = "", severity: str = "info", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        self.show_state(text, severity)

    def show_state(self, text: str, severity: str) -> None:
        """Changes the words and the colour."""
        self.setText(text)
        self.setAccessibleName(text)
        set_role(self, "badge", severity)


class Card(QFrame):
    """A rounded surface holding one topic, with an optional title and a caption under it.

    Fill ``card.body`` (a vertical layout); put actions beside the title with :meth:`add_header_widget`.
    """

    def __init__(self, title: str = "", subtitle: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        set_role(self, "card")
        outer = QVBoxLayout(self)
        pad = METRICS.card_padding
        outer.setContentsMargins(pad, pad - 2, pad, pad)
        outer.setSpacing(8)
        self._header = QHBoxLayout()
        self.title_label = heading(title) if title else None
        if self.title_label is not None:
            self.setAccessibleName(title)
            self._header.addWidget(self.title_label, 1)
            outer.addLayout(self._header)
        if subtitle:
            outer.addWidget(caption(subtitle))
        self.body = QVBoxLayout()
        self.body.setSpacing(8)
        outer.addLayout(self.body)

    def add_header_widget(self, widget: QWidget) -> None:
        """Puts ``widget`` (a button, a badge) at the right of the card's title."""
        self._header.addWidget(widget)


class Banner(QFrame):
    """A coloured message across the page: a bold headline, details under it, and optional action buttons.

    Used for what the user must know before going on (blocking errors in red, warnings in amber).
    """

    sig_closed = Signal()

    def __init__(self, severity: str = "info", headline: str = "", details: str = "") -> None:
        super().__init__()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        self.icon_label = QLabel()
        self.icon_label.setAlignment(Qt.AlignmentFlag.AlignTop)
        layout.addWidget(self.icon_label)
        texts = QVBoxLayout()
        self.headline_label = QLabel()
        self.headline_label.setWordWrap(True)
        font = self.headline_label.font()
        font.setBold(True)
        self.headline_label.setFont(font)
        self.details_label = QLabel()
        self.details_label.setWordWrap(True)
        self.details_label.setTextFormat(Qt.TextFormat.PlainText)
        texts.addWidget(self.headline_label)
        texts.addWidget(self.details_label)
        layout.addLayout(texts, 1)
        self.action_row = QHBoxLayout()
        layout.addLayout(self.action_row)
        self.show_message(severity, headline, details)

    def show_message(self, severity: str, headline: str, details: str = "") -> None:
        """Shows ``headline`` (and ``details``) in the colour of ``severity``; an empty headline hides the banner."""
        set_role(self, "banner", severity)
        tint(self.icon_label, SEVERITY_ICONS.get(severity, "info"), severity_color(severity), 20)
        self.headline_label.setText(headline)
        self.details_label.setText(details)
        self.details_label.setVisible(bool(details))
        self.setAccessibleName(f"{severity}: {headline}")
        self.setVisible(bool(headline))

    def add_action(self, button: QPushButton) -> None:
        """Adds a button at the banner's right (Fix, Add key, Launch anyway)."""
        self.action_row.addWidget(button)


class EmptyState(QFrame):
    """What an empty page or list shows: what will appear here and how to get it, with an optional action."""

    def __init__(self, icon_name: str, title: str, text: str, action: QPushButton | None = None) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 32, 24, 32)
        picture = QLabel()
        tint(picture, icon_name, size=40)
        picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(picture)
        title_label = heading(title)
        title_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(title_label)
        body = caption(text)
        body.setAlignment(Qt.AlignmentFlag.AlignCenter)
        body.setMaximumWidth(560)
        # No alignment flag on the wrapped text: an aligned item gets its one-line size hint and its lines clip.
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(body, 100)
        row.addStretch(1)
        layout.addLayout(row)
        if action is not None:
            layout.addWidget(action, 0, Qt.AlignmentFlag.AlignHCenter)
        self.setAccessibleName(title)


class ContentColumn(QScrollArea):
    """A vertically scrolling page body whose content stays at most :data:`METRICS.content_width` wide, centred.

    Pages put their content in ``column.body``; a wide window gains margins, never sprawling rows.
    """

    def __init__(self, max_width: int = METRICS.content_width) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        holder = QWidget()
        row = QHBoxLayout(holder)
        row.setContentsMargins(0, 0, 0, 0)
        self.inner = QWidget()
        self.inner.setMaximumWidth(max_width)
        self.body = QVBoxLayout(self.inner)
        self.body.setContentsMargins(0, 0, 4, 0)
        self.body.setSpacing(METRICS.gap)
        row.addStretch(0)
        row.addWidget(self.inner, 1)
        row.addStretch(0)
        self.setWidget(holder)


class WheelGuard(QObject):
    """Keeps the scroll wheel from editing a number, choice or slider it passes over without focus.

    Install once on the application (:func:`install_wheel_guard`). Such fields take focus only by click or Tab, and
    a wheel turned over an unfocused one scrolls the page, list or table around it instead. Scroll bars are left
    alone: a scroll area scrolls by forwarding the wheel to its bar.
    """

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Sends the wheel over an unfocused field to its scroll area; stops the wheel from focusing fields."""
        if isinstance(watched, QScrollBar) or not isinstance(watched, (QAbstractSpinBox, QComboBox, QAbstractSlider)):
            return False  # a scroll bar is how a scroll area scrolls: it gets the wheel its area forwards to it
        if event.type() == QEvent.Type.Polish and watched.focusPolicy() == Qt.FocusPolicy.WheelFocus:
            watched.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        if event.type() != QEvent.Type.Wheel or watched.hasFocus():
            return False
        area = enclosing_scroll_area(watched)
        if area is not None:  # sent, not propagated: Qt passes a sent wheel event to no parent on its own
            QCoreApplication.sendEvent(area.viewport(), event)
        return True


def enclosing_scroll_area(widget: QWidget) -> QAbstractScrollArea | None:
    """The nearest scroll area (a page, list or table) that ``widget`` lies in, if any."""
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QAbstractScrollArea):
        parent = parent.parentWidget()
    return parent


def install_wheel_guard(app: QObject) -> WheelGuard:
    """Installs :class:`WheelGuard` on ``app`` (the QApplication); it lives as long as the app."""
    guard = WheelGuard(app)
    app.installEventFilter(guard)
    return guard
