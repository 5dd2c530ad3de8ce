"""Sizing a wizard draft: the planner's setup from the job keys, the workload, the resolved model and the plan.

The same planner as ``rentune plan``. The dataset's token count is passed in (``models`` sits below ``data``):
:func:`desktop.services.runs.drafts.size_draft` reads it from the prepared data's manifest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from desktop.core.runs.draft import RunDraft, gpu_pick_label
from desktop.core.sizing.architecture import ArchitectureError
from desktop.core.sizing.calibration import JobKind, Learned
from desktop.core.sizing.gpus import GIB_TO_GB, USABLE_FRACTION
from desktop.core.sizing.plan import GPU_COUNTS, NODE_COUNTS, GpuOption, Plan, Workload, make_plan
from desktop.core.sizing.setup import DEFAULT_SETUP, Method, Objective, SetupError, Strategy, Targets, TrainingSetup
from desktop.core.units import memory_text
from desktop.services.models.configs import ModelResolutionError, hub_config_fetcher, load_gpus, resolve_model
from desktop.services.platform.secrets import SecretStore
from trainer_payload.protocol import precomputes_reference

#: Tokens per epoch assumed while the data is not prepared yet.
DEFAULT_TOKENS = 15_000_000
#: How the Model step names the training settings a suggestion or an error is about.
SETTING_LABELS = {
    "lora_r": "LoRA rank",
    "lora_dropout": "LoRA dropout",
    "seq_len": "sequence length",
    "micro_batch": "micro-batch",
    "grad_accum": "gradient accumulation",
    "num_gpus": "GPUs",
}
_ATTENTION_MODULES = {"q_proj", "k_proj", "v_proj", "o_proj"}


class SizingError(ValueError):
    """The job cannot be sized; the message says why and how to fix it.

    Attributes:
        headline: The problem in a few words (what the app's banner says first).
        details: What to do about it.
        setting: What fixes it: a training key (``seq_len``, ``lora_r``...) or ``base_model``; "" for nothing.
    """

    def __init__(self, message: str, *, headline: str = "", details: str = "", setting: str = "") -> None:
        super().__init__(message)
        self.headline = headline or message[:1].upper() + message[1:]
        self.details = details
        self.setting = setting


@dataclass(frozen=True)
class Sizing:
    """A plan for the draft, and where its token count came from.

    Attributes:
        plan: The planner's answer.
        tokens_source: How the tokens per epoch were counted.
        measured: Which GPU speeds and peak memories come from the user's own runs, and which runs (None: the
            catalog's and the memory model's).
    """

    plan: Plan
    tokens_source: str
    measured: str | None = None

    @property
    def recommended(self) -> GpuOption | None:
        """The cheapest option that fits, or None when nothing fits."""
        first = self.plan.options[0] if self.plan.options else None
        return first if first is not None and first.fits else None

    def option(self, label: str) -> GpuOption | None:
        """The option shown as ``label`` (see :func:`option_label`), if any."""
        return next((o for o in self.plan.options if option_label(o) == label), None)


def option_label(option: GpuOption) -> str:
    """What the sizing step stores in ``draft.gpu_name`` for an option (see :func:`gpu_pick_label`)."""
    return gpu_pick_label(option.gpu.name, option.count, option.strategy.value, option.nodes)


def _targets(value: Any) -> Targets:
    if isinstance(value, list):
        names = {str(name) for name in value}
        if names == {"q_proj", "v_proj"}:
            return Targets.QV
        if names and names <= _ATTENTION_MODULES:
            return Targets.ATTENTION
    return Targets.ALL_LINEAR


def training_setup(method: str, training: dict[str, Any]) -> TrainingSetup:
    """The planner's setup for the payload's job keys (the same names the trainer reads).

    Raises:
        SizingError: A setting is out of range or the method is unknown.
    """
    keys = {"method": method, **training}
    try:
        return TrainingSetup(
            method=Method(keys["method"]),
            lora_r=int(keys.get("lora_r", DEFAULT_SETUP.lora_r)),
            targets=_targets(keys.get("target_modules", DEFAULT_SETUP.targets.value)),
            lora_dropout=float(keys.get("lora_dropout", DEFAULT_SETUP.lora_dropout)),
            seq_len=int(keys.get("seq_len", DEFAULT_SETUP.seq_len)),
            micro_batch=int(keys.get("micro_batch", DEFAULT_SETUP.micro_batch)),
            grad_accum=int(keys.get("grad_accum", DEFAULT_SETUP.grad_accum)),
            grad_ckpt=bool(keys.get("gradient_checkpointing", DEFAULT_SETUP.grad_ckpt)),
            num_gpus=int(keys.get("num_gpus", DEFAULT_SETUP.num_gpus)),
            strategy=Strategy(keys.get("strategy", DEFAULT_SETUP.strategy.value)),
            objective=Objective(keys.get("objective", DEFAULT_SETUP.objective.value)),
            reference_precomputed=precomputes_reference(
                str(keys.get("objective", "sft")), str(keys["method"]), int(keys.get("max_steps", 0) or 0)
            ),
        )
    except SetupError as exc:
        label = SETTING_LABELS.get(exc.setting, exc.setting)
        raise SizingError(
            f"{label} {exc.value!r} {exc.problem}; fix it on the Model step",
            headline=f"The {label} {exc.value!r} {exc.problem}",
            details="Change it under Advanced settings on the Model step.",
            setting=exc.setting,
        ) from exc
    except (ValueError, TypeError) as exc:
        raise SizingError(
            f"the training settings cannot be sized ({exc}); fix them on the Model step",
            headline="The training settings cannot be sized",
            details="A value under Advanced settings on the Model step is not a number the planner can use.",
        ) from exc


def draft_workload(
    training: dict[str, Any], setup: TrainingSetup, counted: tuple[int, str] | None
) -> tuple[Workload, str]:
    """How much training the job keys ask for: the data's tokens times the epochs (or the step limit).

    Args:
        training: The draft's training keys (``epochs``, ``max_steps``, ``checkpoint_minutes``).
        setup: The planner's setup (its tokens per step size a step-limited run).
        counted: Training tokens per epoch and how they were counted; None assumes :data:`DEFAULT_TOKENS`.

    Returns:
        The workload and where its token count came from.
    """
    tokens, source = counted or (
        DEFAULT_TOKENS,
        f"{DEFAULT_TOKENS:,} tokens assumed: prepare the data for exact counts",
    )
    checkpoint = float(training.get("checkpoint_minutes", 30.0)) or 30.0
    max_steps = int(training.get("max_steps", -1) or -1)
    if max_steps > 0:
        stepped = max_steps * setup.tokens_per_step
        return Workload(tokens=stepped, epochs=1.0, checkpoint_minutes=checkpoint), f"{max_steps:,} steps at most"
    epochs = min(100.0, max(0.01, float(training.get("epochs", 3.0))))
    return Workload(tokens=tokens, epochs=epochs, checkpoint_minutes=checkpoint), source


def resolution_problem(name: str, exc: ModelResolutionError) -> tuple[str, str]:
    """Why a model cannot be sized, as (headline, what to do): offline, gated, not found or unknown."""
    causes = {cls.__name__ for cls in type(exc.__cause__).__mro__} if exc.__cause__ else set()
    if "GatedRepoError" in causes:
        return f"{name} is gated on the Hugging Face Hub", (
            f"Accept its licence at https://huggingface.co/{name}, store a Hugging Face token in Settings, then "
            "come back to this step."
        )
    if causes & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "TimeoutError"}:
        return "The Hugging Face Hub cannot be reached", (
            f"The config.json of {name} could not be fetched: this computer seems to be offline, or the Hub is "
            "unreachable. Connect and come back to this step, or choose a catalog model or a local model folder on "
            "the Model step."
        )
    reasons = {
        "not-found": (
            f"{name} is not on the Hugging Face Hub",
            "Check the spelling (org/name). If it is private or gated, store a Hugging Face token in Settings.",
        ),
        "invalid-id": (
            f"{name} is not a Hugging Face model id",
            "A Hub id looks like org/name, for example Qwen/Qwen2.5-7B-Instruct; or choose a local model folder.",
        ),
        "unreachable": (
            f"The Hugging Face Hub did not answer for {name}",
            "Try again in a moment, or choose a catalog model or a local model folder on the Model step.",
        ),
        "no-config": (
            f"{name} has no config.json",
            "Choose the folder that holds the model's files on the Model step.",
        ),
        "bad-config": (
            f"The config.json of {name} cannot be read",
            "Download the model again, or choose another model on the Model step.",
        ),
    }
    return reasons.get(exc.reason) or (
        f"{name} is not a model Rentune knows",
        "Pick a model in the catalog, type a Hub id (org/name) or choose a local model folder on the Model step.",
    )


def resolution_message(name: str, exc: ModelResolutionError) -> str:
    """Why a model cannot be sized, in one sentence: offline, gated, or unknown, each with its fix."""
    headline, details = resolution_problem(name, exc)
    lead = f"{name} cannot be sized" if name not in headline else headline
    return f"{lead}: {details[:1].lower()}{details[1:].rstrip('.')}"


def size_run(
    draft: RunDraft,
    counted: tuple[int, str] | None,
    secrets: SecretStore | None = None,
    learn: Callable[[JobKind], Learned] | None = None,
) -> Sizing:
    """Plans the draft's job: resolves the model (a folder, the catalog or the Hub) and ranks the GPU options.

    Blocking (files, maybe the network): call it in an executor.

    Args:
        draft: The run being set up.
        counted: The prepared data's training tokens per epoch and how they were counted, if known.
        secrets: Where a Hugging Face token for gated models is kept.
        learn: What the user's runs of this kind of job measured (speeds per GPU type, peak memory), with words
            naming them; the bundled catalog and the memory model alone when None.

    Raises:
        SizingError: No model chosen, the model cannot be resolved, or the settings are out of range.
    """
    if not draft.base_model:
        raise SizingError(
            "choose a base model on the Model step first",
            headline="No model chosen yet",
            details="Choose the model to fine-tune on the Model step.",
            setting="base_model",
        )
    setup = training_setup(draft.method, draft.training)
    try:
        arch = resolve_model(draft.base_model, hub_config_fetcher(secrets))
    except ModelResolutionError as exc:
        headline, details = resolution_problem(draft.base_model, exc)
        message = resolution_message(draft.base_model, exc)
        raise SizingError(message, headline=headline, details=details, setting="base_model") from exc
    except ArchitectureError as exc:
        raise SizingError(
            f"{draft.base_model} cannot be sized: {exc}; choose another model on the Model step",
            headline=f"{draft.base_model} cannot be sized",
            details=f"{str(exc)[:1].upper()}{str(exc)[1:]}. Choose another model on the Model step.",
            setting="base_model",
        ) from exc
    workload, source = draft_workload(draft.training, setup, counted)
    counts = GPU_COUNTS if setup.num_gpus == 1 else (setup.num_gpus,)
    strategy = setup.strategy if setup.num_gpus > 1 else None
    learned = learn(JobKind.of(arch, setup)) if learn is not None else Learned(list(load_gpus()), {})
    plan = make_plan(
        arch,
        setup,
        learned.gpus,
        workload,
        counts=counts,
        strategy=strategy,
        measured=learned.memory or None,
        max_nodes=NODE_COUNTS[-1] if draft.renting else 1,  # clusters are rented (RunPod); a server is one machine
    )
    return Sizing(plan, source, learned.note)


def server_gpu_gb(gpu_summary: str) -> float | None:
    """Usable memory of the own server's first GPU, from Test connection's summary (``... (81559 MiB)``)."""
    found = re.search(r"(\d+)\s*MiB", gpu_summary)
    return int(found.group(1)) / 1024 * GIB_TO_GB * USABLE_FRACTION if found else None


def server_fit_warning(gpu_summary: str, sizing: Sizing) -> str:
    """A warning when the tested own server cannot hold the job; "" when it can, or was not tested."""
    if not gpu_summary:
        return ""
    need = sizing.plan.memory.per_gpu_total
    usable = server_gpu_gb(gpu_summary)
    if usable is None:
        return (
            f"Warning: your server reported {gpu_summary}. This job needs {memory_text(need)} on a GPU; on a CPU only "
            "tiny models train in reasonable time. You can go on, or use a server with a GPU."
        )
    if need <= usable:
        return ""
    return (
        f"Warning: your server's GPU ({gpu_summary}) has about {memory_text(usable)} usable, and this job needs "
        f"{memory_text(need)} per GPU, so training would run out of memory. You can go on; to make it fit, choose "
        "QLoRA, a shorter sequence length or a smaller micro-batch on the Model step."
    )
