"""Merging a LoRA adapter into its base, checked: ``python -m trainer_payload.merge JOB_JSON``.

One merge for both places it runs: at home, in a child Python started by :mod:`desktop.services.local.merge` (torch's
memory leaves with it, a cancel stops it at once), and on the rented machine after training
(:mod:`trainer_payload.export`). The merged model's logits on a probe prompt are compared with base + adapter
before anything is saved. As a command it prints ``progress FRACTION TEXT`` lines and one ``result JSON`` line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The prompt whose logits are compared before and after merging.
PROBE = "Write one sentence about the sea."
#: Largest allowed |merged - unmerged| logit difference, as a fraction of the largest |logit| (float32 merge).
FLOAT32_TOLERANCE = 1e-4
#: The same for a merge done in 16-bit weights (bfloat16 keeps about 3 significant digits).
HALF_TOLERANCE = 2e-2
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _say(fraction: float, text: str) -> None:
    print(f"progress {fraction:.2f} {text}", flush=True)


Say = Callable[[float, str], None]


def _probe_ids(tokenizer: Any) -> Any:
    messages = [{"role": "user", "content": PROBE}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = PROBE
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


def _tokenizer_source(adapter: Path, base: Path) -> Path:
    """The adapter's own tokenizer when the trainer saved one (it may carry the chat template used), else the base's."""
    return adapter if any((adapter / name).is_file() for name in _TOKENIZER_FILES) else base


def _compare(before: Any, after: Any, half: bool) -> dict[str, Any]:
    scale = max(float(before.abs().max()), 1.0)
    difference = float((before - after).abs().max())
    tolerance = (HALF_TOLERANCE if half else FLOAT32_TOLERANCE) * scale
    same_top = float((before.argmax(-1) == after.argmax(-1)).float().mean())
    return {
        "max_difference": difference,
        "tolerance": tolerance,
        "top1_agreement": same_top,
        "ok": difference <= tolerance,
    }


def merge(job: dict[str, Any], say: Say = _say) -> dict[str, Any]:
    """Merges the adapter into the base, checks the logits, saves a 16-bit safetensors folder with the tokenizer.

    Args:
        job: ``base`` and ``adapter`` folders, ``out``, ``stored_dtype`` (the base's) and ``half`` (merge in it).
        say: Reports progress (a fraction and words).

    Returns:
        ``check`` (the logit comparison, ``ok`` among it); when it passed, the saved ``dtype`` and the ``probe``.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, adapter, out = Path(job["base"]), Path(job["adapter"]), Path(job["out"])
    say(0.05, "loading the base model")
    stored = getattr(torch, job["stored_dtype"], torch.float32)
    half = bool(job["half"]) and stored in (torch.float16, torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=stored if half else torch.float32, low_cpu_mem_usage=True)
    tokenizer = AutoTokenizer.from_pretrained(_tokenizer_source(adapter, base))
    say(0.35, "applying the adapter")
    model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    ids = _probe_ids(tokenizer)
    with torch.no_grad():
        before = model(ids).logits.float()
        say(0.55, "merging")
        merged = model.merge_and_unload()
        check = _compare(before, merged(ids).logits.float(), half)
        check["merged_in"] = str(stored if half else torch.float32).removeprefix("torch.")
    if not check["ok"]:
        return {"check": check}
    dtype = stored if stored in (torch.float16, torch.bfloat16) else torch.bfloat16
    say(0.75, f"saving the merged model ({str(dtype).removeprefix('torch.')})")
    merged.to(dtype).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"check": check, "dtype": str(dtype).removeprefix("torch."), "probe": PROBE}


def main(argv: list[str]) -> int:
    """Runs the merge described by ``argv[1]`` (JSON) and prints its result line."""
    result = merge(json.loads(argv[1]))
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
