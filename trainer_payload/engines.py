"""Which library loads and wraps the model: Unsloth's patched kernels when asked for and usable, else plain PEFT.

Unsloth must be imported before transformers, TRL and PEFT so its patches apply; :func:`choose_engine` is therefore
called before any of them is imported. When Unsloth cannot be used, training falls back to TRL and the reason is
reported: a paid machine should train rather than stop over an optional speed-up.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from trainer_payload.hardware import cuda_available
from trainer_payload.protocol import JobSpec

#: Unsloth wants explicit module names; these are the linear layers of Llama-, Qwen-, Mistral- and Gemma-style models.
UNSLOTH_ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def unsloth_unusable_reason(spec: JobSpec) -> str | None:
    """Why Unsloth cannot train this job here, or None when it can."""
    if spec.method not in {"qlora", "lora"}:
        return f"this payload uses unsloth for LoRA and QLoRA only, not {spec.method}"
    if spec.num_gpus > 1:
        return "unsloth trains on one GPU; this job asks for several"
    if importlib.util.find_spec("unsloth") is None:
        return "unsloth is not installed on this machine"
    if not cuda_available():
        return "unsloth needs an NVIDIA GPU and this machine has none"
    return None


def choose_engine(spec: JobSpec) -> tuple[str, str]:
    """Picks the engine and imports Unsloth first when it is used.

    Returns:
        The engine used (``trl`` or ``unsloth``) and a sentence for the ``preparing`` event.
    """
    if spec.engine != "unsloth":
        return "trl", "trl"
    reason = unsloth_unusable_reason(spec)
    if reason is None:
        try:
            import unsloth  # noqa: F401 - imported for its patches, before transformers
        except Exception as exc:  # noqa: BLE001 - a broken optional install must not cost the run
            reason = f"unsloth failed to import ({type(exc).__name__}: {exc})"
    if reason is not None:
        return "trl", f"trl (unsloth was requested, but {reason}; training on plain TRL instead)"
    return "unsloth", "unsloth"


def load_unsloth(spec: JobSpec) -> tuple[Any, Any]:
    """Loads the model with Unsloth (4-bit for QLoRA) and wraps it in its LoRA adapter.

    Returns:
        The PEFT-wrapped model and its tokenizer.
    """
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=spec.base_model,
        max_seq_length=spec.seq_len,
        dtype=None,  # Unsloth picks bf16 where the card has it
        load_in_4bit=spec.method == "qlora",
    )
    targets = UNSLOTH_ALL_LINEAR if spec.target_modules == "all-linear" else spec.target_modules
    model = FastLanguageModel.get_peft_model(
        model,
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=targets,
        bias="none",
        use_gradient_checkpointing="unsloth" if spec.gradient_checkpointing else False,
        random_state=spec.seed,
    )
    return model, tokenizer
