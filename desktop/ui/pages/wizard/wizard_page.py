"""The New fine-tune page: the wizard's steps with Back / Next, validated and saved as the user goes.

The step indicator at the top is clickable: backwards always, forwards to a step already reached (each step on
the way must be complete). Enter advances like Next when the step is complete, except in a number field, a list to
choose from or a filter, where it takes what was typed or chosen there and stays; Back sits at the left and Next,
the primary action, at the right, always in the same places.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStackedWidget,
    QWidget,
)

from desktop.services.platform.logs import get_logger
from desktop.services.runs.drafts import save_draft
from desktop.ui.context import AppContext
from desktop.ui.design.icons import tint
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.wizard.step_base import StepProblem, WizardStep, takes_enter
from desktop.ui.widgets.blocks import plain_button, primary_button, set_role

_log = get_logger("ui.wizard")
_ENTER_KEYS = {Qt.Key.Key_Return, Qt.Key.Key_Enter}


class StepIndicator(QWidget):
    """The wizard's steps in a row: the current one marked, done ones ticked, those not reached yet disabled."""

    #: Emitted with the index of the step the user clicked.
    sig_step_clicked = Signal(int)

    def __init__(self, titles: list[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("wizard_steps")
        self.setAccessibleName("Wizard steps")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(4)
        self.buttons: list[QPushButton] = []
        for index, title in enumerate(titles):
            button = QPushButton(f"{index + 1}  {title}")
            set_role(button, "step")
            button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            button.clicked.connect(lambda _checked=False, i=index: self.sig_step_clicked.emit(i))
            self.buttons.append(button)
            row.addWidget(button)
            if index < len(titles) - 1:
                arrow = QLabel()
                tint(arrow, "chevron-right", "text_muted", 14)
                row.addWidget(arrow)
        row.addStretch(1)
        self._titles = titles

    def show_state(self, current: int, reached: int) -> None:
        """Marks ``current``; steps up to ``reached`` can be clicked, later ones cannot."""
        for index, button in enumerate(self.buttons):
            state = "current" if index == current else ("done" if index < reached else "ahead")
            button.setProperty("state", state)
            button.setEnabled(index <= reached)
            button.style().unpolish(button)
            button.style().polish(button)
            status = {"current": "current step", "done": "reached", "ahead": "not reached yet"}[state]
            button.setAccessibleName(f"Step {index + 1}: {self._titles[index]}, {status}")


class WizardPage(BasePage):
    """Hosts the wizard's steps in order; each is checked before moving on and the draft is saved on every move."""

    page_name = "new"
    title = "New fine-tune"
    icon_name = "wand-sparkles"
    scrolls = False
    purpose = "From a dataset to a running fine-tune, one step at a time. Your choices are kept if you leave."

    #: Emitted with the run id when the review step has launched a run.
    sig_run_launched = Signal(str)

    def __init__(self, context: AppContext, steps: list[WizardStep], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = context
        self.steps = steps
        self._build(steps)
        self.sig_run_launched.connect(lambda _run_id: self._persist())  # the launch is part of the draft now
        start = next((i for i, s in enumerate(steps) if s.step_name == context.draft.step), 0)
        self.reached = start  # a reopened wizard continues where it was, with the steps before it reached
        self._enter(start, save=False)  # opening the window changes nothing worth writing

    def _build(self, steps: list[WizardStep]) -> None:
        self.indicator = StepIndicator([step.title for step in steps])
        self.indicator.sig_step_clicked.connect(self.on_step_clicked)
        self.stack = QStackedWidget()
        for step in steps:
            self.stack.addWidget(step)
            step.sig_changed.connect(self.on_step_changed)
            step.sig_go_to.connect(self.go_to)
        self.back_button = plain_button("&Back", "chevron-left", "Back to the previous step")
        self.next_button = primary_button("&Next", None, "Next step")
        self.next_button.setDefault(True)
        self.back_button.clicked.connect(self.on_back)
        self.next_button.clicked.connect(self.on_next)
        buttons = QHBoxLayout()
        buttons.addWidget(self.back_button)
        # Stretch 0: it fills the row where a step has no footer, and leaves a footer's words all the room it has.
        buttons.addStretch(0)
        self.footers = {step.step_name: step.footer() for step in steps}
        for footer in self.footers.values():
            if footer is not None:
                footer.hide()
                buttons.addWidget(footer, 1)
        buttons.addWidget(self.next_button)
        self.body.addWidget(self.indicator)
        self.body.addWidget(self.stack, 1)
        self.body.addLayout(buttons)

    @property
    def current(self) -> WizardStep:
        """The step on screen."""
        return self.steps[self.stack.currentIndex()]

    @property
    def problem_label(self) -> QLabel:
        """The headline of what blocks the step on screen (its banner's first line)."""
        return self.current.problem_banner.headline_label

    def step(self, name: str) -> WizardStep:
        """The step called ``name``.

        Raises:
            KeyError: No such step.
        """
        for candidate in self.steps:
            if candidate.step_name == name:
                return candidate
        raise KeyError(name)

    def show_step(self, name: str) -> None:
        """Jumps to a step (used by ``--page`` and the review page's Edit links); no validation."""
        self._collect_current()
        self._enter(self.steps.index(self.step(name)))

    def go_to(self, name: str, setting: str = "") -> None:
        """Shows the step called ``name`` with the field for ``setting`` focused (a banner's "Change…" button)."""
        self.show_step(name)
        if setting:
            self.current.focus_field(setting)

    def _enter(self, index: int, *, save: bool = True) -> None:
        self.stack.setCurrentIndex(index)
        self.reached = max(self.reached, index)
        self.indicator.show_state(index, self.reached)
        step = self.steps[index]
        step.show_problem(None)
        step.show_draft()
        self.context.draft.step = step.step_name
        self.back_button.setEnabled(index > 0)
        self.next_button.setVisible(index < len(self.steps) - 1)
        for name, footer in self.footers.items():
            if footer is not None:
                footer.setVisible(name == step.step_name)
        if save:
            self._persist()  # a reopened app continues on this step

    def _collect_current(self) -> None:
        """Copies the step on screen into the draft; :meth:`_enter` then saves it with the new step, once."""
        self.current.save_into(self.context.draft)

    def _persist(self) -> None:
        if self.context.read_only:
            return  # a screenshot render must never change what the user saved
        try:
            save_draft(self.context.draft)
        except OSError as exc:
            _log.warning("could not save the wizard draft: %s", exc)
            self.current.show_problem(
                StepProblem(
                    "Your choices could not be saved",
                    f"{exc.strerror or 'The disk refused the file'}. Check that the disk has space; the wizard "
                    "keeps your choices until you close the app.",
                ),
                focus=False,
            )

    def on_step_changed(self) -> None:
        """Keeps the step's banner true to its state (hidden once the user fixed what it said)."""
        step = self.sender()
        if isinstance(step, WizardStep):
            step.refresh_problem()

    def on_next(self) -> None:
        """Checks the step; moves on when it is complete, or shows what to fix and where."""
        self._advance(self.stack.currentIndex() + 1)

    def _advance(self, target: int) -> bool:
        """Moves forward to ``target`` if every step on the way is complete; shows the first problem otherwise."""
        index = self.stack.currentIndex()
        target = min(target, len(self.steps) - 1)
        if target <= index:
            return False
        while index < target:
            problem = self.steps[index].step_problem()
            if problem is not None:
                if index != self.stack.currentIndex():
                    self._collect_current()
                    self._enter(index)
                self.steps[index].show_problem(problem)
                return False
            index += 1
        self._collect_current()
        self._enter(target)
        self.current.setFocus(Qt.FocusReason.TabFocusReason)
        self.current.focusNextChild()
        return True

    def on_back(self) -> None:
        """Goes one step back, keeping what was entered."""
        self._collect_current()
        self._enter(max(self.stack.currentIndex() - 1, 0))

    def on_step_clicked(self, index: int) -> None:
        """A click in the step indicator: backwards always; forwards through complete steps only."""
        if index < self.stack.currentIndex():
            self._collect_current()
            self._enter(index)
        elif index > self.stack.currentIndex() and index <= self.reached:
            self._advance(index)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter presses a focused button, or else advances like Next when the step is complete.

        In a number field, a list or a filter Enter only takes what is there (a number out of range is corrected and
        said beside it): a user pressing Enter to apply a filter must not find the wizard on another step.
        """
        if event.key() not in _ENTER_KEYS or event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            super().keyPressEvent(event)
            return
        event.accept()
        focused = QApplication.focusWidget()
        if isinstance(focused, QAbstractButton) and focused is not self.next_button and self.isAncestorOf(focused):
            focused.click()
        elif takes_enter(focused):
            return
        elif self.next_button.isVisible() and not self.current.busy:
            self.on_next()

    async def load(self) -> None:
        """Lets every step fetch what it shows (catalogs, reports) concurrently."""
        await asyncio.gather(*(step.load() for step in self.steps))
