"""How the Review step words the run: each section as (label, value) rows, and the question before launching.

The numbers come from the review's facts (the prepared data's manifest, the sizing of the draft as it is now, the
picked offer judged again), so they match the Data, Sizing and Compute steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desktop.core.export.on_machine import HOME_MB_PER_S, ON_MACHINE_OUTPUTS, OnMachineCost, outputs_words
from desktop.core.runs.draft import ComputeDraft, RunDraft, gpu_pick_training
from desktop.core.sizing.plan import GpuOption
from desktop.core.sizing.report import format_hours
from desktop.core.units import card_text, memory_text
from desktop.services.data.prepare import manifest_tokens
from desktop.services.models.sizing import Sizing, option_label
from desktop.services.models.sizing_words import fit_text
from desktop.services.providers.base import ProviderName
from desktop.services.runs.export_choice import ExportChoice, export_choice, judge_estimate
from desktop.services.runs.preflight import Check, ReviewFacts
from desktop.ui.pages.wizard.compute_words import estimate_words, kind_words, machine_words
from trainer_payload.protocol import PREFERENCE_OBJECTIVES

Rows = list[tuple[str, str]]
METHOD_WORDS = {
    "qlora": "QLoRA (a LoRA adapter on a 4-bit base model)",
    "lora": "LoRA (a small adapter on the base model)",
    "full": "Full fine-tune (every weight trained)",
    "full-8bit": "Full fine-tune with 8-bit AdamW",
}


#: What the model learns, per objective (the wizard trains SFT, DPO and ORPO).
OBJECTIVE_WORDS = {
    "sft": "Supervised fine-tuning on the conversations",
    "dpo": "DPO: to prefer each pair's chosen answer (beta {beta:g}; the reference is the base model)",
    "orpo": "ORPO: the chosen answers and the preference in one stage (beta {beta:g})",
    "cpt": "Continued pre-training on raw text",
}


def _name(path: str) -> str:
    return Path(path).name if path else "none"


def data_rows(draft: RunDraft, manifest: dict[str, Any] | None) -> Rows:
    """The Data section: the files, the rows kept and left out, the tokens."""
    rows: Rows = [("Dataset", draft.data_file or "none chosen")]
    if not draft.train_file:
        return [*rows, ("Prepared data", "not prepared yet")]
    rows.append(("Prepared data", str(Path(draft.train_file).parent)))
    if manifest is None:
        return [*rows, ("Rows", "unknown: the prepared data has no readable summary (prepare it again)")]
    counts = manifest.get("counts", {})
    rows.append(("Rows", f"{counts.get('train', 0):,} for training, {counts.get('eval', 0):,} for evaluation"))
    left_out = [
        _count(counts.get("with_errors", 0), "row with errors", "rows with errors"),
        _count(counts.get("duplicates_removed", 0), "repeated row", "repeated rows"),
    ]
    rows.append(("Left out", ", ".join(words for words in left_out if words) or "nothing"))
    rows += _token_rows(manifest)
    return rows


def _count(value: object, one: str, many: str) -> str:
    count = int(value or 0)  # type: ignore[call-overload]
    return "" if not count else f"{count:,} {one if count == 1 else many}"


def _token_rows(manifest: dict[str, Any]) -> Rows:
    tokens = manifest.get("tokens", {})
    trained = int(tokens.get("trained_per_epoch", 0) or 0)
    counted = manifest_tokens(manifest)
    if counted is None:
        return [("Tokens per epoch", f"{trained:,}")]
    in_training = counted[0]
    words = f"{in_training:,} in the training rows"
    if in_training != trained:
        words += f" ({trained:,} with the evaluation rows)"
    return [("Tokens per epoch", words), ("Counted with", str(manifest.get("tokenizer") or tokens.get("method", "")))]


def model_rows(draft: RunDraft) -> Rows:
    """The Model section: the base model, the method and the settings that matter most, in words."""
    keys = {"method": draft.method, **draft.training}
    method = str(keys["method"])
    rows: Rows = [("Base model", draft.base_model or "none chosen")]
    beta = float(keys.get("beta", 0.1))
    rows.append(("Learns", OBJECTIVE_WORDS.get(draft.objective, draft.objective).format(beta=beta)))
    rows.append(("Method", METHOD_WORDS.get(method, method)))
    if method in {"qlora", "lora"}:
        rows.append(("Adapter", f"LoRA rank {keys.get('lora_r', 16)}, alpha {keys.get('lora_alpha', 32)}"))
    rows.append(("Sequence length", f"{int(keys.get('seq_len', 2048)):,} tokens"))
    micro, accumulate = int(keys.get("micro_batch", 2)), int(keys.get("grad_accum", 4))
    unit = {"sft": "example", "cpt": "packed sequence"}.get(draft.objective, "pair")
    rows.append(
        (
            "Batch",
            f"{micro} {_plural(micro, unit)} per step, {accumulate} {_plural(accumulate, 'step')} accumulated: "
            f"{micro * accumulate} per update",
        )
    )
    steps = int(keys.get("max_steps", -1) or -1)
    epochs = keys.get("epochs", 3)
    length = f"{steps:,} steps at most (a quick trial)" if steps > 0 else f"{epochs:g} {_plural(epochs, 'epoch')}"
    rows.append(("Length", length if steps > 0 else f"{length} over the data"))
    rows.append(("Evaluation", evaluation_words(draft)))
    rows.append(("Learning rate", f"{float(keys.get('learning_rate', 2e-4)):g}"))
    minutes = float(keys.get("checkpoint_minutes", 30))
    rows.append(("Checkpoints", f"every {minutes:g} {_plural(minutes, 'minute')}"))
    trackers = [TRACKER_WORDS[tracker] for tracker in keys.get("report_to", []) if tracker in TRACKER_WORDS]
    if trackers:
        rows.append(("Metrics to", "; ".join(trackers)))
    return rows


#: What each tracker a run reports to does, as the review says it.
TRACKER_WORDS = {
    "tensorboard": "TensorBoard (event files home with every checkpoint)",
    "trackio": "trackio (its database home with every checkpoint)",
    "wandb": "Weights & Biases (sent from the machine with your key)",
}


def evaluation_words(draft: RunDraft) -> str:
    """When the held-out rows are evaluated, or that none are held out."""
    if not draft.eval_file:
        return "none: no rows are held out on the Data step"
    every = int(draft.training.get("eval_steps", 0) or 0)
    return (
        f"the held-out rows every {every:,} {_plural(every, 'step')}" if every else "the held-out rows ten times a run"
    )


def _plural(count: float, noun: str) -> str:
    return noun if count == 1 else f"{noun}s"


def sized_option(draft: RunDraft, sizing: Sizing | None) -> tuple[GpuOption | None, str]:
    """The Sizing step's pick (else the recommended option) and which it is."""
    if sizing is None:
        return None, ""
    picked = sizing.option(draft.gpu_name) if draft.gpu_name else None
    if picked is not None:
        return picked, "Your pick"
    return sizing.recommended, "Recommended"


