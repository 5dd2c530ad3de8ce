"""Creating a machine without ever losing track of it.

The rental is written to the ledger (``creating``, with the machine's label) before the create request is sent. The
request goes once: when its outcome is unknown (no answer, a dropped connection, a 5xx, any other failure mid-way),
the provider is asked for machines with that label and the one found is adopted; none found means none was made. A
refusal that left a machine behind has it terminated. Cancelling (Stop, Ctrl-C, Quit, the budget) during a create
waits a bounded time for its answer and terminates what it made. Whatever cannot be settled now stays ``creating`` and
is settled at the next start (:mod:`.reconcile`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace

from desktop.services.billing.ledger import Ledger
from desktop.services.billing.ledger import Rental as LedgerRental
from desktop.services.providers.base import Instance, Provider, ProviderError, RentRequest, UncertainOutcomeError
from desktop.services.renting.reconcile import not_booked, started_at
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.errors import RunError


class CreateUnsettledError(RunError):
    """A create's outcome is unknown and the provider cannot be asked now: renting stops (the row stays ``creating``).

    Renting another machine now could leave two billing; the next start looks the machine up again.
    """


@dataclass(frozen=True)
class CreateTiming:
    """How long a create's outcome is waited for.

    Attributes:
        answer_wait: Seconds a cancelled create is given to answer before its machine is looked up by label.
        lookups: Times the provider is asked for machines with the label (listings can lag behind a create).
        lookup_delay: Seconds between those asks.
        terminate_patience: Seconds a machine made by a cancelled or failed create is given to be confirmed gone.
    """

    answer_wait: float = 30.0
    lookups: int = 3
    lookup_delay: float = 2.0
    terminate_patience: float = 60.0


class Creator:
    """Creates machines with their ledger rows written first (see the module's docstring).

    Args:
        ledger: Where rentals are recorded.
        terminator: Terminates machines that must not be kept.
        timing: How long outcomes are waited for.
    """

    def __init__(self, ledger: Ledger, terminator: Terminator, timing: CreateTiming | None = None) -> None:
        self.ledger, self.terminator = ledger, terminator
        self.timing = timing or CreateTiming()

    async def create(
        self, client: Provider, run_id: str, request: RentRequest, price: float
    ) -> tuple[LedgerRental, Instance]:
        """Records the intent, creates the machine once, and returns its rental (``live``; a cluster's as one) and it.

        Raises:
            ProviderError: The provider refused, or no machine turned up after an unclear answer (nothing bills).
            CreateUnsettledError: The outcome is unknown and the provider cannot be asked now.
            asyncio.CancelledError: Cancelled; whatever the create made was terminated (or is left ``creating``).
        """
        offer = request.offer
        intent = await asyncio.to_thread(  # a cluster: one row per machine (the intent is them all)
            self.ledger.intend,
            run_id,
            offer.provider.value,
            request.label,
            offer.gpu,
            price,
            offer.offer_id,
            nodes=offer.nodes,
        )

        async def sending() -> None:
            await asyncio.to_thread(self.ledger.sending, intent.id)

        task = asyncio.ensure_future(client.create(replace(request, on_send=sending)))
        billed_from = None
        try:
            instance = await asyncio.shield(task)
            billed_from = time.time()
        except asyncio.CancelledError:
            await self._after_cancel(client, intent, task)
            raise
        except UncertainOutcomeError as exc:
            instance = await self._adopt(client, intent, request, exc.message)
        except ProviderError as exc:
            await self._refused(client, intent, exc)
            raise
        except Exception as exc:  # noqa: BLE001 - anything else mid-request leaves the outcome unknown
            instance = await self._adopt(client, intent, request, f"the create failed midway ({exc})")
        return self._record(intent, instance, price, billed_from), instance

    async def _adopt(self, client: Provider, intent: LedgerRental, request: RentRequest, why: str) -> Instance:
        """The machine an unclear create made, found by its label, completed as the create would have completed it.

        Vast.ai's key, say: without it the machine would bill until the ready timeout and never let the run in.

        Raises:
            ProviderError: None has the label, or the provider refused to complete it (then it is terminated).
            CreateUnsettledError: The provider could not be asked.
        """
        instance = await self._look_up(client, intent, why)
        try:
            await client.complete_create(instance.instance_id, request)
        except ProviderError as exc:
            await self._end_made(client, intent, instance.instance_id)
            raise ProviderError(
                client.name,
                f"the machine {instance.instance_id} found after an unclear create could not be finished "
                f"({exc.message}); it was terminated",
            ) from exc
        return instance

    def _record(
        self, intent: LedgerRental, instance: Instance, price: float, billed_from: float | None = None
    ) -> LedgerRental:
        """Marks the intent ``live``, started at the provider's own time, else when the create answered.

        Without either (a machine found after an unclear answer) the intent's time stands, which is when the create
        request went out (:meth:`RentRequest.sending`): at most one request early, never late.
        """
        started = started_at(intent, instance) or billed_from
        return self.ledger.created(
            intent.id, instance.instance_id, price_per_hour=instance.price_per_hour or price, started=started
        )

    async def _refused(self, client: Provider, intent: LedgerRental, exc: ProviderError) -> None:
        """A refusal: nothing was made, unless the error names a machine it left behind (terminated here)."""
        if exc.instance_id is None:
            await asyncio.to_thread(self.ledger.not_created, intent.id)
            return
        await self._end_made(client, intent, exc.instance_id)

    async def _end_made(self, client: Provider, intent: LedgerRental, instance_id: str) -> None:
        """Books the machine a create made that the run will not use, then terminates it until it is gone."""
        self.ledger.created(intent.id, instance_id)
        await self.terminator.until_gone(client, instance_id, patience=self.timing.terminate_patience)

    async def _look_up(self, client: Provider, intent: LedgerRental, why: str) -> Instance:
        """The machine an unclear create made, found by its label (extra ones are recorded and terminated).

        Raises:
            ProviderError: None has the label: nothing was made (the row is ``not_created``).
            CreateUnsettledError: The provider could not be asked.
        """
        found = await self._named(client, intent, why)
        if not found:
            await asyncio.to_thread(self.ledger.not_created, intent.id)
            raise ProviderError(
                client.name, f"the create got no clear answer ({why}) and no machine named {intent.label} exists"
            )
        first, *extra = sorted(found, key=lambda i: i.created_at or 0.0)
        for instance in extra:
            self.ledger.open(
                intent.run_id,
                intent.provider,
                instance.instance_id,
                intent.gpu,
                intent.price_per_hour,
                label=intent.label,
            )
            await self.terminator.until_gone(client, instance.instance_id, patience=self.timing.terminate_patience)
        return first

    async def _named(self, client: Provider, intent: LedgerRental, why: str) -> list[Instance]:
        problem = ""
        for attempt in range(self.timing.lookups):
            if attempt:
                await asyncio.sleep(self.timing.lookup_delay)
            try:
                found = not_booked(self.ledger, intent.provider, await client.named(intent.label))
            except ProviderError as exc:
                problem = exc.message
                continue
            if found or attempt == self.timing.lookups - 1:
                return found
        raise CreateUnsettledError(
            f"{client.name.label} gave no clear answer to creating {intent.label} ({why}) and cannot be asked now "
            f"({problem}); the rental is recorded and Rentune looks for that machine at every start "
            "(rentune doctor lists it). Try again in a few minutes"
        )

    async def _after_cancel(self, client: Provider, intent: LedgerRental, task: asyncio.Future[Instance]) -> None:
        """Waits (bounded) for a cancelled create's answer and terminates what it made; unknown stays ``creating``."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._settle_cancelled(client, intent, task), self.timing.answer_wait * 3)

    async def _settle_cancelled(self, client: Provider, intent: LedgerRental, task: asyncio.Future[Instance]) -> None:
        done, _ = await asyncio.wait({task}, timeout=self.timing.answer_wait)
        if not done:
            task.cancel()
        error = None if not done or task.cancelled() else task.exception()
        if done and not task.cancelled() and error is None:
            instance = task.result()
        elif isinstance(error, ProviderError) and not isinstance(error, UncertainOutcomeError):
            await self._refused(client, intent, error)
            return
        else:
            instance = await self._look_up(client, intent, "cancelled while creating")
        self._record(intent, instance, intent.price_per_hour)
        await self.terminator.until_gone(client, instance.instance_id, patience=self.timing.terminate_patience)
