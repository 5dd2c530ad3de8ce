"""What a local step needs that this computer does not have yet, with sizes: asked before the step starts.

Three things can be missing: libraries (:mod:`desktop.services.local.tools`), the base model (a Hub download, whose
size the Hub tells), and llama.cpp's converters (downloaded once before the first GGUF step). Only the Hub size
needs the network; everything else is read from the disk at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from desktop.services.local.base_model import BaseAvailability, BaseState, base_availability, hub_download_bytes
from desktop.services.local.llama_cpp_source import converters_cached
from desktop.services.local.tools import LocalStep, LocalTool, missing_tools, mlx_unavailable
from desktop.services.platform.secrets import SecretStore

#: Steps that run llama.cpp's converters.
_CONVERTING = frozenset({LocalStep.GGUF, LocalStep.LORA_GGUF, LocalStep.OLLAMA})
#: Steps that read the base model.
_NEEDS_BASE = frozenset({LocalStep.MERGE, LocalStep.GGUF, LocalStep.LORA_GGUF, LocalStep.OLLAMA, LocalStep.MLX})
_NEEDS_BASE |= {LocalStep.COMPARE}


@dataclass(frozen=True)
class LocalNeeds:
    """What the steps need before they can start.

    Attributes:
        steps: The steps asked for.
        missing: Libraries to install first.
        base: Where the base model stands, or None when no step reads it.
        base_bytes: The base model's download size, when it must be downloaded and the Hub said.
        converters: Whether llama.cpp's converters will be downloaded first (once, then cached).
        impossible: Why a step cannot run on this computer at all (MLX on Windows), or None.
    """

    steps: tuple[LocalStep, ...]
    missing: tuple[LocalTool, ...]
    base: BaseAvailability | None
    base_bytes: int | None
    converters: bool
    impossible: str | None

    @property
    def base_usable(self) -> bool:
        """Whether the base model is here or can be downloaded (True when no step reads it)."""
        return self.base is None or self.base.state in (BaseState.HERE, BaseState.DOWNLOAD)

    @property
    def ready(self) -> bool:
        """Whether the steps can start (downloads they make on the way are fine)."""
        return bool(self.steps) and not self.missing and self.base_usable and self.impossible is None


def needs_now(steps: Iterable[LocalStep], base: str | None) -> LocalNeeds:
    """What the steps need, read from this computer only (no Hub size yet)."""
    asked = tuple(dict.fromkeys(steps))
    missing = missing_tools(asked)
    mlx_steps = {LocalStep.MLX, LocalStep.CHAT_MLX} & set(asked)
    return LocalNeeds(
        steps=asked,
        missing=tuple(missing),
        base=base_availability(base) if _NEEDS_BASE & set(asked) else None,
        base_bytes=None,
        converters=bool(_CONVERTING & set(asked)) and not converters_cached(),
        impossible=mlx_unavailable() if mlx_steps else None,
    )


async def local_needs(steps: Iterable[LocalStep], base: str | None, secrets: SecretStore | None = None) -> LocalNeeds:
    """What the steps need, with the base model's download size asked from the Hub when it must be downloaded."""
    needs = needs_now(steps, base)
    if needs.base is not None and needs.base.hub_id is not None:
        needs = replace(needs, base_bytes=await hub_download_bytes(needs.base.hub_id, secrets))
    return needs