def sizing_rows(draft: RunDraft, facts: ReviewFacts | None) -> Rows:
    """The Sizing section: memory per GPU, the GPUs trained on, the estimate, where the tokens come from."""
    if facts is None:
        return [("Sizing", "checking…")]
    if facts.sizing is None:
        return [("Sizing", facts.sizing_problem or "not sized")]
    if draft.renting:
        return _rented_sizing(draft, facts)
    option, kind = sized_option(draft, facts.sizing)
    rows: Rows = [("Tokens", facts.sizing.tokens_source)]
    if option is None:
        return [*rows, ("GPU options", "none fits: change the method or the settings on the Model step")]
    rows.append(("Peak memory per GPU", memory_text(option.memory.per_gpu_total)))
    rows.append((kind, f"{option_label(option)}: {fit_text(option)}"))
    rows.append(("Estimate at list price", f"about {format_hours(option.hours)}, ${option.cost_usd:,.2f}"))
    if draft.hourly_rate_usd > 0:
        own = option.hours * draft.hourly_rate_usd
        rows.append(("At your server's rate", f"about ${own:,.2f} (${draft.hourly_rate_usd:,.2f} per hour)"))
    rows.append(("Trains on", gpus_words({"num_gpus": 1, **draft.training, **gpu_pick_training(draft.gpu_name)})))
    return rows


