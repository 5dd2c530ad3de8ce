"""Words for the local models in the app: sizes, what each output is, what a delete loses, errors without CLI flags.

The local services name the command-line fix in their messages ("pass --base MODEL"); in the app the fix is a field
or a button, so :func:`people_words` says that instead.
"""

from __future__ import annotations

import re

from desktop.core.runs.progress import format_duration
from desktop.core.runs.states import RunState
from desktop.services.local.inventory import ExportedItem, ExportKind
from desktop.services.local.tools import LocalTool
from desktop.services.runs.adapters import ReturnedAdapter
from desktop.ui.app_words import app_sentence, sentence
from desktop.ui.run_words import STATE_WORDS

#: (pattern, replacement) for the command-line hints in the local tools' messages.
_CLI_HINTS: list[tuple[str, str]] = [
    (r"pass (?:the )?--base (?:MODEL|FOLDER)(?: it was trained on)?", "choose the base model it was trained on"),
    (r"pass the --base it was trained on", "choose the base model it was trained on"),
    (r",? ?or pass --base with a Hub id", ", or choose a Hugging Face model id as the base"),
    (r"choose another --out", "choose another folder"),
    (r"add --gguf TYPE or --lora-gguf", "also make a GGUF or a GGUF LoRA"),
    (r"\(?rentune export --(?:gguf \w+|lora-gguf|mlx|merge)\)?", "(export one on the Models page)"),
    (r"merge again with rentune export", "export it again on the Models page"),
    (r"write it with rentune export --mlx", "export it again as MLX on the Models page"),
    (r"\(?rentune pull \S+\)?", "(bring it home again from the monitor)"),
    (r"\(?see rentune runs\)?|\(rentune runs shows each run's adapter\)", ""),
    (r"\(Models page, or rentune tools install[^)]*\)", "(see below)"),
    (r"run the command again", "try again"),
    (r"rentune tools install adds it", "installing the local tools adds it"),
    (r"give another, or none to pick a free one", "choose another, or Any free port"),
    (r"--engine mlx", "MLX"),
    (r"--lora", "a LoRA"),
]


def people_words(message: str) -> str:
    """A local tool's message as a sentence for the app: its command-line hints said as the app's fixes."""
    text = message
    for pattern, replacement in _CLI_HINTS:
        text = re.sub(pattern, replacement, text)
    return app_sentence(text)


def size_text(count: int | None) -> str:
    """Bytes for people: ``812 KB``, ``52.4 MB``, ``1.27 GB``; an em dash when unknown."""
    if count is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            value = count / scale
            digits = 2 if unit == "GB" else 1 if value < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{count} bytes"


def kind_text(item: ExportedItem) -> str:
    """What an export is, in a few words: ``GGUF Q4_K_M``, ``Base GGUF Q8_0``, ``Merged model``."""
    if item.kind in (ExportKind.GGUF, ExportKind.GGUF_LORA):
        name = "GGUF LoRA" if item.kind is ExportKind.GGUF_LORA else "Base GGUF" if item.of_base else "GGUF"
        text = f"{name} {item.qtype}" if item.qtype and item.kind is ExportKind.GGUF else name
        return f"{text} (damaged)" if item.damaged else text
    return {
        ExportKind.MERGED: "Merged model",
        ExportKind.MLX: "MLX model",
        ExportKind.MODELFILE: "Ollama Modelfile",
        ExportKind.COMPARE_REPORT: "Compare report",
    }[item.kind]


def item_name(item: ExportedItem) -> str:
    """The name shown for an export: its file or folder name (a report: ``compare/report.html``)."""
    if item.kind is ExportKind.COMPARE_REPORT:
        return f"{item.path.parent.name}/{item.path.name}"
    return item.path.name


def adapter_title(adapter: ReturnedAdapter) -> str:
    """Which adapter it is: ``the adapter of run abc`` or ``the step-40 checkpoint of run abc``."""
    if adapter.step is None:
        return f"the adapter of run {adapter.run_id}"
    return f"the step-{adapter.step} checkpoint of run {adapter.run_id}"


def adapter_kind(adapter: ReturnedAdapter) -> str:
    """The Models list's "What" for an adapter: ``LoRA adapter`` or ``Checkpoint, step 40 (run stopped)``."""
    if adapter.step is None:
        return "LoRA adapter"
    state = STATE_WORDS[RunState(adapter.state)].lower()  # the words the Runs page and the monitor use
    ended = "" if adapter.state == RunState.FINISHED.value else f" (run {state})"
    return f"Checkpoint, step {adapter.step}{ended}"


def spend_text(adapter: ReturnedAdapter) -> str:
    """What the run cost: ``$3.40``, or words when nothing priced it."""
    if adapter.usd is None:
        return "no cost recorded"
    return f"${adapter.usd:,.2f}"


def adapter_summary(adapter: ReturnedAdapter) -> str:
    """One line about an adapter: base model, training time, cost and where it lies."""
    base = adapter.source.base or "an unnamed base model"
    trained = f"Trained on {base} for {format_duration(adapter.trained_seconds)}, {spend_text(adapter)}."
    if adapter.step is not None:
        return (
            f"{sentence(adapter_title(adapter))} A checkpoint is a LoRA adapter of its step: export it, compare it "
            f"and chat with it like a finished one. The run: {trained[0].lower()}{trained[1:]} "
            f"Folder: {adapter.source.adapter}"
        )
    return f"{trained} Adapter folder: {adapter.source.adapter}"


def adapter_loss(adapter: ReturnedAdapter) -> str:
    """What deleting an adapter loses, named exactly (the run, its training time and cost, whether it comes back)."""
    lost = (
        f"The adapter of run {adapter.run_id}, trained for {format_duration(adapter.trained_seconds)}, "
        f"{spend_text(adapter)}"
    )
    if adapter.rented or not adapter.target:
        return f"{lost} — it cannot be downloaded again: the machine it trained on was released."
    where = f" in {adapter.remote_dir}" if adapter.remote_dir else ""
    return (
        f"{lost} — it cannot be brought home again from Rentune. A copy may still be on {adapter.target}{where}, "
        "unless that folder was cleaned up."
    )


def export_loss(item: ExportedItem, origin: str) -> str:
    """What deleting an export loses, and that it can be made again from its adapter."""
    return (
        f"{kind_text(item)} {item_name(item)} ({size_text(item.bytes)}), exported from {origin}. "
        "It can be exported again while the adapter is here."
    )


def tools_text(tools: list[LocalTool]) -> str:
    """The libraries to install, with their download size: ``torch, peft (about 201 MB)``."""
    names = ", ".join(tool.distribution for tool in tools)
    size = sum(tool.download_mb for tool in tools)
    built = [tool.distribution for tool in tools if tool.builds_here]
    extra = f"; {', '.join(built)} is compiled on this computer, which takes a few minutes" if built else ""
    return f"{names} (about {size} MB to download{extra})"
