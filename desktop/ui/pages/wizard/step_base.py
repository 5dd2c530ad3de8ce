"""What every page of the new-run wizard has in common.

A purpose line, a banner for what blocks Next, a body that scrolls vertically inside the page's column, and the
field that fixes a problem marked and focused.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QFrame, QScrollArea, QVBoxLayout, QWidget

from desktop.core.runs.draft import RunDraft
from desktop.ui.context import AppContext
from desktop.ui.design.palette import METRICS
from desktop.ui.widgets.blocks import Banner, caption, plain_button


@dataclass(frozen=True)
class StepProblem:
    """Why the wizard may not move on: a headline, what to do, and where to fix it.

    Attributes:
        headline: The problem in a few words.
        details: What to do about it.
        field: The widget on this step that fixes it (marked red and focused), if any.
        step: Another step that fixes it ("" for this one); the banner then offers a button to go there.
        setting: The field on that step (a training key, ``base_model``...), see :meth:`WizardStep.focus_field`.
        action: The label of that button ("Change the model").
    """

    headline: str
    details: str = ""
    field: QWidget | None = None
    step: str = ""
    setting: str = ""
    action: str = ""

    @property
    def text(self) -> str:
        """Headline and details as one paragraph."""
        headline = self.headline.rstrip(".") + "."
        return f"{headline} {self.details}".strip()


def enter_applies_here(widget: QWidget) -> None:
    """Marks ``widget`` (a filter) as one where Enter applies what was typed and never moves the wizard on."""
    widget.setProperty("enter_applies", True)


def takes_enter(widget: QWidget | None) -> bool:
    """Whether Enter in ``widget`` only takes what is there: a number field, a list to choose from, a filter."""
    if widget is None:
        return False
    return isinstance(widget, (QAbstractSpinBox, QComboBox)) or bool(widget.property("enter_applies"))


def mark_invalid(widget: QWidget, invalid: bool) -> None:
    """Styles a field red (the stylesheet's ``invalid="true"``) or back to normal."""
    if bool(widget.property("invalid")) == invalid:
        return
    widget.setProperty("invalid", "true" if invalid else None)
    widget.style().unpolish(widget)
    widget.style().polish(widget)


class WizardStep(QWidget):
    """One page of the wizard.

    The wizard calls :meth:`show_draft` when the step is entered, :meth:`step_problem` before Next (a problem blocks the
    move and is shown in the step's banner, its field marked), and :meth:`save_into` to copy the step's choices
    into the draft, which it then saves to disk. ``sig_changed`` tells the wizard to re-check what blocks Next;
    ``sig_go_to`` asks it to show another step with one of its fields focused (a banner's "Change the model").

    Steps either override :meth:`step_problem` (a :class:`StepProblem` with its field) or, more simply,
    :meth:`validate` (a sentence).
    """

    #: Name used by ``rentune --screenshot --page NAME``.
    step_name = ""
    #: Short label in the wizard's step list.
    title = ""
    #: One sentence saying what the step is for.
    purpose = ""

    sig_changed = Signal()
    #: (step name, setting): show that step and focus the field for that setting.
    sig_go_to = Signal(str, str)

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = context
        self._marked_fields: list[QWidget] = []
        self._banner_problem: StepProblem | None = None
        self.setObjectName(f"{self.step_name}_step")
        self.setAccessibleName(f"{self.title} step")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(METRICS.gap - 4)
        if self.purpose:
            outer.addWidget(caption(self.purpose))
        outer.addWidget(self._build_banner())
        outer.addWidget(self._build_scroll(), 1)

    def _build_banner(self) -> Banner:
        self.problem_banner = Banner("danger")
        self.problem_banner.setObjectName(f"{self.step_name}_problem")
        self.problem_action = plain_button("Go there", None, "Go to the step that fixes this")
        self.problem_action.clicked.connect(self._on_problem_action)
        self.problem_action.hide()
        self.problem_banner.add_action(self.problem_action)
        return self.problem_banner

    def _build_scroll(self) -> QScrollArea:
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll_area.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        content = QWidget()
        content.setObjectName(f"{self.step_name}_content")
        self.body = QVBoxLayout(content)
        self.body.setContentsMargins(0, 0, 6, 0)
        self.body.setSpacing(METRICS.gap - 4)
        self.scroll_area.setWidget(content)
        return self.scroll_area

    @property
    def draft(self) -> RunDraft:
        """The wizard's shared draft."""
        return self.context.draft

    def footer(self) -> QWidget | None:
        """Actions the wizard shows in Next's place while this step is on screen (the review's Launch); None for none.

        The wizard asks once, when it is built, and owns the widget from then on.
        """
        return None

    @property
    def busy(self) -> bool:
        """Whether the step is still working out something Next depends on (Enter then waits instead of warning)."""
        return False

    def show_draft(self) -> None:
        """Fills the widgets from the draft (called every time the step is entered)."""

    def validate(self) -> str | None:
        """Returns why the wizard may not move on yet (what to fix), or None when the step is complete."""
        problem = type(self).step_problem is not WizardStep.step_problem and self.step_problem()
        return problem.text if problem else None

    def step_problem(self) -> StepProblem | None:
        """What blocks Next, with the field that fixes it; None when the step is complete."""
        text = self.validate()
        return StepProblem(text) if text else None

    def save_into(self, draft: RunDraft) -> None:
        """Copies the widgets' values into ``draft``."""

    async def load(self) -> None:
        """Fetches what the step shows without blocking the UI; called once when the window opens."""

    def focus_field(self, setting: str) -> None:
        """Shows and focuses the field for ``setting`` (asked by another step's banner); unknown settings do nothing."""

    # -- the banner -------------------------------------------------------------------------------------------------

    @property
    def shown_problem(self) -> StepProblem | None:
        """The problem the banner shows now (None when hidden)."""
        return self._banner_problem

    def show_problem(self, problem: StepProblem | None, *, focus: bool = True) -> None:
        """Shows ``problem`` in the banner and marks its field red (focusing it); None hides the banner.

        Args:
            problem: What blocks Next, or None.
            focus: Move the keyboard focus to the field that fixes it.
        """
        self._banner_problem = problem
        for widget in self._marked_fields:
            mark_invalid(widget, False)
        self._marked_fields = []
        if problem is None:
            self.problem_banner.show_message("danger", "")
            return
        self.problem_banner.show_message("danger", problem.headline, problem.details)
        self.problem_action.setText(problem.action or "Go there")
        self.problem_action.setAccessibleName(problem.action or f"Go to the {problem.step} step")
        self.problem_action.setVisible(bool(problem.step))
        if problem.field is not None:
            mark_invalid(problem.field, True)
            problem.field.setAccessibleDescription(problem.text)
            self._marked_fields.append(problem.field)
            if focus:
                self.scroll_area.ensureWidgetVisible(problem.field)
                problem.field.setFocus(Qt.FocusReason.OtherFocusReason)

    def refresh_problem(self) -> None:
        """Keeps a shown banner true to the step's state: updated, or hidden once fixed (the focus stays put)."""
        if self._banner_problem is not None:
            self.show_problem(self.step_problem(), focus=False)

    def _on_problem_action(self) -> None:
        if self._banner_problem is not None and self._banner_problem.step:
            self.sig_go_to.emit(self._banner_problem.step, self._banner_problem.setting)
