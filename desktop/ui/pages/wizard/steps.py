"""The wizard's steps in order."""

from __future__ import annotations

from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.compute_step import ComputeStep
from desktop.ui.pages.wizard.data_step import DataStep
from desktop.ui.pages.wizard.model_step import ModelStep
from desktop.ui.pages.wizard.review_step import ReviewStep
from desktop.ui.pages.wizard.sizing_step import SizingStep
from desktop.ui.pages.wizard.step_base import WizardStep


def wizard_steps(context: AppContext) -> list[WizardStep]:
    """Builds the steps: data → model and method → sizing → compute (rent or own server) → review and launch."""
    return [DataStep(context), ModelStep(context), SizingStep(context), ComputeStep(context), ReviewStep(context)]
