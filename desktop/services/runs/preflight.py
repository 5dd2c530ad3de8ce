"""The checks before a launch: what blocks it, what is worth a look, each with the wizard step that fixes it.

:func:`read_review_facts` gathers what the checks and the review page read (the prepared data's manifest, the
sizing of the draft as it is now, the picked offer judged again, the rows that look like secrets); it blocks, so run
it in an executor. :func:`preflight` then turns the facts into :class:`Check` items, red first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import msgspec

from desktop.core.data.findings import Code
from desktop.core.data.rules import check_messages
from desktop.core.export.on_machine import HomeRoom
from desktop.core.runs.draft import RunDraft
from desktop.core.sizing.plan import Fit, GpuOption
from desktop.core.units import card_text, memory_text
from desktop.services.data.prepare import read_manifest
from desktop.services.machines.probe import NO_GPU
from desktop.services.models.configs import load_catalog
from desktop.services.models.sizing import Sizing, SizingError, server_gpu_gb
from desktop.services.platform.secrets import SecretName, SecretStore, StoreProbe, probe_secret_store
from desktop.services.providers.base import ProviderName
from desktop.services.providers.registry import PROVIDERS
from desktop.services.providers.words import without_terminal_advice
from desktop.services.runs.drafts import size_draft
from desktop.services.runs.export_choice import export_choice, home_room, judge_estimate
from desktop.services.runs.offers_for_draft import DraftOffer, judge_pick, sentence
from desktop.services.runs.store import RunStore

#: Licences of catalog models whose Hub repositories are gated (a licence to accept, then a token to download).
GATED_LICENCES = frozenset({"llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma"})


class Severity(StrEnum):
    """How much a check weighs."""

    DANGER = "danger"  # red: blocks Launch (unless the user launches anyway, where that is possible)
    WARNING = "warning"  # amber: worth a look


@dataclass(frozen=True)
class Check:
    """One thing to know before launching.

    Attributes:
        severity: Red or amber.
        headline: What is wrong, in one line.
        details: Why it matters and what to do.
        step: The wizard step that fixes it.
        required: A missing part: even "Launch anyway" cannot launch without it.
    """

    severity: Severity
    headline: str
    details: str
    step: str
    required: bool = False


@dataclass(frozen=True)
class ReviewFacts:
    """What the review shows besides the draft.

    Attributes:
        manifest: The prepared data's manifest (None when not prepared or unreadable).
        sizing: The plan for the draft (None when it cannot be sized).
        sizing_problem: Why there is no plan.
        pick: The picked offer judged against the draft as it is now (None when nothing is picked).
        secret_rows: Rows of the prepared data that look like they hold a secret.
        hf_token: Whether a Hugging Face token is set.
        wandb_key: Whether a W&B key is set (read for drafts reporting to W&B only).
        gated: Whether the base model is gated on the Hub.
        secret_store: What the keyring did with a throwaway secret (read for renting drafts only).
        key_problems: Why keys the run reads (the provider's, the Hugging Face token) cannot be used: malformed
            environment variables, one line each.
        room: This computer's memory and free disk for a local export (None: not read).
    """

    manifest: dict[str, Any] | None = None
    sizing: Sizing | None = None
    sizing_problem: str | None = None
    pick: DraftOffer | None = None
    secret_rows: int = 0
    hf_token: bool = False
    wandb_key: bool = False
    gated: bool = False
    secret_store: StoreProbe | None = None
    key_problems: tuple[str, ...] = ()
    room: HomeRoom | None = None


def read_review_facts(draft: RunDraft, secrets: SecretStore | None, store: RunStore | None = None) -> ReviewFacts:
    """Reads and computes everything the review needs, from the same sources as the Data and Sizing steps."""
    sizing, problem = None, None
    try:
        sizing = size_draft(draft, secrets)
    except SizingError as exc:
        problem = sentence(without_terminal_advice(str(exc)), keep=draft.base_model)
    return ReviewFacts(
        manifest=read_manifest(draft.train_file),
        sizing=sizing,
        sizing_problem=problem,
        pick=judge_pick(draft, secrets, store) if draft.renting else None,
        secret_rows=secret_rows(draft.train_file, draft.eval_file),
        hf_token=_has_token(secrets),
        wandb_key=reports_to_wandb(draft) and (secrets or SecretStore()).status(SecretName.WANDB).usable,
        gated=is_gated(draft.base_model),
        secret_store=probe_secret_store() if draft.renting else None,
        key_problems=key_problems(draft, secrets),
        room=home_room(),
    )


def _has_token(secrets: SecretStore | None) -> bool:
    return (secrets or SecretStore()).status(SecretName.HUGGINGFACE).usable


def reports_to_wandb(draft: RunDraft) -> bool:
    """Whether the draft's run sends its metrics to W&B (and so needs the W&B key)."""
    return "wandb" in draft.training.get("report_to", [])


def key_problems(draft: RunDraft, secrets: SecretStore | None) -> tuple[str, ...]:
    """Why the keys this draft reads cannot be used (a space or line break inside an environment variable)."""
    names = [SecretName.HUGGINGFACE, *([SecretName.WANDB] if reports_to_wandb(draft) else [])]
    if draft.renting and draft.compute.provider in set(ProviderName):
        names.insert(0, PROVIDERS[ProviderName(draft.compute.provider)].secret)
    store = secrets or SecretStore()
    return tuple(problem for name in names if (problem := store.status(name).problem))


def is_gated(model: str) -> bool:
    """Whether ``model`` is a catalog model whose Hub repository is gated (a local folder never is)."""
    if not model or Path(model).expanduser().exists():
        return False
    entry = load_catalog().entry(model)
    return entry is not None and entry.license in GATED_LICENCES


def secret_rows(*files: str) -> int:
    """Rows of the prepared files that look like they hold a secret (API keys, tokens, private keys)."""
    total = 0
    for name in files:
        path = Path(name).expanduser() if name else None
        if path is not None and path.is_file():
            stat = path.stat()
            total += _secret_rows(str(path), stat.st_mtime_ns, stat.st_size)
    return total


@functools.lru_cache(maxsize=8)
def _secret_rows(path: str, _mtime_ns: int, _size: int) -> int:
    """Counts once per version of the file (the review refreshes often, the data rarely changes)."""
    decoder = msgspec.json.Decoder()
    count = 0
    with Path(path).open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                messages = decoder.decode(line).get("messages")
            except (msgspec.DecodeError, AttributeError):
                continue
            count += any(f.code is Code.SECRET for f in check_messages(messages, number))
    return count


# -- the checks -------------------------------------------------------------------------------------------------------


def preflight(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    """Every check that applies, red before amber (the parts still missing first)."""
    checks = [
        *_missing(draft),
        *_secret_checks(draft, facts),
        *_machine_checks(draft, facts),
        *_model_checks(draft, facts),
        *_data_checks(draft, facts),
    ]
    return sorted(checks, key=lambda check: (check.severity is not Severity.DANGER, not check.required))


def _missing(draft: RunDraft) -> list[Check]:
    """The parts a run cannot do without."""
    found = []
    if not draft.train_file:
        found.append(_required("The data is not prepared", "Choose a dataset and prepare it.", "data"))
    if not draft.base_model:
        found.append(_required("No base model chosen", "Choose the model to fine-tune.", "model"))
    if draft.renting and not draft.compute.picked:
        found.append(_required("No machine picked", "Pick an offer to rent, or choose your own server.", "compute"))
    elif not draft.renting and not (draft.target.host and draft.target.user):
        found.append(_required("No server set up", "Enter your server's address and user.", "compute"))
    elif not draft.renting and not draft.target.host_key:
        found.append(
            _required(
                "The server's connection is not tested",
                "Press Test connection: its host key is pinned, so the run refuses a machine that later presents "
                "another key.",
                "compute",
            )
        )
    if not draft.renting and draft.budget_usd > 0 and draft.hourly_rate_usd <= 0:
        found.append(
            _required(
                "A budget needs your server's hourly rate",
                "Enter what the server costs per hour, or set the budget to no limit.",
                "compute",
            )
        )
    return found


def _required(headline: str, details: str, step: str) -> Check:
    return Check(Severity.DANGER, headline, details, step, required=True)


def _secret_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    """A keyring that loses secrets blocks renting (the rented machine's SSH key would be lost); so do bad keys."""
    found = []
    store = facts.secret_store
    if draft.renting and store is not None and store.blocks_renting:
        found.append(_required("The keyring cannot keep this run's SSH key", store.problem, "compute"))
    found += [
        _required("A key in the environment cannot be used", problem, "compute") for problem in facts.key_problems
    ]
    return found


def _machine_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    if draft.renting:
        return _rented_checks(draft, facts)
    return _server_checks(draft, facts)


def _rented_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    pick, found = facts.pick, []
    if pick is None:
        return []
    machine = f"{pick.offer.count} x {pick.offer.gpu}" if pick.offer.count > 1 else f"the {pick.offer.gpu}"
    if pick.fit is Fit.NO and pick.need_gb is not None:
        found.append(
            Check(
                Severity.DANGER,
                "The job does not fit the picked machine",
                f"It needs about {memory_text(pick.need_gb)} on each GPU; {machine} has "
                f"{card_text(pick.offer.vram_gb)} per GPU. Pick a machine with more memory, or choose "
                f"{'' if draft.method == 'qlora' else 'QLoRA, '}a shorter sequence length or a smaller "
                "micro-batch on the Model step.",
                "compute",
            )
        )
    elif pick.fit is Fit.TIGHT and pick.need_gb is not None:
        found.append(_tight(pick.need_gb, f"{card_text(pick.offer.vram_gb)} per GPU on {machine}"))
    if pick.fit is not None and pick.total_usd is None:
        found.append(
            Check(
                Severity.WARNING,
                "Time and cost unknown on this GPU",
                f"Rentune has no speed figures for the {pick.offer.gpu}: the run's hours and total cannot be "
                "estimated. Set a budget to cap what it can cost.",
                "compute",
            )
        )
    if pick.offer.spot:
        found.append(_spot(draft))
    found += _budget_checks(draft, pick.total_usd, after_training_usd(draft, facts))
    return found


def _tight(need_gb: float, capacity: str) -> Check:
    return Check(
        Severity.WARNING,
        "Memory is tight",
        f"The job needs about {memory_text(need_gb)} of {capacity}: a long example may run out of memory. A shorter "
        "sequence length or a smaller micro-batch on the Model step leaves room.",
        "model",
    )


def _spot(draft: RunDraft) -> Check:
    minutes = int(float(draft.training.get("checkpoint_minutes", 30) or 30))
    return Check(
        Severity.WARNING,
        "Spot machine: it can be taken away at any time",
        "It is cheaper, but the provider may take it back. The run then continues on another machine from its "
        f"newest checkpoint, redoing up to {minutes} minutes of training (paid for twice).",
        "compute",
    )


def after_training_usd(draft: RunDraft, facts: ReviewFacts) -> float:
    """What the machine's work after training costs, as chosen: the export there, judging there (0 for none)."""
    usd = 0.0
    choice = export_choice(draft, facts.sizing, facts.room)
    if choice is not None and choice.outputs and choice.cost.usd is not None:
        usd += choice.cost.usd
    judge = judge_estimate(draft, facts.sizing) if draft.judge_on_machine and draft.eval_file else None
    if judge is not None and judge.usd is not None:
        usd += judge.usd
    return usd


def _budget_checks(draft: RunDraft, total_usd: float | None, after_usd: float = 0.0) -> list[Check]:
    if draft.budget_usd <= 0 or total_usd is None or total_usd + after_usd <= draft.budget_usd:
        return []
    if total_usd <= draft.budget_usd:  # training fits; the work after it would be cut off
        return [
            Check(
                Severity.WARNING,
                "The work after training is above your budget",
                f"About ${total_usd:,.2f} to train and ${after_usd:,.2f} for what the machine does after it, against "
                f"a budget of ${draft.budget_usd:,.2f}: the adapter comes home, then the budget stops the machine "
                "before that work ends. Raise the budget, or leave that work for this computer.",
                "compute",
            )
        ]
    return [
        Check(
            Severity.WARNING,
            "The estimate is above your budget",
            f"About ${total_usd:,.2f} estimated against a budget of ${draft.budget_usd:,.2f}: the run will be "
            "stopped (its newest checkpoint kept) before it ends. Raise the budget, or pick a cheaper machine.",
            "compute",
        )
    ]


def _server_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    gpu = draft.target.gpu
    if not gpu or not draft.target.host_key:
        return []
    if gpu == NO_GPU:
        return [
            Check(
                Severity.DANGER,
                "Your server has no GPU",
                "Training would run on its CPU, which suits only tiny test models: anything larger takes days. "
                "Use a server with an NVIDIA GPU, or rent one.",
                "compute",
            )
        ]
    option = sized_option(draft, facts.sizing)
    usable = server_gpu_gb(gpu)
    found = []
    if option is not None and usable is not None:
        need = option.memory.per_gpu_total
        if need > usable:
            found.append(
                Check(
                    Severity.DANGER,
                    "The job does not fit your server's GPU",
                    f"It needs about {memory_text(need)} on each GPU; your server's {gpu} has about "
                    f"{memory_text(usable)} usable. Choose QLoRA, a shorter sequence length or a smaller "
                    "micro-batch on the Model step, or rent a larger machine.",
                    "model",
                )
            )
        elif need > usable * 0.9:
            found.append(_tight(need, f"about {memory_text(usable)} usable on your server's GPU"))
    if draft.hourly_rate_usd > 0 and option is not None:
        found += _budget_checks(draft, option.hours * draft.hourly_rate_usd, after_training_usd(draft, facts))
    return found


def sized_option(draft: RunDraft, sizing: Sizing | None) -> GpuOption | None:
    """The option an own server is judged by: the Sizing step's pick, else the recommended, else the plan's first."""
    if sizing is None:
        return None
    picked = sizing.option(draft.gpu_name) if draft.gpu_name else None
    return picked or sizing.recommended or (sizing.plan.options[0] if sizing.plan.options else None)


def _model_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    found = []
    if facts.sizing_problem and draft.base_model:
        found.append(Check(Severity.DANGER, "The run cannot be sized", facts.sizing_problem, "model"))
    if facts.gated and not facts.hf_token:
        found.append(
            Check(
                Severity.DANGER,
                f"{draft.base_model} needs a Hugging Face token",
                "It is gated on the Hugging Face Hub: the machine cannot download it without one. Accept its "
                "licence on huggingface.co, then store your token in Settings.",
                "model",
                required=True,  # launched anyway, the rented machine would bill while its download is refused
            )
        )
    if reports_to_wandb(draft) and not facts.wandb_key:
        found.append(
            _required(
                "Weights & Biases needs your API key",
                "The run sends its metrics to W&B from the machine. Store your W&B key under API keys in Settings, "
                "or untick W&B on the Model step.",
                "model",
            )
        )
    return found


def _data_checks(draft: RunDraft, facts: ReviewFacts) -> list[Check]:
    manifest = facts.manifest
    if manifest is None:
        return []
    found = _truncation(draft, manifest)
    if facts.secret_rows:
        rows = _rows(facts.secret_rows)
        found.append(
            Check(
                Severity.WARNING,
                f"{rows} kept in the training data look like they hold a secret",
                "API keys, tokens or private keys: a model can learn and repeat them. Remove them from the file "
                "and prepare it again on the Data step.",
                "data",
            )
        )
    dropped = int(manifest.get("counts", {}).get("with_errors", 0) or 0)
    if dropped:
        found.append(
            Check(
                Severity.WARNING,
                f"{_rows(dropped)} with errors left out",
                "They are not in the training data. If they matter, fix them in the file and prepare it again on "
                "the Data step.",
                "data",
            )
        )
    return found + _tokenizer(draft, manifest)


def _rows(count: int) -> str:
    return f"{count:,} row" + ("s" if count != 1 else "")


def _truncation(draft: RunDraft, manifest: dict[str, Any]) -> list[Check]:
    tokens = manifest.get("tokens", {})
    checked, used = int(tokens.get("seq_len", 0) or 0), int(draft.training.get("seq_len", 2048))
    too_long, cut = int(tokens.get("too_long", 0) or 0), int(tokens.get("cut", 0) or 0)
    if checked and checked != used:
        return [
            Check(
                Severity.WARNING,
                "The data was checked for another sequence length",
                f"It was checked for {checked:,} tokens and the run uses {used:,}: check it again on the Data step "
                "to see which examples are cut.",
                "data",
            )
        ]
    if not too_long:
        return []
    examples = f"{too_long:,} example" + ("s are" if too_long != 1 else " is")
    return [
        Check(
            Severity.WARNING,
            f"{examples} longer than the sequence length",
            f"Their ends are cut in training ({cut:,} tokens in all). Raise the sequence length on the Model step "
            "(more memory), or shorten or split those examples.",
            "model",
        )
    ]


def _tokenizer(draft: RunDraft, manifest: dict[str, Any]) -> list[Check]:
    counted = str(manifest.get("tokenizer", ""))
    prefix = "tokenizer and chat template of "
    if not counted.startswith(prefix) or counted.removeprefix(prefix) == draft.base_model:
        return []
    return [
        Check(
            Severity.WARNING,
            "The tokens were counted for another model",
            f"The data was prepared with the tokenizer of {counted.removeprefix(prefix)}, and the run trains "
            f"{draft.base_model}: prepare it again on the Data step for exact counts and truncation.",
            "data",
        )
    ]


def launch_estimate(draft: RunDraft, facts: ReviewFacts) -> dict[str, Any] | None:
    """What the review showed the run would take and cost, as the launched spec's ``[estimate]``; None unsized.

    A rented run's is the picked offer's (its machine's own prediction, with its speed, replaces it once the machine
    is up); an own server's is the Sizing step's pick at the user's stated rate.
    """
    if facts.sizing is None:
        return None
    if draft.renting:
        return _offer_estimate(facts.pick)
    option = (facts.sizing.option(draft.gpu_name) if draft.gpu_name else None) or facts.sizing.recommended
    if option is None:
        return None
    estimate: dict[str, Any] = {
        "hours": round(option.hours, 4),
        "gpu": option.gpu.id,
        "count": option.count,
        "tokens_per_s": round(option.tokens_per_s, 1),
        "peak_gb": round(option.memory.per_gpu_total, 2),
    }
    if draft.hourly_rate_usd > 0:
        estimate["usd"] = round(option.hours * draft.hourly_rate_usd, 2)
    return estimate


def _offer_estimate(pick: DraftOffer | None) -> dict[str, Any] | None:
    if pick is None or pick.hours is None:
        return None
    from desktop.core.sizing.offers import match_gpu
    from desktop.services.models.configs import load_gpus

    offer = pick.offer
    known = match_gpu(list(load_gpus()), (offer.gpu, offer.gpu_id), offer.vram_gb)
    estimate: dict[str, Any] = {"hours": round(pick.hours, 4), "gpu": known.id if known else offer.gpu}
    estimate["count"] = offer.count
    if pick.total_usd is not None:
        estimate["usd"] = round(pick.total_usd, 2)
    if pick.need_gb is not None:
        estimate["peak_gb"] = round(pick.need_gb, 2)
    return estimate
