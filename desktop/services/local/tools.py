"""Which local libraries each local step needs, which of them this Python can import, and how to install the rest.

Found with ``importlib.util.find_spec``: nothing heavy is imported, so asking is instant even at app start. Download
sizes are approximate (the wheels' sizes for common platforms), for telling the user what an install costs.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from desktop.services.local.facts import mlx_model_types


class LocalStep(StrEnum):
    """A local step the app offers, by what it needs."""

    MERGE = "merge"
    GGUF = "gguf"
    LORA_GGUF = "lora_gguf"
    OLLAMA = "ollama"
    MLX = "mlx"
    COMPARE = "compare"
    CHAT_GGUF = "chat_gguf"
    CHAT_MLX = "chat_mlx"


@dataclass(frozen=True)
class LocalTool:
    """A library a local step needs.

    Attributes:
        distribution: Its name on PyPI (what ``pip install`` takes).
        module: The module it is imported as.
        download_mb: About how many megabytes installing it downloads.
        builds_here: Whether pip compiles it on this computer (a C/C++ compiler and minutes of CPU).
    """

    distribution: str
    module: str
    download_mb: int
    builds_here: bool = False


def _torch() -> LocalTool:
    # The CPU build is what a laptop uses; on Linux plain `pip install torch` fetches the multi-GB CUDA build.
    return LocalTool("torch", "torch", 80 if sys.platform == "darwin" else 200)


def _mlx() -> LocalTool:
    return LocalTool("mlx[cpu]" if sys.platform == "linux" else "mlx", "mlx", 40)


_TRANSFORMERS = LocalTool("transformers", "transformers", 12)
_PEFT = LocalTool("peft", "peft", 1)
_SENTENCEPIECE = LocalTool("sentencepiece", "sentencepiece", 2)
_PROTOBUF = LocalTool("protobuf", "google.protobuf", 1)
_LLAMA_CPP = LocalTool("llama-cpp-python", "llama_cpp", 80, builds_here=sys.platform != "win32")
_MLX_LM = LocalTool("mlx-lm", "mlx_lm", 1)


def tools_for(step: LocalStep) -> list[LocalTool]:
    """The libraries ``step`` needs, in install order."""
    model = [_torch(), _TRANSFORMERS, _PEFT]
    gguf = [*model, _SENTENCEPIECE, _PROTOBUF, _LLAMA_CPP]
    needs = {
        LocalStep.MERGE: model,
        LocalStep.GGUF: gguf,
        LocalStep.LORA_GGUF: gguf,
        LocalStep.OLLAMA: gguf,
        LocalStep.MLX: [*model, _MLX_LM, _mlx()],
        LocalStep.COMPARE: model,
        LocalStep.CHAT_GGUF: [_LLAMA_CPP],
        LocalStep.CHAT_MLX: [_MLX_LM, _mlx()],
    }
    return needs[step]


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here, found without importing it (or anything heavy)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def missing_tools(steps: Iterable[LocalStep]) -> list[LocalTool]:
    """The libraries the ``steps`` need that this Python cannot import, each once, in install order."""
    found: dict[str, LocalTool] = {}
    for step in steps:
        for tool in tools_for(step):
            if tool.distribution not in found and not importable(tool.module):
                found[tool.distribution] = tool
    return list(found.values())


def mlx_unavailable() -> str | None:
    """Why MLX cannot run on this computer at all (whatever is installed), or None where it can."""
    if sys.platform == "darwin" and platform.machine() != "arm64":
        return "MLX needs a Mac with Apple Silicon; this Mac has an Intel processor"
    if sys.platform not in ("darwin", "linux"):
        return "MLX runs on Apple Silicon Macs and on Linux only"
    return None


def mlx_ready() -> bool:
    """Whether MLX models can be written and run here now."""
    return mlx_model_types()[0] is not None


def install_commands(tools: Iterable[LocalTool]) -> list[str]:
    """The command that installs ``tools``: all the pinned local tools, into Rentune's private environment.

    One answer for every install (the bundled app has no Python of its own to pip-install into); the Models page's
    Install local tools does the same.
    """
    return ["rentune tools install"] if list(tools) else []


def download_mb(tools: Iterable[LocalTool]) -> int:
    """About how many megabytes installing ``tools`` downloads."""
    return sum(tool.download_mb for tool in tools)