def _rented_sizing(draft: RunDraft, facts: ReviewFacts) -> Rows:
    assert facts.sizing is not None
    rows: Rows = [("Tokens", facts.sizing.tokens_source)]
    pick = facts.pick
    if pick is None or pick.need_gb is None:
        per_gpu = facts.sizing.plan.memory.per_gpu_total
        return [*rows, ("Peak memory per GPU", f"{memory_text(per_gpu)} on one GPU (no machine picked yet)")]
    rows.append(
        ("Peak memory per GPU", f"{memory_text(pick.need_gb)} of the {card_text(pick.offer.vram_gb)} each GPU has")
    )
    keys = draft.compute.training_keys() | {"strategy": pick.strategy}
    rows.append(("Trains on", gpus_words(keys, draft.compute.nodes)))
    return rows


def gpus_words(keys: dict[str, Any], nodes: int = 1) -> str:
    """``1 GPU`` or ``2 GPUs, sharing the model (FSDP)`` / ``…, each with a copy (DDP)``.

    Across machines: ``16 GPUs on 2 machines, sharing the model (FSDP)``.
    """
    count = int(keys.get("num_gpus", 1)) * nodes
    if count == 1:
        return "1 GPU"
    how = "sharing the model (FSDP)" if keys.get("strategy") == "fsdp" else "each with a copy of the model (DDP)"
    machines = f" on {nodes} machines" if nodes > 1 else ""
    return f"{count} GPUs{machines}, {how}"


def compute_rows(draft: RunDraft, facts: ReviewFacts | None) -> Rows:
    """The Compute section: the machine (rented or own), its rate, the estimate, the budget."""
    rows = _rented_rows(draft, facts) if draft.renting else _server_rows(draft)
    return [*rows, ("Budget", budget_line(draft))]


def budget_line(draft: RunDraft) -> str:
    """The budget in words."""
    if draft.budget_usd <= 0:
        return "no limit"
    return f"stopped before it costs ${draft.budget_usd:,.2f}, its newest checkpoint kept"


def _rented_rows(draft: RunDraft, facts: ReviewFacts | None) -> Rows:
    compute = draft.compute
    if not compute.picked:
        return [("Machine", "none picked yet")]
    provider = ProviderName(compute.provider).label
    where = f" in {compute.location}" if compute.location else ""
    rows: Rows = [
        ("Machine", f"{_machine(compute)} from {provider}{where}"),
        ("Kind", kind_words(compute.spot).capitalize() + (": it can be taken away" if compute.spot else "")),
        ("Price", f"${compute.price_per_hour:,.2f} per hour (never rented above ${compute.price_cap:,.2f})"),
    ]
    pick = facts.pick if facts else None
    rows.append(("Estimate", estimate_words(pick) if facts else "checking…"))
    rows.append(("Machine settings", machine_settings_words(compute)))
    return rows


def _machine(compute: ComputeDraft) -> str:
    words = machine_words(compute.count, compute.gpu, compute.vram_gb, compute.nodes)
    return words[:1].upper() + words[1:]


def machine_settings_words(compute: ComputeDraft) -> str:
    """The machine settings set on the Compute step (Python, login user, image), or that the defaults are used."""
    said = [
        *([f"Python {compute.python}"] if compute.python else []),
        *([f"login user {compute.user}"] if compute.user else []),
        *([f"image {compute.image}"] if compute.image else []),
    ]
    return ", ".join(said) if said else "the provider's defaults (its image, python3, its login user)"


