"""The colours, type scale and spacing of Rentune, as named tokens for light and dark."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Palette:
    """The colour tokens every page uses; nothing in the app names a colour outside this module.

    Attributes:
        name: ``light`` or ``dark``.
        window: The window background behind cards.
        surface: Cards, fields and tables.
        surface_alt: Alternate table rows, hovered rows, the sidebar.
        border: Card and field outlines.
        text: Body text.
        text_muted: Secondary text (captions, hints).
        accent: The primary action, links, selection, focus ring.
        accent_text: Text on the accent colour.
        success: Good outcomes (fits, finished, checks passed).
        warning: Needs a look (tight fit, truncation).
        danger: Blocks or destroys (does not fit, delete, stop).
        success_bg: A tinted background for success banners and badges.
        warning_bg: A tinted background for warning banners and badges.
        danger_bg: A tinted background for danger banners and badges.
        info_bg: A tinted background for neutral banners.
        chart: Category colours for charts, in a fixed order (a category keeps its colour).
    """

    name: str
    window: str
    surface: str
    surface_alt: str
    border: str
    text: str
    text_muted: str
    accent: str
    accent_text: str
    success: str
    warning: str
    danger: str
    success_bg: str
    warning_bg: str
    danger_bg: str
    info_bg: str
    chart: tuple[str, ...]

    @property
    def is_dark(self) -> bool:
        """True for the dark palette."""
        return self.name == "dark"

    def severity(self, level: str) -> tuple[str, str]:
        """Returns (foreground, background) for ``success``, ``warning``, ``danger`` or ``info``."""
        return {
            "success": (self.success, self.success_bg),
            "warning": (self.warning, self.warning_bg),
            "danger": (self.danger, self.danger_bg),
        }.get(level, (self.accent, self.info_bg))


LIGHT = Palette(
    name="light",
    window="#f4f5f7",
    surface="#ffffff",
    surface_alt="#eef0f3",
    border="#d9dce1",
    text="#1c1e21",
    text_muted="#5f6670",
    accent="#4f46e5",
    accent_text="#ffffff",
    success="#15803d",
    warning="#b45309",
    danger="#c81e1e",
    success_bg="#e7f6ec",
    warning_bg="#fdf3e1",
    danger_bg="#fdeaea",
    info_bg="#eceefe",
    chart=("#4f46e5", "#0891b2", "#d97706", "#db2777", "#16a34a", "#7c3aed", "#64748b"),
)

DARK = Palette(
    name="dark",
    window="#17181b",
    surface="#212226",
    surface_alt="#2a2b30",
    border="#3a3c42",
    text="#e8e9eb",
    text_muted="#a0a5ad",
    accent="#8b85ff",
    accent_text="#0f0f14",
    success="#4ade80",
    warning="#fbbf24",
    danger="#f87171",
    success_bg="#173324",
    warning_bg="#3a2c10",
    danger_bg="#3d1a1a",
    info_bg="#25254a",
    chart=("#8b85ff", "#22d3ee", "#fbbf24", "#f472b6", "#4ade80", "#c084fc", "#94a3b8"),
)


@dataclass(frozen=True)
class Metrics:
    """Spacing and type scale (logical pixels and point-size factors of the system font).

    Attributes:
        content_width: The widest a page's content column grows (wider windows get margins).
        gap: Space between blocks on a page.
        card_padding: Space inside a card.
        radius: Corner radius of cards, fields and buttons.
        title_scale: Page heading size relative to body text.
        section_scale: Card title size relative to body text.
        caption_scale: Caption size relative to body text.
    """

    content_width: int = 1280
    gap: int = 14
    card_padding: int = 16
    radius: int = 8
    title_scale: float = 1.7
    section_scale: float = 1.15
    caption_scale: float = 0.9


METRICS = Metrics()
