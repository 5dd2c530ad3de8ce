"""Review's "Try it here first" card: a trial on this computer before anything is rented.

It says where the trial would run (or why it cannot), trains on a click with the loss drawn as it falls and a Stop,
then shows what it proved: the loss, this computer's speed and memory, and the adapter's first answers beside the
data's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from PySide6.QtWidgets import QHBoxLayout, QLabel

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import RunSpecError
from desktop.core.runs.trial import TrialResult, TrialStep
from desktop.core.sizing.architecture import ArchitectureError
from desktop.services.local.common import LocalToolError
from desktop.services.local.toolenv import local_python
from desktop.services.models.configs import ModelResolutionError, hub_config_fetcher
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.store import RunStore
from desktop.services.trial.errors import TrialError
from desktop.services.trial.prepare import PreparedTrial, prepare_draft_trial
from desktop.services.trial.runner import TrialWatch, run_trial
from desktop.ui.background import off_ui_thread, spawn
from desktop.ui.widgets.blocks import Card, caption, plain_button
from desktop.ui.widgets.loss_chart import LossChart

#: The trial's line before it runs.
IDLE_WORDS = "Trains a slice of your data on this computer; nothing is rented."


def not_tried_words(objective: str) -> str:
    """Why a run of another objective than SFT is not tried here."""
    if objective == "cpt":
        return (
            "A trial here tries fine-tunes on conversations. Continued pre-training is watched on the machine "
            "instead: its loss on your text falls in the first steps, and the held-out perplexity is said at the end."
        )
    return (
        f"A trial here tries fine-tunes on conversations. A {objective.upper()} run on preference pairs is watched on "
        "the machine instead: its first steps show whether the chosen answers win more often."
    )


SUBTITLE = (
    "A few dozen steps on a slice of your data, here and free, before anything is rented: the loss must fall on "
    "your chat template and labels, and the first answers show what it learnt."
)
_PROBLEMS = (RunSpecError, TrialError, LocalToolError, ModelResolutionError, ArchitectureError, OSError)


def result_words(result: TrialResult) -> str:
    """The verdict: did the loss fall, from what to what, in how many steps."""
    start, end = result.loss_start, result.loss_end
    if start is None or end is None:
        return "The trial reported no loss: its log is in the trials folder."
    if result.loss_falls:
        steps = len(result.steps)
        return f"The loss fell from {start:.3f} to {end:.3f} in {steps} steps: the template and labels train."
    return (
        f"The loss did not fall ({start:.3f} to {end:.3f} in {len(result.steps)} steps): check the chat template and "
        "the labels on the Data step before renting."
    )


def measured_words(result: TrialResult) -> str:
    """This computer's measured speed and memory, and where the adapter is listed."""
    speed = f"{result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else "speed not measured"
    peak = result.peak_memory_gb
    memory = f", peak memory {peak:.2f} GB" if peak and peak < 1 else f", peak memory {peak:.1f} GB" if peak else ""
    return (
        f"{result.backend.label[:1].upper()}{result.backend.label[1:]}: {speed}{memory}. The adapter is listed on "
        f"Models as run {result.run_id}: export it there to chat with it."
    )


def answer_words(result: TrialResult) -> str:
    """The first answers, each beside the data's."""
    return "\n\n".join(
        f"Asked: {a.prompt}\nThe data: {a.expected}\nThe trial's adapter: {a.answer or '(an empty answer)'}"
        for a in result.answers
    )