def _server_rows(draft: RunDraft) -> Rows:
    target = draft.target
    if not target.host:
        return [("Server", "none set up yet")]
    rate = draft.hourly_rate_usd
    return [
        ("Server", target.url + (f", key file {target.identity}" if target.identity else "")),
        ("Host key", f"{target.fingerprint} (pinned)" if target.host_key else "not tested yet"),
        ("GPU", target.gpu or "unknown (test the connection)"),
        ("Python", target.python),
        ("Work folder", target.workdir or "~/.rentune/runs"),
        ("Hourly rate", f"${rate:,.2f}" if rate else "not set: the cost is not metered"),
    ]


@dataclass(frozen=True)
class LaunchQuestion:
    """What the confirmation before a launch says.

    Attributes:
        title: The dialog's title.
        summary: The question, naming the machine, the rate and the estimated total.
        details: The budget, what happens to the machine, what is launched despite.
        action: The launch button's words.
    """

    title: str
    summary: str
    details: str
    action: str


def launch_question(draft: RunDraft, facts: ReviewFacts | None, despite: list[Check]) -> LaunchQuestion:
    """The one question before anything is rented or started."""
    question = _rent_question(draft, facts) if draft.renting else _server_question(draft, facts)
    if not despite:
        return question
    red = "; ".join(check.headline for check in despite)
    return LaunchQuestion(
        question.title,
        question.summary,
        f"{question.details}\n\nLaunching despite: {red}.",
        question.action + " anyway",
    )


def _rent_question(draft: RunDraft, facts: ReviewFacts | None) -> LaunchQuestion:
    compute = draft.compute
    machine = machine_words(compute.count, compute.gpu, compute.vram_gb, compute.nodes)
    provider = ProviderName(compute.provider).label if compute.picked else "nobody"
    estimate = estimate_words(facts.pick if facts else None)
    summary = (
        f"Rent {machine} from {provider} ({kind_words(compute.spot)}) at ${compute.price_per_hour:,.2f} per hour "
        f"and start training? Estimated: {estimate}."
    )
    details = [
        f"Budget: {budget_line(draft)}." if draft.budget_usd > 0 else "No budget: nothing stops the run for its cost.",
        f"The machine is not rented if its price has risen above ${compute.price_cap:,.2f} per hour.",
        "It is terminated the moment the adapter is on this computer, and whenever the run ends.",
    ]
    if compute.spot:
        details.append("Spot: the provider may take it away; the run then continues on another machine.")
    export = _after_training_detail(draft, facts)
    if export:
        details[2] = f"{export} It is terminated the moment they are on this computer, and whenever the run ends."
    if draft.serve_after_training:
        details[2] = (
            f"{export + ' ' if export else ''}Then it serves the tuned model, at ${compute.price_per_hour:,.2f} per "
            f"hour, until {draft.serve_idle_minutes:g} min pass without a request or you press Stop; it is "
            "terminated then, and whenever the run ends."
        )
    return LaunchQuestion("Rent a machine and start training?", summary, "\n".join(details), "Rent and launch")


def _server_question(draft: RunDraft, facts: ReviewFacts | None) -> LaunchQuestion:
    option, _ = sized_option(draft, facts.sizing if facts else None)
    rate = draft.hourly_rate_usd
    summary = f"Start training on {draft.target.url}?"
    if rate > 0 and option is not None:
        summary += (
            f" At your rate of ${rate:,.2f} per hour: about {format_hours(option.hours)}, "
            f"${option.hours * rate:,.2f} in all."
        )
    details = f"Budget: {budget_line(draft)}." if draft.budget_usd > 0 else "No budget set."
    if rate <= 0:
        details += " No hourly rate: the cost is not metered."
    export = _after_training_detail(draft, facts)
    if export:
        details += f"\n{export.replace('the machine makes', 'your server makes').replace('there', 'on your server')}"
    if draft.serve_after_training:
        details += (
            f"\nThen your server serves the tuned model until {draft.serve_idle_minutes:g} min pass without a request."
        )
    return LaunchQuestion("Start training on your server?", summary, details, "Launch")


def export_box_text(draft: RunDraft) -> str:
    """The review's choice to make the model on the machine (a rented one, or the own server)."""
    where = "rented machine, before it is terminated" if draft.renting else "server, after training"
    return f"Make {outputs_words(ON_MACHINE_OUTPUTS)} on the {where}"


