"""The wizard's last step: the whole run on one page, the checks before launching, then Launch.

Launch writes the run as the same ``SPEC.toml`` the command line runs, after one question naming what is rented, at
what rate and for about how much. Red checks block Launch unless the user chooses "Launch anyway" (a missing part
blocks it for good); once launched, "Start over" begins the next fine-tune.
"""

from __future__ import annotations

import asyncio
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.core.export.on_machine import ON_MACHINE_OUTPUTS
from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import RunSpec, RunSpecError, run_spec_from_dict
from desktop.services.platform.files import atomic_copy
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.runs.drafts import fresh_draft, write_spec_toml
from desktop.services.runs.engine import RunError
from desktop.services.runs.export_choice import export_choice, judge_estimate
from desktop.services.runs.preflight import (
    Check,
    ReviewFacts,
    Severity,
    launch_estimate,
    preflight,
    read_review_facts,
)
from desktop.ui.background import Operation, Running, off_ui_thread
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.review_words import (
    Rows,
    compute_rows,
    data_rows,
    export_box_text,
    export_choice_words,
    judge_box_text,
    judge_words,
    launch_question,
    model_rows,
    sizing_rows,
)
from desktop.ui.pages.wizard.step_base import WizardStep
from desktop.ui.widgets.blocks import (
    Badge,
    Banner,
    Card,
    caption,
    destructive_button,
    plain_button,
    primary_button,
)
from desktop.ui.widgets.launch_dialog import confirm_launch
from desktop.ui.widgets.trial_card import TrialCard

SPEC_NAME = "SPEC.toml"
#: The review's sections: (step to edit, heading).
SECTIONS = (
    ("data", "Data"),
    ("model", "Model and method"),
    ("sizing", "Sizing"),
    ("compute", "Compute"),
)
STEP_TITLES = dict(SECTIONS)
_log = get_logger("ui.review")


class LaunchError(RuntimeError):
    """The run could not be launched; the message says what to fix."""


def launch_spec_path(now: datetime | None = None) -> Path:
    """A new ``launches/<UTC timestamp>/SPEC.toml`` path in the data folder (never one already used)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    root = app_paths().data_dir / "launches"
    folder, number = root / stamp, 1
    while folder.exists():
        number += 1
        folder = root / f"{stamp}-{number}"
    return folder / SPEC_NAME


def load_spec(path: Path) -> RunSpec:
    """Reads a SPEC.toml exactly as ``rentune run`` does.

    Raises:
        LaunchError: The file cannot be read or is not a valid run description.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return run_spec_from_dict(data, path.resolve().parent, path.resolve())
    except OSError as exc:
        raise LaunchError(f"{path} could not be read back ({exc}); check the disk and launch again") from exc
    except tomllib.TOMLDecodeError as exc:
        raise LaunchError(f"{path} is not valid TOML ({exc}); launch again") from exc
    except RunSpecError as exc:
        raise LaunchError(f"the run is not complete: {exc}; fix it with the matching Edit button") from exc


def write_launch_spec(draft: RunDraft, facts: ReviewFacts | None = None) -> tuple[Path, RunSpec]:
    """Writes the draft as SPEC.toml under ``launches/`` (with the estimate the review showed) and reads it back.

    Blocking: call it off the UI thread.
    """
    path = launch_spec_path()
    try:
        write_spec_toml(draft, path, launch_estimate(draft, facts) if facts is not None else None)
    except OSError as exc:
        raise LaunchError(f"SPEC.toml could not be written to {path.parent} ({exc}); check the disk") from exc
    return path, load_spec(path)


