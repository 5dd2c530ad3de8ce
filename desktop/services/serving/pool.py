"""The servers this app started: one per model, each stopped when asked or when the app closes.

The window's Models page serves through it; closing the app awaits :meth:`ServerPool.close`, so no server outlives
the app that started it (``rentune serve`` stops its own on Ctrl-C).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from desktop.services.local.common import LocalToolError
from desktop.services.serving.local_server import DEFAULT_CONTEXT, LocalServer, start_server


class ServerPool:
    """The running servers, keyed by the model they serve."""

    def __init__(self) -> None:
        self._servers: dict[Path, LocalServer] = {}

    def running(self) -> list[LocalServer]:
        """The servers still running, in the order they started."""
        return [server for server in self._servers.values() if server.process.returncode is None]

    def serving(self, model: Path) -> LocalServer | None:
        """The running server of ``model``, if any."""
        server = self._servers.get(model.resolve())
        return server if server is not None and server.process.returncode is None else None

    async def start(
        self, model: Path, *, port: int | None = None, lora: Path | None = None, context: int = DEFAULT_CONTEXT
    ) -> LocalServer:
        """Starts serving ``model`` (see :func:`start_server`) and keeps the server until it is stopped.

        Raises:
            LocalToolError: ``model`` is served already, or :func:`start_server` refused or failed.
        """
        if (running := self.serving(model)) is not None:
            raise LocalToolError(f"{model.name} is served already at {running.url}: stop that server first")
        server = await start_server(model, port=port, lora=lora, context=context)
        self._servers[server.model] = server
        return server

    async def stop(self, server: LocalServer) -> None:
        """Stops ``server`` and forgets it."""
        try:
            await server.stop()
        finally:
            self.forget(server)

    def forget(self, server: LocalServer) -> None:
        """Drops ``server`` once its process has ended by itself."""
        if self._servers.get(server.model) is server:
            del self._servers[server.model]

    async def close(self) -> None:
        """Stops every server (the app is closing)."""
        servers = list(self._servers.values())
        await asyncio.gather(*(self.stop(server) for server in servers), return_exceptions=True)
