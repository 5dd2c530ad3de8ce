"""The app-wide Qt stylesheet, built from a palette.

Widgets opt into a look with a dynamic property instead of their own stylesheet, so a theme switch restyles them:
``role`` is ``primary``, ``destructive``, ``card``, ``caption``, ``heading``, ``section``, ``badge``, ``banner``,
``step`` (the wizard's step indicator) or ``number`` (a number field typed or stepped with the arrow keys);
badges, banners and notes (a line said in its severity's colour, such as what a dialog refuses) carry ``severity``
(``success``, ``warning``, ``danger``, ``info``).
"""

from __future__ import annotations

from desktop.ui.design.palette import METRICS, Palette


def _severity_rules(palette: Palette) -> str:
    rules = []
    for level in ("success", "warning", "danger", "info"):
        foreground, background = palette.severity(level)
        rules.append(
            f'QLabel[role="badge"][severity="{level}"] {{ color: {foreground}; background: {background};'
            f" border: 1px solid {foreground}; }}\n"
            f'QFrame[role="banner"][severity="{level}"] {{ background: {background};'
            f" border: 1px solid {foreground}; border-left: 4px solid {foreground}; }}\n"
            f'QLabel[role="banner_icon"][severity="{level}"] {{ color: {foreground}; }}\n'
            f'QLabel[role="note"][severity="{level}"] {{ color: {foreground}; }}\n'
        )
    return "".join(rules)


def _buttons(palette: Palette) -> str:
    radius = METRICS.radius - 2
    return f"""
QPushButton, QToolButton {{ background: {palette.surface}; color: {palette.text}; border: 1px solid {palette.border};
    border-radius: {radius}px; padding: 6px 14px; min-height: 20px; }}
QPushButton:hover, QToolButton:hover {{ background: {palette.surface_alt}; }}
QPushButton:pressed {{ background: {palette.border}; }}
QPushButton:disabled, QToolButton:disabled {{ color: {palette.text_muted}; background: {palette.surface_alt}; }}
QPushButton:focus, QToolButton:focus {{ border: 2px solid {palette.accent}; }}
QPushButton[role="primary"] {{ background: {palette.accent}; color: {palette.accent_text};
    border: 1px solid {palette.accent}; font-weight: 600; }}
QPushButton[role="primary"]:hover {{ border: 2px solid {palette.text}; }}
QPushButton[role="primary"]:focus {{ border: 2px solid {palette.text}; }}
QPushButton[role="primary"]:disabled {{ background: {palette.surface_alt}; color: {palette.text_muted};
    border: 1px solid {palette.border}; }}
QPushButton[role="destructive"] {{ color: {palette.danger}; border: 1px solid {palette.danger}; font-weight: 600; }}
QPushButton[role="destructive"]:hover {{ background: {palette.danger_bg}; }}
QPushButton[role="destructive"]:disabled {{ color: {palette.text_muted}; border: 1px solid {palette.border};
    background: {palette.surface_alt}; }}
QPushButton[role="link"] {{ border: none; background: transparent; color: {palette.accent}; padding: 2px 4px; }}
QPushButton[role="link"]:focus {{ border: 2px solid {palette.accent}; }}
QPushButton[role="step"] {{ border: 2px solid transparent; background: transparent; color: {palette.text};
    padding: 5px 10px; }}
QPushButton[role="step"]:hover {{ background: {palette.surface_alt}; }}
QPushButton[role="step"][state="current"] {{ background: {palette.info_bg}; color: {palette.accent};
    font-weight: 700; }}
QPushButton[role="step"]:disabled {{ background: transparent; color: {palette.text_muted}; }}
QPushButton[role="step"]:focus {{ border: 2px solid {palette.accent}; }}
"""