class FactsForm(QWidget):
    """A section's facts as label / value rows (rebuilt when they change)."""

    def __init__(self, accessible: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName(accessible)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.form.setHorizontalSpacing(18)
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.rows: Rows = []

    def show_rows(self, rows: Rows) -> None:
        """Replaces the rows."""
        if rows == self.rows:
            return
        self.rows = list(rows)
        while self.form.rowCount():
            self.form.removeRow(0)
        for label, value in rows:
            name = caption(label)
            name.setWordWrap(False)
            name.setMinimumWidth(name.fontMetrics().horizontalAdvance("Peak memory per GPU") + 8)  # cards align
            shown = QLabel(value)
            shown.setWordWrap(True)
            shown.setTextFormat(Qt.TextFormat.PlainText)
            shown.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            shown.setAccessibleName(f"{label}: {value}")
            self.form.addRow(name, shown)

    def text(self) -> str:
        """The rows as ``label: value`` lines (what a screen reader reads)."""
        return "\n".join(f"{label}: {value}" for label, value in self.rows)


class CheckRow(QFrame):
    """One pre-flight check: a badge, the headline, the details and the step that fixes it (``sig_fix``)."""

    sig_fix = Signal(str)

    def __init__(self, check: Check) -> None:
        super().__init__()
        self.check = check
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        words = "Required" if check.required else "Blocks launch" if check.severity is Severity.DANGER else "Look"
        badge = Badge(words, check.severity.value)
        badge.setMinimumWidth(badge.fontMetrics().horizontalAdvance("Blocks launch") + 20)
        layout.addWidget(badge, 0, Qt.AlignmentFlag.AlignTop)
        texts = QVBoxLayout()
        texts.setSpacing(2)
        headline = QLabel(check.headline)
        headline.setWordWrap(True)
        font = headline.font()
        font.setBold(True)
        headline.setFont(font)
        texts.addWidget(headline)
        texts.addWidget(caption(check.details))
        layout.addLayout(texts, 1)
        self.fix_button = plain_button(f"Fix on {STEP_TITLES.get(check.step, check.step)}", None)
        self.fix_button.setAccessibleName(f"{check.headline}: fix it on the {check.step} step")
        self.fix_button.clicked.connect(self.on_fix_clicked)
        layout.addWidget(self.fix_button, 0, Qt.AlignmentFlag.AlignTop)
        self.setAccessibleName(f"{words}: {check.headline}")

    def on_fix_clicked(self) -> None:
        """Asks for the step that fixes the check."""
        self.sig_fix.emit(self.check.step)


class ReviewStep(WizardStep):
    """Shows the run with its checks and Edit links, asks once, and launches it."""

    step_name = "review"
    title = "Review and launch"
    purpose = (
        "Everything about the run on one page, checked before anything is rented. Launch saves it as a "
        "SPEC.toml (the command line can run it again) and starts it; you can close the app while it trains."
    )

    #: Emitted with a step name when the user wants to change that part.
    sig_edit = Signal(str)
    #: Emitted with the run id once the run is launched.
    sig_launched = Signal(str)

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.facts: ReviewFacts | None = None
        self.checks: list[Check] = []
        self.launched_spec: Path | None = None
        self.launched_run: str | None = None
        self._shown = ""  # the draft (as JSON) the facts were last read for
        self._launching = False
        self._task: asyncio.Future[None] | None = None
        self._launch_task: asyncio.Future[None] | None = None
        self._refresh: Running[ReviewFacts] | None = None
        self.sections: dict[str, FactsForm] = {}
        self.edit_buttons: dict[str, object] = {}
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 8, 0)
        layout.setSpacing(12)
        self.launched_banner = self._build_launched()
        layout.addWidget(self.launched_banner)
        layout.addWidget(self._build_checks())
        self.trial_card = TrialCard(lambda: self.draft.model_copy(deep=True), context.store, context.secrets)
        layout.addWidget(self.trial_card)
        for name, heading in SECTIONS:
            layout.addWidget(self._build_section(name, heading))
        layout.addWidget(self._build_export())
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(content)
        self.body.addWidget(scroll, 1)
        self._footer = self._build_launch()

    # -- building ----------------------------------------------------------------------------------------------------

    def _build_launched(self) -> Banner:
        banner = Banner("success")
        self.start_over_button = primary_button("Start &over", "plus", "Start over with a new fine-tune")
        self.start_over_button.clicked.connect(self.on_start_over_clicked)
        banner.add_action(self.start_over_button)
        banner.show_message("success", "")
        return banner

    def _build_checks(self) -> Card:
        card = Card("Before you launch")
        summary = QHBoxLayout()
        self.checks_badge = Badge("Checking", "info")
        self.checks_status = caption("Checking the run…")
        self.checks_status.setAccessibleName("Checks before launching")
        summary.addWidget(self.checks_badge)
        summary.addWidget(self.checks_status, 1)
        card.body.addLayout(summary)
        self.checks_box = QVBoxLayout()
        self.checks_box.setSpacing(2)
        card.body.addLayout(self.checks_box)
        self.check_rows: list[CheckRow] = []
        return card

    def _build_section(self, name: str, heading: str) -> Card:
        card = Card(heading)
        edit = plain_button("Edit", None, f"Edit the {heading.lower()}")
        edit.clicked.connect(lambda _checked=False, step=name: self.sig_edit.emit(step))
        card.add_header_widget(edit)
        form = FactsForm(f"{heading} of the run")
        card.body.addWidget(form)
        self.sections[name], self.edit_buttons[name] = form, edit
        return card

    def _build_export(self) -> Card:
        self.export_card = Card("After training")
        self.export_box = QCheckBox()
        self.export_box.setAccessibleName("Make the model on the machine after training")
        self.export_box.toggled.connect(self.on_export_toggled)
        self.export_words = caption()
        self.export_words.setAccessibleName("Where the fine-tuned model is made")
        self.export_card.body.addWidget(self.export_box)
        self.export_card.body.addWidget(self.export_words)
        self.export_card.body.addWidget(self._build_judge())
        self.export_card.body.addWidget(self._build_serve())
        self.export_card.hide()  # shown once the facts say there is an adapter to merge
        return self.export_card

    def _build_judge(self) -> QWidget:
        box = QWidget()
        column = QVBoxLayout(box)
        column.setContentsMargins(0, 8, 0, 0)
        self.judge_box = QCheckBox()
        self.judge_box.setAccessibleName("Judge base against tuned on the machine before it stops")
        self.judge_box.toggled.connect(self.on_judge_toggled)
        self.judge_words = caption()
        self.judge_words.setAccessibleName("What judging on the machine gives and costs")
        self.judge_words.setWordWrap(True)
        column.addWidget(self.judge_box)
        column.addWidget(self.judge_words)
        return box

    def _show_judge(self) -> None:
        cost = judge_estimate(self.draft, self.facts.sizing) if self.facts else None
        if cost is None:
            return
        self.judge_box.blockSignals(True)  # showing the choice is not making one
        self.judge_box.setText(judge_box_text(self.draft))
        self.judge_box.setChecked(self.draft.judge_on_machine and self.draft.can_judge_on_machine)
        self.judge_box.setEnabled(self.draft.can_judge_on_machine)
        self.judge_box.blockSignals(False)
        self.judge_words.setText(judge_words(self.draft, cost))

    def on_judge_toggled(self, checked: bool) -> None:
        """The user's choice: the machine judges base against tuned before it goes, or it is judged at home."""
        self.draft.judge_on_machine = checked
        self._show_judge()

    def _build_serve(self) -> QWidget:
        box = QWidget()
        column = QVBoxLayout(box)
        column.setContentsMargins(0, 8, 0, 0)
        self.serve_box = QCheckBox("Keep &serving after training: the tuned model answers here, from the machine")
        self.serve_box.setAccessibleName("Keep serving after training")
        self.serve_box.toggled.connect(self.on_serve_toggled)
        row = QHBoxLayout()
        self.serve_idle_spin = QSpinBox()
        self.serve_idle_spin.setRange(1, 1440)
        self.serve_idle_spin.setSuffix(" min")
        self.serve_idle_spin.setAccessibleName("Stop serving after this long without a request")
        self.serve_idle_spin.valueChanged.connect(self.on_serve_idle_changed)
        idle_label = QLabel("Stop after")
        idle_label.setBuddy(self.serve_idle_spin)
        row.addWidget(idle_label)
        row.addWidget(self.serve_idle_spin)
        row.addWidget(QLabel("without a request"))
        row.addStretch(1)
        self.serve_words = caption(
            "An OpenAI-compatible address on this computer (forwarded to the machine over SSH), for any program that "
            "calls an OpenAI API. The machine keeps billing while it serves, shown in the tray and on Costs; Stop on "
            "the monitor ends it at once."
        )
        self.serve_words.setWordWrap(True)
        column.addWidget(self.serve_box)
        column.addLayout(row)
        column.addWidget(self.serve_words)
        return box

    def _show_serve(self) -> None:
        for widget, value in ((self.serve_box, self.draft.serve_after_training),):
            widget.blockSignals(True)
            widget.setChecked(value)
            widget.blockSignals(False)
        self.serve_idle_spin.blockSignals(True)
        self.serve_idle_spin.setValue(round(self.draft.serve_idle_minutes))
        self.serve_idle_spin.blockSignals(False)
        self.serve_idle_spin.setEnabled(self.draft.serve_after_training)

    def on_serve_toggled(self, checked: bool) -> None:
        """The user's choice: the machine serves the tuned model after training, or goes once the adapter is home."""
        self.draft.serve_after_training = checked
        self.serve_idle_spin.setEnabled(checked)

    def on_serve_idle_changed(self, minutes: int) -> None:
        """How long serving waits for a request before it ends (and the machine with it)."""
        self.draft.serve_idle_minutes = float(minutes)

    def _show_export(self) -> None:
        choice = export_choice(self.draft, self.facts.sizing, self.facts.room) if self.facts else None
        self.export_card.setVisible(choice is not None)
        if choice is None:
            return
        self.export_box.blockSignals(True)  # showing the choice is not making one
        self.export_box.setText(export_box_text(self.draft))
        self.export_box.setChecked(bool(choice.outputs))
        self.export_box.blockSignals(False)
        self.export_words.setText(export_choice_words(self.draft, choice))
        self._show_judge()
        self._show_serve()

    def accept_export_proposal(self) -> None:
        """At launch, a proposal the user left as shown (the box ticked) becomes the draft's choice."""
        choice = export_choice(self.draft, self.facts.sizing, self.facts.room) if self.facts else None
        if self.draft.export_on_machine is None and choice is not None and choice.proposed:
            self.draft.export_on_machine = list(choice.outputs)

    def on_export_toggled(self, checked: bool) -> None:
        """The user's choice: the model made on the machine, or at home."""
        self.draft.export_on_machine = list(ON_MACHINE_OUTPUTS) if checked else []
        self._show_export()

    def footer(self) -> QWidget:
        """Launch (and Launch anyway) with what stands in the way, where the other steps have Next."""
        return self._footer

    def _build_launch(self) -> QWidget:
        self.launch_status = caption()
        self.launch_status.setObjectName("launch_status")
        self.launch_status.setAccessibleName("Launch result")
        self.launch_anyway_button = destructive_button(
            "Launch &anyway…", "triangle-alert", "Launch anyway, despite the red items"
        )
        self.launch_anyway_button.clicked.connect(self.on_launch_anyway_clicked)
        self.launch_button = primary_button("&Launch…", "rocket", "Launch the run")
        self.launch_button.clicked.connect(self.on_launch_clicked)
        footer = QWidget()
        row = QHBoxLayout(footer)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.launch_status, 1)
        row.addWidget(self.launch_anyway_button)
        row.addWidget(self.launch_button)
        return footer

    # -- the wizard's hooks ---------------------------------------------------------------------------------------

    def show_draft(self) -> None:
        """Shows the draft; when it changed, reads its facts again in the background (numbers never go stale)."""
        self._show_sections()
        self.trial_card.offer_for(self.draft.objective)
        if self.draft.launched:  # launched before, maybe in an earlier session of the app
            self.launched_run = self.draft.launched_run
            self._show_launched_banner(self.draft.launched_run)
        else:
            self.launched_banner.show_message("success", "")
        if self._draft_json() != self._shown:
            self._task = self._start_refresh().task
        self._update_launch()

    async def load(self) -> None:
        """Reads the facts of the saved draft once when the window opens."""
        await self.refresh()

    def _draft_json(self, draft: RunDraft | None = None) -> str:
        """The draft's choices as JSON: what the facts depend on (not the page, the launch, the export's place)."""
        exclude = {
            "step",
            "launched_run",
            "launched_digest",
            "export_on_machine",
            "serve_after_training",
            "judge_on_machine",
        }
        exclude |= {"serve_idle_minutes"}
        return (draft or self.draft).model_dump_json(exclude=exclude)

    async def refresh(self) -> None:
        """Reads the facts off the UI thread, then shows them and the checks (a newer refresh wins)."""
        await self._start_refresh().wait()

    @property
    def refreshing(self) -> bool:
        """Whether the facts are being read now."""
        return self._refresh is not None and self._refresh.active

    def _start_refresh(self) -> Running[ReviewFacts]:
        snapshot, secrets, store = self.draft.model_copy(deep=True), self.context.secrets, self.context.store
        self._shown = self._draft_json(snapshot)
        self.facts = None
        self.checks_badge.show_state("Checking", "info")
        self.checks_status.setText("Checking the run…")
        self._refresh = Operation(
            self, lambda _job: read_review_facts(snapshot, secrets, store), self._show_facts, group="facts"
        ).run()
        self._update_launch()
        return self._refresh

    def _show_facts(self, facts: ReviewFacts) -> None:
        self._refresh = None  # delivered: its task ends right after this
        self.facts = facts
        self.checks = preflight(self.draft, facts)
        self._show_sections()
        self._show_checks()
        self._update_launch()

    def _show_sections(self) -> None:
        draft, facts = self.draft, self.facts
        self.sections["data"].show_rows(data_rows(draft, facts.manifest if facts else None))
        self.sections["model"].show_rows(model_rows(draft))
        self.sections["sizing"].show_rows(sizing_rows(draft, facts))
        self.sections["compute"].show_rows(compute_rows(draft, facts))
        self._show_export()

    def section_text(self, name: str) -> str:
        """A section's facts as ``label: value`` lines."""
        return self.sections[name].text()

    def _show_checks(self) -> None:
        for row in self.check_rows:
            row.setParent(None)
            row.deleteLater()
        self.check_rows = []
        for check in self.checks:
            row = CheckRow(check)
            row.sig_fix.connect(self.sig_edit)
            self.checks_box.addWidget(row)
            self.check_rows.append(row)
        red = sum(check.severity is Severity.DANGER for check in self.checks)
        amber = len(self.checks) - red
        if not self.checks:
            self.checks_badge.show_state("All clear", "success")
            self.checks_status.setText("Nothing stands in the way of this run.")
            return
        self.checks_badge.show_state(f"{red} red" if red else "No red", "danger" if red else "success")
        parts = [f"{red} to fix before launching" if red else "", f"{amber} worth a look" if amber else ""]
        words = " · ".join(part for part in parts if part)
        self.checks_status.setText(f"{words[:1].upper()}{words[1:]}.")

    # -- launching --------------------------------------------------------------------------------------------------

    @property
    def red_checks(self) -> list[Check]:
        """The checks that block Launch."""
        return [check for check in self.checks if check.severity is Severity.DANGER]

    def _update_launch(self) -> None:
        fresh = self.facts is not None and not self.refreshing and self._shown == self._draft_json()
        launched = self.draft.launched
        red = self.red_checks
        required = any(check.required for check in red)
        idle = fresh and not launched and not self._launching
        self.launch_button.setEnabled(idle and not red)
        self.launch_anyway_button.setVisible(fresh and bool(red) and not required and not launched)
        self.launch_anyway_button.setEnabled(idle)
        if self._launching:
            return
        if launched:
            self.launch_status.setText("Launched. Change something (Edit) to launch another run, or start over.")
        elif not fresh:
            self.launch_status.setText("Checking the run…")
        elif required:
            self.launch_status.setText("Fill in what is marked Required above, then launch.")
        elif red:
            self.launch_status.setText("Red items block Launch: fix them, or choose Launch anyway.")
        else:
            self.launch_status.setText("Ready: Launch asks once more, naming what it rents and costs.")

    def on_launch_clicked(self) -> None:
        """Asks once (machine, rate, estimate, budget), then launches."""
        self._ask_and_launch(anyway=False)

    def on_launch_anyway_clicked(self) -> None:
        """Asks once, naming the red items launched despite, then launches."""
        self._ask_and_launch(anyway=True)

    def _ask_and_launch(self, *, anyway: bool) -> None:
        question = launch_question(self.draft, self.facts, self.red_checks if anyway else [])
        if not confirm_launch(self, question.title, question.summary, question.details, question.action, anyway=anyway):
            self.launch_status.setText("Not launched: nothing was rented or started.")
            return
        self._launch_task = self._run_launch(anyway)

    @asyncSlot(bool)
    async def _run_launch(self, anyway: bool) -> None:
        await self.launch(anyway=anyway)

    async def launch(self, *, anyway: bool = False) -> str | None:
        """Writes SPEC.toml, reads it back as the CLI does, starts the run and copies the spec into its folder.

        Args:
            anyway: Launch despite red checks (a missing part still stops it).

        Returns:
            The new run's id, or None when it could not be launched (the reason is shown).
        """
        self._launching = True
        self._update_launch()
        self.launch_status.setText("Launching…")
        try:
            run_id = await self._launch(anyway)
        except LaunchError as exc:
            self._launch_ended()
            self.launch_status.setText(f"Not launched: {exc}")
            return None
        except BaseException:
            self._launch_ended()
            raise
        self._launching = False
        self._show_launched(run_id)
        self.sig_launched.emit(run_id)
        return run_id

    def _launch_ended(self) -> None:
        self._launching = False
        self._update_launch()

    def _show_launched(self, run_id: str) -> None:
        # Launch stays off for this exact draft, also after the app is reopened: a second click would rent the same
        # run twice. The wizard saves the draft with the launch recorded when sig_launched is emitted.
        self.draft.mark_launched(run_id)
        self.launched_run = run_id
        self._show_launched_banner(run_id)
        self._update_launch()
        self.launch_status.setText(f"Run {run_id} launched.")

    def _show_launched_banner(self, run_id: str) -> None:
        self.launched_banner.show_message(
            "success",
            f"Run {run_id} launched",
            "It trains in the background; the monitor follows it and the Runs page lists it. Start over for "
            "another fine-tune: your prepared data and your machine setup stay, everything else starts fresh.",
        )

    async def _launch(self, anyway: bool) -> str:
        if self._shown != self._draft_json() or self.facts is None:
            await self.refresh()  # never launch on checks made for another draft
        blockers = [check for check in self.red_checks if check.required or not anyway]
        if blockers:
            first = blockers[0]
            extra = "" if first.required else " (or choose Launch anyway)"
            raise LaunchError(f"{first.headline}. {first.details}{extra}")
        self.accept_export_proposal()
        path, spec = await off_ui_thread(self, write_launch_spec, self.draft.model_copy(deep=True), self.facts)
        try:
            record = await self.context.manager.launch_in_background(spec)
        except RunError as exc:
            raise LaunchError(f"{exc}. Fix it with the matching Edit button and launch again") from exc
        self.launched_spec = path
        folder = self.context.manager.engine(record.id).folder(record.id)
        try:
            await off_ui_thread(self, atomic_copy, path, folder / SPEC_NAME)
        except OSError as exc:  # the run is launched; only the copy beside it is missing
            _log.warning("could not copy %s into the run folder %s: %s", path, folder, exc)
        _log.info("launched run %s from %s", record.id, path)
        return record.id

    def on_start_over_clicked(self) -> None:
        """A fresh draft for the next fine-tune (the data and the machine setup kept), from the Data step."""
        fresh = fresh_draft(self.draft)
        for name in RunDraft.model_fields:
            setattr(self.draft, name, getattr(fresh, name))
        self.launched_run = None
        self.launched_banner.show_message("success", "")
        self.sig_edit.emit("data")
