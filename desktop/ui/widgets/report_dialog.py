"""The compare report in the app: the verdict, the scores, the run's loss curve and the rows that flipped."""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QDialog, QHBoxLayout, QTabWidget, QTextBrowser, QVBoxLayout, QWidget

from desktop.core.judging.verdict import Outcome
from desktop.services.evaluation.saved_report import FlippedRow, SavedReport
from desktop.ui.widgets.blocks import Banner, plain_button, primary_button
from desktop.ui.widgets.loss_chart import LossChart

#: How the verdict is coloured.
_SEVERITY = {Outcome.BETTER: "success", Outcome.WORSE: "danger", Outcome.UNCLEAR: "info"}


class ReportDialog(QDialog):
    """One compare report, read from its ``report.json``; the HTML report (every row) opens in the browser.

    Args:
        parent: The window it belongs to.
        report: The report as read.
        title: What was compared (the adapter's name).
    """

    def __init__(self, parent: QWidget, report: SavedReport, title: str) -> None:
        super().__init__(parent)
        self.report = report
        self.setWindowTitle(f"Compare report: {title}")
        self.setAccessibleName("Compare report")
        self.resize(860, 640)
        layout = QVBoxLayout(self)
        severity = _SEVERITY[report.outcome]
        if report.general_regressed and report.outcome is not Outcome.WORSE:
            severity = "warning"  # better at the task, and worse at what it was not trained for
        self.verdict = Banner(severity, report.headline, "\n".join(report.lines))
        layout.addWidget(self.verdict)
        self.tabs = QTabWidget()
        self.fixed_view = self._rows_view(report.fixed, "Fixed: the base got these wrong, the fine-tune right")
        self.broke_view = self._rows_view(report.broke, "Broken: the base got these right, the fine-tune wrong")
        self.tabs.addTab(self.fixed_view, f"&Fixed ({len(report.fixed)})")
        self.tabs.addTab(self.broke_view, f"&Broken ({len(report.broke)})")
        self.chart = LossChart()
        if report.losses or report.eval_losses:
            last = max(step for step, _ in [*report.losses, *report.eval_losses])  # the run's steps span the axis
            self.chart.show_points(*_split(report.losses), *_split(report.eval_losses), last)
            self.tabs.addTab(self.chart, "&Loss curve")
        layout.addWidget(self.tabs, 1)
        layout.addLayout(self._buttons())

    def _rows_view(self, rows: list[FlippedRow], what: str) -> QTextBrowser:
        view = QTextBrowser()
        view.setAccessibleName(what)
        view.setOpenLinks(False)
        if not rows:
            view.setPlainText("None.")
            return view
        view.setHtml("".join(_row_html(row) for row in rows))  # every text from the data or a model is escaped
        return view

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.browser_button = plain_button("Open in &browser", "external-link", "Open the HTML report")
        self.browser_button.setEnabled(self.report.html is not None)
        self.browser_button.setToolTip("" if self.report.html else "This report has no HTML file beside it")
        self.browser_button.clicked.connect(self.on_browser_clicked)
        close = primary_button("&Close", None, "Close the report")
        close.clicked.connect(self.accept)
        row.addWidget(self.browser_button)
        row.addStretch(1)
        row.addWidget(close)
        return row

    def on_browser_clicked(self) -> None:
        """The HTML report (the loss curves drawn, every row judged) in the browser."""
        if self.report.html is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.report.html)))


def _split(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    return [step for step, _ in points], [loss for _, loss in points]


def _row_html(row: FlippedRow) -> str:
    """One flipped row as a small table: what was asked, the reference, and both answers, each as plain text."""
    cells = (
        ("Prompt", row.prompt),
        ("Reference", row.reference),
        ("Base", row.base_answer),
        ("Fine-tune", row.tuned_answer),
    )
    lines = "".join(
        f'<tr><td width="90"><b>{label}</b></td><td style="white-space: pre-wrap">{html.escape(text)}</td></tr>'
        for label, text in cells
    )
    return f'<p><b>Row {row.line}</b></p><table cellspacing="0" cellpadding="2">{lines}</table><hr/>'


def report_title(path: Path) -> str:
    """A report's name for its dialog: the folder the adapter's exports are in."""
    return path.parent.parent.name if path.parent.name == "compare" else path.parent.name
