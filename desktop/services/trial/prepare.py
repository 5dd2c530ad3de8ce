"""A trial of the wizard's draft: the draft written as the trial's SPEC.toml, read back, and planned for here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from desktop.core.runs.draft import RunDraft
from desktop.core.runs.spec import RunSpec
from desktop.core.runs.trial import DEFAULT_SLICE, DEFAULT_STEPS, TrialBackend, TrialPlan
from desktop.services.models.configs import ConfigFetcher
from desktop.services.runs.drafts import write_spec_toml
from desktop.services.runs.spec_file import read_run_spec
from desktop.services.trial.data import count_rows
from desktop.services.trial.errors import TrialError
from desktop.services.trial.machine import this_machine
from desktop.services.trial.planning import plan_for_spec
from desktop.services.trial.runner import new_trial_folder


@dataclass(frozen=True)
class PreparedTrial:
    """A trial ready to run: its folder (with its SPEC.toml), the run it tries, and where it runs."""

    folder: Path
    spec: RunSpec
    plan: TrialPlan


def plan_here(
    spec: RunSpec,
    *,
    steps: int = DEFAULT_STEPS,
    share: float = DEFAULT_SLICE,
    backend: TrialBackend | None = None,
    fetch: ConfigFetcher | None = None,
) -> TrialPlan:
    """Where ``spec``'s trial runs on this computer (blocking: counts the chats, may read the model's config).

    Raises:
        TrialError: The training data cannot be read, or the run's objective is not one a trial tries.
        ModelResolutionError: The base model cannot be found.
        ArchitectureError: Its config cannot be sized.
    """
    objective = spec.training.get("objective", "sft")
    if objective != "sft":
        raise TrialError(
            f'a trial on this computer tries chat fine-tunes (objective "sft"); this spec\'s objective is '
            f'"{objective}": check its data with rentune data check, then rent the run (rentune run)'
        )
    rows = count_rows(spec.train_file)
    return plan_for_spec(spec, this_machine(), rows, steps=steps, share=share, backend=backend, fetch=fetch)


def prepare_draft_trial(draft: RunDraft, fetch: ConfigFetcher | None = None) -> PreparedTrial:
    """Writes the draft as the trial's SPEC.toml in a new trial folder, reads it back and plans it (blocking).

    Raises:
        RunSpecError: The draft is not a complete run yet (the message names what is missing).
        TrialError: Its training data cannot be read.
        ModelResolutionError: Its base model cannot be found.
        ArchitectureError: The base model's config cannot be sized.
    """
    folder = new_trial_folder()
    spec = read_run_spec(write_spec_toml(draft, folder / "SPEC.toml"))
    return PreparedTrial(folder, spec, plan_here(spec, fetch=fetch))