def export_choice_words(draft: RunDraft, choice: ExportChoice) -> str:
    """Why the model is made where it is, and what making it on the machine costs."""
    cost = choice.cost
    minutes = format_hours(cost.minutes / 60)
    paid = f"about {minutes} more of paid time" if draft.renting else f"about {minutes}"
    money = f", ${cost.usd:,.2f}" if cost.usd is not None else ""
    work, download = format_hours(cost.work_minutes / 60), format_hours(cost.download_minutes / 60)
    how = (
        f"{paid}{money} ({work} of work there, {download} to download at "
        f"{HOME_MB_PER_S:.0f} MB/s); it comes home verified, then the Models page has it"
    )
    reason = f"{choice.reason[:1].upper()}{choice.reason[1:]}" if choice.reason else ""
    if choice.proposed:
        return f"Proposed: {reason}. On the machine: {how}."
    if choice.outputs:
        return f"{reason + '. ' if reason else ''}On the machine: {how}."
    if reason:
        return f"{reason}: the export on the Models page may not work here. On the machine instead: {how}."
    return f"After training, export on the Models page (the merge fits this computer). On the machine instead: {how}."


def judge_box_text(draft: RunDraft) -> str:
    """The review's choice to judge base against tuned on the machine."""
    where = "rented machine before it is terminated" if draft.renting else "server after training"
    return f"&Judge base against tuned on the held-out rows, on the {where}"


def judge_words(draft: RunDraft, cost: OnMachineCost) -> str:
    """What judging on the machine gives and costs, or why it cannot be chosen (no held-out rows)."""
    if draft.objective in PREFERENCE_OBJECTIVES:
        return (
            "Judging compares answers to held-out conversations. A preference run is measured on its held-out pairs "
            "instead: how often the tuned model prefers the chosen answer, shown on the monitor as it trains."
        )
    if draft.objective == "cpt":
        return (
            "Judging compares answers to held-out conversations. Continued pre-training is measured on its held-out "
            "text instead: the perplexity before and after, said when the run ends."
        )
    if not draft.eval_file:
        return (
            "Needs held-out rows: the data step sets them aside when it prepares the data. Without them, compare on "
            "the Models page after training."
        )
    at_most = format_hours(cost.minutes / 60)
    paid = f"at most {at_most} more of paid time" if draft.renting else f"at most {at_most}"
    money = f", ${cost.usd:,.2f}" if cost.usd is not None else ""
    return (
        f"The GPU is paid for already: both models answer up to 50 held-out rows there ({paid}{money}), and the "
        "report (scores, the rows that flipped, the loss curves, the cost) is on the Models page when the run ends."
    )


def _judge_detail(draft: RunDraft, facts: ReviewFacts | None) -> str | None:
    cost = judge_estimate(draft, facts.sizing) if facts else None
    if cost is None or not (draft.judge_on_machine and draft.can_judge_on_machine):
        return None
    money = f", ${cost.usd:,.2f}" if cost.usd is not None else ""
    at_most = format_hours(cost.minutes / 60)
    return f"After training, base and tuned answer the held-out rows there (at most {at_most}{money})."


def _after_training_detail(draft: RunDraft, facts: ReviewFacts | None) -> str | None:
    """What the machine does after training before it goes: judging, then the export (each when asked)."""
    judge, export = _judge_detail(draft, facts), _export_detail(draft, facts)
    if judge and export:
        return f"{judge} {export.replace('After training, the machine makes', 'Then the machine makes')}"
    return judge or export


def _export_detail(draft: RunDraft, facts: ReviewFacts | None) -> str | None:
    choice = export_choice(draft, facts.sizing, facts.room) if facts else None
    if choice is None or not choice.outputs:
        return None
    cost = f" (about {format_hours(choice.cost.minutes / 60)} more" + (
        f", ${choice.cost.usd:,.2f})" if choice.cost.usd is not None else ")"
    )
    return f"After training, the machine makes {outputs_words(choice.outputs)}{cost}; they come home verified."
