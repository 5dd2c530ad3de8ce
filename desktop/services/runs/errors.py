"""The run engine's errors, in a module of their own so that pages and the tray can catch them without loading SSH."""

from __future__ import annotations

__all__ = ["RunBusyError", "RunError"]


class RunError(RuntimeError):
    """A run cannot go on; the message says why and what to do."""


class RunBusyError(RunError):
    """Another process is already driving the run."""
