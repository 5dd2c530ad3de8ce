"""Words about runs that the monitor and the runs list share: states, their colours, money, machines."""

from __future__ import annotations

from typing import Any

from desktop.core.runs.states import RunState
from desktop.services.billing.records import RunRow
from desktop.services.billing.rentals import compute_of, rental_of
from desktop.services.providers.base import ProviderName
from desktop.services.runs.snapshot import RunSnapshot
from desktop.ui.cost_words import rate

#: A state as a word for people (a phase chip, a badge).
STATE_WORDS = {
    RunState.PLANNED: "Waiting",
    RunState.PROVISIONING: "Renting",
    RunState.CONNECTING: "Connecting",
    RunState.UPLOADING: "Uploading",
    RunState.BOOTSTRAPPING: "Setting up",
    RunState.TRAINING: "Training",
    RunState.SYNCING: "Saving",
    RunState.PULLING: "Bringing home",
    RunState.SERVING: "Serving",
    RunState.FINISHED: "Finished",
    RunState.PAUSED: "Paused",
    RunState.FAILED: "Failed",
    RunState.CANCELLED: "Stopped",
}
#: The badge colour of each state: good, needs a look, broken; live runs are neutral.
STATE_SEVERITY = {
    RunState.FINISHED: "success",
    RunState.PAUSED: "warning",
    RunState.CANCELLED: "warning",
    RunState.FAILED: "danger",
}


def phase_word(state: RunState, rented: bool = False) -> str:
    """A phase's name; a rented run waits for its machine while planned, so that phase is its renting."""
    if state is RunState.PLANNED and rented:
        return "Renting"
    return STATE_WORDS[state]


def state_badge(record: RunRow) -> tuple[str, str]:
    """The run's state as a badge: its words and its severity."""
    words = phase_word(record.state, is_rented(record))
    if record.state is RunState.CANCELLED and record.spec.get("budget_stop"):
        words = "Stopped at budget"
    elif record.state is RunState.CANCELLED and record.spec.get("overrun_stop"):
        words = "Stopped: over its estimate"
    return words, STATE_SEVERITY.get(record.state, "info")


def is_rented(record: RunRow) -> bool:
    """Whether the run trains on machines rented for it (rather than on the user's own server)."""
    return compute_of(record) is not None


def provider_word(name: str) -> str:
    """A provider's name as users know it (``runpod`` is RunPod); an unknown one as it was given."""
    try:
        return ProviderName(name).label
    except ValueError:
        return name


def method_word(method: str) -> str:
    """A training method as the wizard names it."""
    return {"qlora": "QLoRA", "lora": "LoRA", "full": "Full fine-tune", "full-8bit": "Full fine-tune (8-bit)"}.get(
        method, method
    )


#: How a run's objective other than SFT follows its method: ``LoRA · DPO``.
_OBJECTIVE_NAMES = {"dpo": "DPO", "orpo": "ORPO", "cpt": "continued pre-training"}


def training_words(spec: dict[str, Any]) -> str:
    """A run's method, and its objective when it is not fine-tuning on chats: ``QLoRA``, ``LoRA · DPO``."""
    found = spec.get("training")
    training: dict[str, Any] = found if isinstance(found, dict) else {}
    method = method_word(str(training.get("method", "qlora")))
    objective = _OBJECTIVE_NAMES.get(str(training.get("objective", "sft")))
    return f"{method} · {objective}" if objective else method


def resume_question(snapshot: RunSnapshot) -> tuple[str, str] | None:
    """The question before a resume that spends money on a new machine (None: resuming rents nothing)."""
    record = snapshot.record
    if not is_rented(record) or rental_of(record) is not None:
        return None
    rentals = snapshot.spend.rentals if snapshot.spend else ()
    like = f" (the last one cost {rate(rentals[-1].price_per_hour)})" if rentals else ""
    return (
        "Rent a machine to resume?",
        f"Resuming rents a new machine{like} and continues {resume_start(snapshot)}. Resume now?",
    )


def resume_start(snapshot: RunSnapshot, written_step: int | None = None) -> str:
    """Where a resume continues: the one wording of the monitor, its action line and the resume question.

    A rented run continues on a new machine from the newest checkpoint on this computer; a run on the user's own
    server continues there, from the newest checkpoint written (``written_step``, from its events) or brought home.
    """
    home = snapshot.files.checkpoint_steps
    newest_home = home[-1] if home else None
    if not is_rented(snapshot.record) and written_step is not None and (newest_home or 0) < written_step:
        return f"from the checkpoint at step {written_step:,} on your server"
    if newest_home is not None:
        return f"from the checkpoint at step {newest_home:,} on this computer"
    return "from the beginning (no checkpoint is on this computer)"
