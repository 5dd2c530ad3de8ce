"""Terminating a rented machine until its provider says it is gone, and booking its end in the ledger.

A terminate request that fails (the provider is down, rate limits, answers 5xx) is retried with backoff. A terminate
that is accepted is not yet the end: the machine counts as gone only once the provider reports it terminated (or no
longer knows it). Until then its ledger row stays ``terminating`` and counts as billing everywhere; whoever gives up
waiting (a bounded wait) leaves it so, and the next start of the app or the CLI carries on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from desktop.services.billing.ledger import Ledger
from desktop.services.providers.base import GONE, AuthError, Instance, MissingKeyError, Provider, ProviderError

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
#: Seconds between attempts: quick at first, then once a minute.
BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: A provider's end time more than this far in the future is not believed (its clock or a wrong field).
CLOCK_SLACK_S = 120.0


@dataclass
class Terminator:
    """Terminates machines until gone and closes their ledger rows with the provider's own end time.

    Attributes:
        ledger: Where the rental's state and end are written.
        sleep: Waits between attempts (tests pass a fast one).
        clock: The time now (unix seconds).
        backoff: Seconds between attempts, the last repeated.
    """

    ledger: Ledger
    sleep: Sleep = asyncio.sleep
    clock: Clock = time.time
    backoff: tuple[float, ...] = BACKOFF_SECONDS
    last_error: dict[str, str] = field(default_factory=dict)
    _refused_key: dict[str, bool] = field(default_factory=dict)
    _accepted: dict[str, float] = field(default_factory=dict)

    async def until_gone(
        self, client: Provider, instance_id: str, *, patience: float | None = None, ended_at: float | None = None
    ) -> bool:
        """Terminates the machine and asks until the provider says it is gone; True once it is (ledger closed).

        Args:
            client: The machine's provider.
            instance_id: The machine.
            patience: Seconds to keep trying (None: until gone). When it runs out the row stays ``terminating``.
            ended_at: When the provider said the machine stopped billing before it was terminated (preempted,
                stopped itself), used when the terminated machine reports no end of its own.
        """
        self.ledger.terminating(client.name.value, instance_id)
        deadline = None if patience is None else self.clock() + patience
        attempt = 0
        while True:
            if await self.attempt(client, instance_id, ended_at=ended_at):
                return True
            if self._hopeless(client, instance_id) or (deadline is not None and self.clock() >= deadline):
                return False
            await self.sleep(self.backoff[min(attempt, len(self.backoff) - 1)])
            attempt += 1

    async def attempt(self, client: Provider, instance_id: str, *, ended_at: float | None = None) -> bool:
        """One look, then (unless already gone) one terminate request and one more look.

        True when the machine is gone (its ledger row then ``ended``). The look first finds a machine an earlier
        request (perhaps of a process that died before its answer) already ended: its end is that request's time.
        """
        key = f"{client.name.value}:{instance_id}"
        provider = client.name.value
        try:
            instance = await client.get(instance_id)
            if instance.state in GONE:
                self.book_end(instance, ended_at, self.ledger.last_stop_sent(provider, instance_id))
                return True
            self.ledger.stop_sent(provider, instance_id, self.clock())
            await client.terminate(instance_id)
            accepted = self._accepted.setdefault(key, self.clock())  # the first accepted terminate ended it
            instance = await client.get(instance_id)
        except ProviderError as exc:
            self.last_error[key] = exc.message
            self._refused_key[key] = isinstance(exc, (AuthError, MissingKeyError))
            return False
        if instance.state not in GONE:
            self.last_error[key] = f"the provider still says {instance.status_text or instance.state.value}"
            return False
        self.last_error.pop(key, None)
        self.book_end(instance, ended_at, accepted)
        return True

    def book_end(self, instance: Instance, ended_at: float | None = None, accepted: float | None = None) -> None:
        """Closes the machine's rental at the provider's end time when it reports a believable one.

        Else at the moment the provider accepted the terminate that ended it (an estimate: the machine was gone by
        the next look), or now.
        """
        now = self.clock()
        ended = instance.ended_at if instance.ended_at is not None else ended_at
        if ended is not None and ended <= now + CLOCK_SLACK_S:
            self.ledger.close(instance.provider.value, instance.instance_id, min(ended, now), estimated=False)
        else:
            self.ledger.close(instance.provider.value, instance.instance_id, accepted or now, estimated=True)

    def _hopeless(self, client: Provider, instance_id: str) -> bool:
        """Whether retrying now cannot help: the key is missing or refused (the user must act; later starts retry)."""
        return self._refused_key.get(f"{client.name.value}:{instance_id}", False)

    def why_not(self, provider: str, instance_id: str) -> str:
        """The last reason the machine was not yet gone ("" when none is known)."""
        return self.last_error.get(f"{provider}:{instance_id}", "")
