"""The trial adapter's first answers to held-out chats, in a child process (it loads the model with transformers).

``python -m desktop.services.trial.answers REQUEST.json``: the request names the base model, the adapter folder,
the chats and the most tokens per answer; the answers are printed as one JSON list of strings on the last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def answer_all(request: dict[str, Any]) -> list[str]:
    """Greedy answers of base + adapter to each chat of ``request`` (blocking; loads the model)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(request["base_model"])
    model = AutoModelForCausalLM.from_pretrained(request["base_model"]).to(device)
    model = PeftModel.from_pretrained(model, request["adapter"]).eval()
    answers = []
    for messages in request["chats"]:
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        prompt = {name: value.to(device) for name, value in encoded.items()}
        with torch.no_grad():
            output = model.generate(**prompt, max_new_tokens=int(request["max_tokens"]), do_sample=False)
        answers.append(tokenizer.decode(output[0][prompt["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    return answers


def main(argv: list[str]) -> None:
    """Reads the request file ``argv[0]`` and prints the answers as JSON."""
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    print(json.dumps(answer_all(request)))


if __name__ == "__main__":
    main(sys.argv[1:])