def _fields(palette: Palette) -> str:
    radius = METRICS.radius - 2
    return f"""
QLineEdit, QSpinBox, QDoubleSpinBox, QComboBox, QPlainTextEdit, QTextEdit, QTextBrowser {{
    background: {palette.surface}; color: {palette.text}; border: 1px solid {palette.border};
    border-radius: {radius}px; padding: 4px 6px; selection-background-color: {palette.accent};
    selection-color: {palette.accent_text}; }}
QLineEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus, QComboBox:focus, QPlainTextEdit:focus, QTextEdit:focus {{
    border: 2px solid {palette.accent}; }}
QLineEdit[invalid="true"], QSpinBox[invalid="true"], QDoubleSpinBox[invalid="true"], QComboBox[invalid="true"],
QTableView[invalid="true"] {{ border: 2px solid {palette.danger}; }}
QCheckBox, QRadioButton {{ padding: 2px 4px; border: 2px solid transparent; border-radius: 4px; }}
QCheckBox:focus, QRadioButton:focus {{ border: 2px solid {palette.accent}; color: {palette.text};
    background: {palette.info_bg}; }}
QCheckBox:disabled, QRadioButton:disabled {{ color: {palette.text_muted}; }}
QTableView, QTableWidget, QTreeView, QListView {{ background: {palette.surface}; color: {palette.text};
    alternate-background-color: {palette.surface_alt}; border: 1px solid {palette.border}; border-radius: {radius}px;
    gridline-color: {palette.border}; selection-background-color: {palette.accent};
    selection-color: {palette.accent_text}; }}
QTableView:focus, QTreeView:focus, QListView:focus {{ border: 2px solid {palette.accent}; }}
QHeaderView::section {{ background: {palette.surface_alt}; color: {palette.text_muted}; border: none;
    border-bottom: 1px solid {palette.border}; padding: 6px; font-weight: 600; }}
QSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::up-button, QDoubleSpinBox::down-button {{
    width: 0px; border: none; }}
QProgressBar {{ background: {palette.surface_alt}; border: 1px solid {palette.border}; border-radius: {radius}px;
    text-align: center; color: {palette.text}; min-height: 14px; }}
QProgressBar::chunk {{ background: {palette.accent}; border-radius: {radius}px; }}
"""


def _frames(palette: Palette) -> str:
    return f"""
QWidget {{ color: {palette.text}; }}
QMainWindow, QDialog {{ background: {palette.window}; }}
QScrollArea, QScrollArea > QWidget > QWidget {{ background: transparent; }}
QStackedWidget > QWidget {{ background: {palette.window}; }}
QFrame[role="card"], QGroupBox {{ background: {palette.surface}; border: 1px solid {palette.border};
    border-radius: {METRICS.radius}px; }}
QGroupBox {{ margin-top: 22px; padding: {METRICS.card_padding // 2}px; font-weight: 600; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 4px; top: 2px; color: {palette.text}; }}
QFrame[role="banner"] {{ border-radius: {METRICS.radius}px; }}
QLabel {{ background: transparent; }}
QLabel[role="caption"] {{ color: {palette.text_muted}; }}
QLabel[role="field_note"] {{ color: {palette.warning}; font-weight: 600; }}
QLabel[role="heading"], QLabel[role="section"] {{ font-weight: 700; }}
QLabel[role="badge"] {{ border-radius: 9px; padding: 1px 8px; font-weight: 600; }}
QLabel[role="metric"] {{ font-weight: 700; }}
QListWidget#sidebar {{ background: {palette.surface_alt}; border: none; border-right: 1px solid {palette.border};
    padding-top: 8px; outline: none; }}
QListWidget#sidebar::item {{ padding: 9px 12px; margin: 1px 8px; border-radius: 6px; color: {palette.text}; }}
QListWidget#sidebar::item:selected {{ background: {palette.accent}; color: {palette.accent_text}; }}
QListWidget#sidebar::item:hover:!selected {{ background: {palette.border}; }}
QListWidget#sidebar::item:focus {{ border: 2px solid {palette.text}; }}
QStatusBar {{ background: {palette.surface_alt}; color: {palette.text_muted}; border-top: 1px solid {palette.border}; }}
QTabWidget::pane {{ border: 1px solid {palette.border}; border-radius: {METRICS.radius}px;
    background: {palette.surface}; }}
QTabBar::tab {{ padding: 6px 14px; color: {palette.text_muted}; }}
QTabBar::tab:selected {{ color: {palette.text}; border-bottom: 2px solid {palette.accent}; }}
QToolTip {{ background: {palette.surface}; color: {palette.text}; border: 1px solid {palette.border}; }}
QMenu {{ background: {palette.surface}; color: {palette.text}; border: 1px solid {palette.border}; }}
QMenu::item:selected {{ background: {palette.accent}; color: {palette.accent_text}; }}
"""


def _scroll_bars(palette: Palette) -> str:
    return f"""
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 2px; }}
QScrollBar::handle {{ background: {palette.border}; border-radius: 4px; min-height: 28px; min-width: 28px; }}
QScrollBar::handle:hover {{ background: {palette.text_muted}; }}
QScrollBar::add-line, QScrollBar::sub-line {{ width: 0; height: 0; }}
QScrollBar::add-page, QScrollBar::sub-page {{ background: transparent; }}
"""


def build_stylesheet(palette: Palette) -> str:
    """Returns the whole app's stylesheet in ``palette``'s colours."""
    parts = (_frames, _fields, _buttons, _scroll_bars, _severity_rules)
    return "".join(part(palette) for part in parts)