class TrialCard(Card):
    """Plans and runs a trial of the wizard's draft on this computer, showing its loss and what it proved.

    Args:
        draft_of: The draft as it is now.
        store: Where the trial's run is recorded.
        secrets: The Hugging Face token for a gated base model (None: the environment's only).
    """

    def __init__(self, draft_of: Callable[[], RunDraft], store: RunStore, secrets: SecretStore | None = None) -> None:
        super().__init__("Try it here first", SUBTITLE)
        self.draft_of, self.store, self.secrets = draft_of, store, secrets
        self.task: asyncio.Task[None] | None = None
        self.result: TrialResult | None = None
        self.status_label = caption(IDLE_WORDS)
        self.status_label.setWordWrap(True)
        self.status_label.setAccessibleName("Trial status")
        self.try_button = plain_button("Try it here first", "play", "Try the run on this computer first")
        self.try_button.clicked.connect(self.on_try_clicked)
        self.stop_button = plain_button("Stop trial", "square", "Stop the trial")
        self.stop_button.clicked.connect(self.on_stop_clicked)
        self.stop_button.hide()
        row = QHBoxLayout()
        row.addWidget(self.status_label, 1)
        row.addWidget(self.stop_button)
        row.addWidget(self.try_button)
        self.body.addLayout(row)
        self.chart = LossChart()
        self.chart.hide()
        self.body.addWidget(self.chart)
        self.verdict_label, self.measured_label, self.answers_label = QLabel(), caption(), QLabel()
        for label in (self.verdict_label, self.measured_label, self.answers_label):
            label.setWordWrap(True)
            label.hide()
            self.body.addWidget(label)
        font = self.verdict_label.font()
        font.setBold(True)
        self.verdict_label.setFont(font)
        self._steps: list[TrialStep] = []
        self._planned_steps = 0
        self._objective = "sft"

    def offer_for(self, objective: str) -> None:
        """Offers the trial for a chat fine-tune; a preference run (DPO, ORPO) says why it is not tried here."""
        if self.running or objective == self._objective:
            return
        self._objective = objective
        chats = objective == "sft"
        self.try_button.setEnabled(chats)
        if self.result is None:
            self.status_label.setText(IDLE_WORDS if chats else not_tried_words(objective))

    @property
    def running(self) -> bool:
        """Whether a trial is being planned or trained now."""
        return self.task is not None and not self.task.done()

    def on_try_clicked(self) -> None:
        """Plans the trial for the draft as it is and runs it (off the UI thread where it blocks)."""
        if not self.running:
            self._start()
            self.task = spawn(self._try())

    def on_stop_clicked(self) -> None:
        """Stops the trial: its trainer ends, nothing is recorded."""
        if self.task is not None:
            self.task.cancel()

    async def _try(self) -> None:
        try:
            fetch = hub_config_fetcher(self.secrets)
            prepared = await off_ui_thread(self, prepare_draft_trial, self.draft_of(), fetch)
            if not prepared.plan.possible:
                self._end(f"{prepared.plan.reason[:1].upper()}{prepared.plan.reason[1:]}.")
                return
            result = await self._train(prepared)
        except asyncio.CancelledError:
            self._end("Trial stopped: nothing was kept.")
            raise
        except _PROBLEMS as exc:
            self._end(f"The trial could not run: {exc}")
            return
        self._show_result(result)

    async def _train(self, prepared: PreparedTrial) -> TrialResult:
        self._planned_steps = prepared.plan.steps
        self.stop_button.show()
        watch = TrialWatch(self.on_step, self.on_phase)
        python = str(await off_ui_thread(self, local_python))
        return await run_trial(
            prepared.spec,
            prepared.plan,
            python=python,
            store=self.store,
            watch=watch,
            folder=prepared.folder,
            secrets=self.secrets,
        )

    def _start(self) -> None:
        self.result, self._steps = None, []
        self.try_button.setEnabled(False)
        self.status_label.setText("Planning the trial…")
        for label in (self.verdict_label, self.measured_label, self.answers_label):
            label.hide()
        self.chart.clear()
        self.chart.hide()

    def _end(self, words: str) -> None:
        self.status_label.setText(words)
        self.try_button.setEnabled(True)
        self.stop_button.hide()

    def on_phase(self, words: str) -> None:
        """Shows what the trial does now."""
        self.status_label.setText(f"{words[:1].upper()}{words[1:]}…")

    def on_step(self, step: TrialStep) -> None:
        """Draws a step's loss as it comes."""
        self._steps.append(step)
        self.chart.show()
        steps = [s.step for s in self._steps]
        self.chart.show_points(steps, [s.loss for s in self._steps], [], [], self._planned_steps)
        speed = f", {step.tokens_per_s:,.0f} tokens/s" if step.tokens_per_s else ""
        self.status_label.setText(f"Step {step.step} of {self._planned_steps}: loss {step.loss:.3f}{speed}")

    def _show_result(self, result: TrialResult) -> None:
        self.result = result
        self._end("Trial done: nothing was rented.")
        self.verdict_label.setText(result_words(result))
        self.measured_label.setText(measured_words(result))
        self.answers_label.setText(answer_words(result))
        for label in (self.verdict_label, self.measured_label):
            label.show()
        self.answers_label.setVisible(bool(result.answers))
