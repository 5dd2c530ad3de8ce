"""The New fine-tune page: the wizard's steps with Back / Next, validated and saved as the user goes."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QPushButton, QStackedWidget, QWidget

from desktop.services.platform.logs import get_logger
from desktop.services.runs.drafts import save_draft
from desktop.ui.context import AppContext
from desktop.ui.pages.base import BasePage
from desktop.ui.pages.wizard.step_base import WizardStep

_log = get_logger("ui.wizard")


class WizardPage(BasePage):
    """Hosts the wizard's steps in order; each validates before Next and the draft is saved on every move."""

    page_name = "new"
    title = "New fine-tune"
    icon_name = "wand-sparkles"
    scrolls = False
    purpose = "From a chat dataset to a running fine-tune, one step at a time. Your choices are kept if you leave."

    #: Emitted with the run id when the review step has launched a run.
    sig_run_launched = Signal(str)

    def __init__(self, context: AppContext, steps: list[WizardStep], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = context
        self.steps = steps
        self._build(steps)
        start = next((i for i, s in enumerate(steps) if s.step_name == context.draft.step), 0)
        self._enter(start, save=False)  # opening the window changes nothing worth writing

    def _build(self, steps: list[WizardStep]) -> None:
        self.step_list = QListWidget()
        self.step_list.setAccessibleName("Wizard steps")
        self.step_list.setFlow(QListWidget.Flow.LeftToRight)
        self.step_list.setFixedHeight(self.step_list.fontMetrics().height() * 2 + 12)
        self.step_list.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.step_list.setSelectionMode(QListWidget.SelectionMode.NoSelection)
        self.stack = QStackedWidget()
        for number, step in enumerate(steps, start=1):
            self.step_list.addItem(f"{number}. {step.title}   ")
            self.stack.addWidget(step)
            step.sig_changed.connect(self.on_step_changed)
        self.problem_label = QLabel()
        self.problem_label.setObjectName("wizard_problem")
        self.problem_label.setWordWrap(True)
        self.problem_label.setAccessibleName("What to fix before going on")
        self.back_button = QPushButton("&Back")
        self.back_button.setAccessibleName("Back to the previous step")
        self.next_button = QPushButton("&Next")
        self.next_button.setAccessibleName("Next step")
        self.next_button.setDefault(True)
        self.back_button.clicked.connect(self.on_back)
        self.next_button.clicked.connect(self.on_next)
        buttons = QHBoxLayout()
        buttons.addWidget(self.problem_label, 1)
        buttons.addWidget(self.back_button)
        buttons.addWidget(self.next_button)
        self.body.addWidget(self.step_list)
        self.body.addWidget(self.stack, 1)
        self.body.addLayout(buttons)

    @property
    def current(self) -> WizardStep:
        """The step on screen."""
        return self.steps[self.stack.currentIndex()]

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

    def _enter(self, index: int, *, save: bool = True) -> None:
        self.stack.setCurrentIndex(index)
        for row in range(self.step_list.count()):
            item = self.step_list.item(row)
            font = item.font()
            font.setBold(row == index)
            item.setFont(font)
        step = self.steps[index]
        step.show_draft()
        self.context.draft.step = step.step_name
        self.back_button.setEnabled(index > 0)
        self.next_button.setVisible(index < len(self.steps) - 1)
        self.problem_label.clear()
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
            self.problem_label.setText(f"Your choices could not be saved ({exc}); check the disk has space.")

    def on_step_changed(self) -> None:
        """Clears a stale problem once the user changes something."""
        self.problem_label.clear()

    def on_next(self) -> None:
        """Validates the step; moves on when it is complete, or says what to fix."""
        problem = self.current.validate()
        if problem:
            self.problem_label.setText(problem)
            return
        self._collect_current()
        self._enter(min(self.stack.currentIndex() + 1, len(self.steps) - 1))
        self.current.setFocus(Qt.FocusReason.TabFocusReason)
        self.current.focusNextChild()

    def on_back(self) -> None:
        """Goes one step back, keeping what was entered."""
        self._collect_current()
        self._enter(max(self.stack.currentIndex() - 1, 0))

    async def load(self) -> None:
        """Lets every step fetch what it shows (catalogs, reports) concurrently."""
        await asyncio.gather(*(step.load() for step in self.steps))
