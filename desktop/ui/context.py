"""The services the window's pages share, built once per app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from desktop.core.runs.draft import RunDraft
from desktop.core.settings import Settings
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.drafts import load_draft
from desktop.services.runs.store import RunStore
from desktop.services.serving.pool import ServerPool

if TYPE_CHECKING:
    from desktop.services.renting.manager import RunManager
    from desktop.services.runs.engine import EngineOptions


@dataclass
class AppContext:
    """What pages need from the rest of the app: preferences, secrets, the runs and the wizard's draft.

    Attributes:
        settings: The user's preferences.
        secrets: API keys and tokens (keyring or environment).
        store: Every run recorded on this computer.
        draft: The new-run wizard's state (saved with :func:`desktop.services.runs.drafts.save_draft`).
        engine_options: Timing of the run engine (tests shorten the polling); the user's settings are applied on
            top (checkpoints kept per run).
        manager: Follows live runs in the background (launch, stop, pull, resume, reattach); made when first used,
            so the window opens before the run engine (and SSH) is loaded.
        read_only: Nothing the pages do is saved (``rentune --screenshot`` renders without changing the draft).
        servers: The OpenAI-compatible servers started from the Models page; closing the app stops them.
    """

    settings: Settings
    secrets: SecretStore
    store: RunStore = field(default_factory=RunStore)
    draft: RunDraft = field(default_factory=load_draft)
    engine_options: EngineOptions | None = None
    read_only: bool = False
    servers: ServerPool = field(default_factory=ServerPool)
    _manager: RunManager | None = field(default=None, init=False, repr=False)

    @property
    def manager(self) -> RunManager:
        """The run manager on the shared store (made on first use)."""
        if self._manager is None:
            from desktop.services.renting.manager import RunManager

            self._manager = RunManager(self.store, self.secrets, self._options())
        return self._manager

    def _options(self) -> EngineOptions:
        from desktop.services.runs.engine import EngineOptions

        # The app asks when a run's first measured steps overrun (the window answers; the tray tells)
        return (self.engine_options or EngineOptions(on_overrun="ask")).with_settings(self.settings)

    def apply_settings(self, settings: Settings) -> None:
        """Takes saved preferences: runs followed from now on (and those followed now) keep that many checkpoints."""
        self.settings = settings
        if self._manager is not None:
            self._manager.use_options(self._options())

    async def close(self) -> None:
        """Stops the servers and lets go of the runs followed (training goes on remotely; the next start reattaches)."""
        await self.servers.close()
        if self._manager is not None:
            await self._manager.close()
