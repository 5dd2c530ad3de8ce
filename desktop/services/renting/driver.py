"""Runs on rented machines: rent the cheapest matching offer, train, and terminate the moment the adapter is home.

The :class:`RentalDriver` wraps the run engine. It rents a machine labelled ``rentune-<installation>-<run id>``
(the rental is in the ledger before the create request: :mod:`.creating`), waits until SSH answers (a banner, then a
command; the host key is pinned then), points the run at it and lets the engine drive. Meanwhile it watches the
provider: a machine taken away (a spot machine outbid or preempted, any machine gone) is terminated and the run moves
to the next matching offer, resuming from the newest checkpoint at home; a machine that does nothing for
``idle_minutes`` (no trainer event, no state change, no transfer bytes moving) is terminated. A budget timer runs
from the create to the end, whatever the phase. Whatever ends the run (the adapter home, a failure, a stop, the
budget) terminates the machine until its provider says it is gone (:mod:`.terminator`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from desktop.core.runs.labels import machine_label
from desktop.core.runs.spec import ComputeSpec, SshTarget
from desktop.core.runs.states import TERMINAL, RunState
from desktop.core.units import memory_text
from desktop.services.billing.ledger import Ledger, RentalState
from desktop.services.billing.meter import last_progress
from desktop.services.billing.rentals import Rental, compute_of, rental_of
from desktop.services.machines.keys import create_run_key, load_run_key
from desktop.services.machines.machine import Machine
from desktop.services.machines.ssh import Endpoint, is_refused_login
from desktop.services.platform.secrets import SecretStore
from desktop.services.platform.settings import installation_id
from desktop.services.platform.tasks import cancel_and_wait
from desktop.services.providers.base import (
    Instance,
    InstanceState,
    Offer,
    OfferQuery,
    Provider,
    ProviderError,
    ProviderName,
    RentRequest,
)
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.providers.runpod_clusters import ClusterMember
from desktop.services.renting.budget import PULL_STATES, budget_breach, budget_of
from desktop.services.renting.creating import CreateTiming, Creator
from desktop.services.renting.ending import end_rentals_first
from desktop.services.renting.reconcile import Reconciler, renting_lock
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.context import ENDED, quietly_close
from desktop.services.runs.engine import RunEngine
from desktop.services.runs.errors import RunBusyError, RunError
from desktop.services.runs.store import RunRecord

OpenProvider = Callable[[ProviderName, SecretStore], Provider]
_T = TypeVar("_T")


@runtime_checkable
class ClusterProvider(Protocol):
    """A provider that rents clusters: it lists a cluster's machines (RunPod's Instant Clusters)."""

    async def members(self, instance_id: str) -> list[ClusterMember]:
        """The cluster's machines in rank order."""


#: Seconds SSH may refuse the run's key after its banner shows before the login counts as refused (not "starting").
REFUSED_LOGIN_GRACE_S = 60.0
#: Seconds a new machine may run without a public SSH address before it is let go for the next offer. RunPod maps a
#: pod's port moments after RUNNING ("ports may take a while", SkyPilot's v2 client), but a community pod on a host
#: with no public IP never gets ``ssh.direct`` and would bill until the ready timeout (10 min by default): 90 s leaves
#: a slow mapping ample room and caps such a pod at a minute and a half.
PUBLIC_PORT_GRACE_S = 90.0
LOST_STATES = frozenset({InstanceState.STOPPED, InstanceState.FAILED, InstanceState.TERMINATED})


@dataclass(frozen=True)
class RentalOptions:
    """Timing and limits of renting.

    Attributes:
        poll_seconds: How often the provider is asked about the machine while the run trains.
        ready_poll_seconds: How often a new machine is asked whether it is up.
        max_machines: Machines one run may rent in all (spot recoveries included).
        offers_tried: Offers tried per rental when creates fail for capacity.
        budget_margin_minutes: The run is stopped this long before its budget is reached (the stop takes time).
        bid_markup: A spot bid is the lowest winning bid times this (capped at ``max_price_per_hour``).
        budget_poll_seconds: How often the budget timer compares what was spent with the budget.
        terminate_patience: Seconds a terminate is retried before the run moves on, leaving the rental
            ``terminating`` (retried in the background and at every start until the provider says it is gone).
        create: How long a create's unclear outcome is waited for.
        public_port_grace_seconds: Seconds a new machine may run without a public SSH address before it is
            terminated and the next offer tried (:data:`PUBLIC_PORT_GRACE_S`).
    """

    poll_seconds: float = 10.0
    ready_poll_seconds: float = 3.0
    max_machines: int = 5
    offers_tried: int = 3
    budget_margin_minutes: float = 3.0
    bid_markup: float = 1.05
    budget_poll_seconds: float = 5.0
    terminate_patience: float = 120.0
    create: CreateTiming = field(default_factory=CreateTiming)
    public_port_grace_seconds: float = PUBLIC_PORT_GRACE_S


class RentError(RunError):
    """No machine could be rented or brought up; nothing is left billing."""


class UnusableMachineError(RentError):
    """The new machine will never be usable: lost before it came up, or running with no public SSH address.

    It is terminated like any machine that fails to come up, and the next offer is tried.
    """


class RentalDriver:
    """Drives runs whose spec has ``[compute]``: renting, watching, recovering and terminating their machines."""

    def __init__(
        self,
        engine: RunEngine,
        *,
        ledger: Ledger | None = None,
        options: RentalOptions | None = None,
        open_provider: OpenProvider = open_provider,
        installation: str | None = None,
        terminator: Terminator | None = None,
    ) -> None:
        """Creates a driver.

        Args:
            engine: The run engine (its store, secrets and report are used).
            ledger: Where rentals are booked (the app's by default).
            options: Timing and limits.
            open_provider: Opens a provider's client (tests pass fakes).
            installation: This installation's id, carried in machine labels (the settings' by default).
            terminator: Terminates machines until gone (tests pass one with a fast clock).
        """
        self.engine, self.ctx, self.report = engine, engine.ctx, engine.report
        self.ledger = ledger or Ledger()
        self.options = options or RentalOptions()
        self._open = open_provider
        self._installation = installation
        self._clients: dict[ProviderName, Provider] = {}
        self._drives = 0  # runs this driver follows now: their provider clients are shared, closed after the last
        self.terminator = terminator or Terminator(self.ledger)
        self.creator = Creator(self.ledger, self.terminator, self.options.create)
        self._lost_at: dict[str, float | None] = {}
        self._refusals: dict[str, float] = {}
        self.ctx.spend = self.spent_with_stop
        end_rentals_first(self.ctx, self.ledger)  # every end of a run marks its machines terminating first

    # -- money -----------------------------------------------------------------------------------------------------

    def spent(self, run_id: str) -> float:
        """Dollars the run's rentals cost so far (the ledger's count)."""
        now = time.time()
        return sum(rental.usd(now) for rental in self.ledger.rentals(run_id))

    def spent_with_stop(self, run_id: str) -> float:
        """What the run will have cost once stopped now: spent, plus the stop's minutes at the current price."""
        rental = rental_of(self.ctx.store.get(run_id))
        rate = rental.price_per_hour if rental else 0.0
        return self.spent(run_id) + rate * self.options.budget_margin_minutes / 60

    # -- driving ---------------------------------------------------------------------------------------------------

    async def drive(self, run_id: str) -> RunRecord:
        """Rents (or reuses) a machine and follows the run until it ends; the machine never outlives the run.

        Cancelling this (Ctrl-C) leaves a machine that trains training: ``rentune resume`` continues. A create in
        flight is waited for (bounded) and what it made is terminated.
        """
        self._drives += 1
        try:
            if compute_of(self.ctx.store.get(run_id)) is None:
                return await self.engine.drive(run_id)
            self.ctx.driver_lock(run_id).release()  # raises RunBusyError at once when another process follows the run
            with renting_lock(self.ctx.folder(run_id)) as held:
                if not held:
                    raise RunBusyError(f"run {run_id} is already being followed by another Rentune window or CLI")
                return await self._drive_within_budget(run_id)
        except (asyncio.CancelledError, RunBusyError):
            raise  # detached, or another process follows the run (and its machine): nothing to let go here
        except BaseException as exc:
            await self._release_after(run_id, f"the run stopped on an error ({exc})")
            raise
        finally:
            self._drives -= 1
            if not self._drives:  # another run still driven here keeps using the same clients
                await self.aclose()

    async def _drive_within_budget(self, run_id: str) -> RunRecord:
        """Drives the run while a timer, independent of its events, holds it to its budget."""
        main = asyncio.ensure_future(self._drive(run_id))
        guard = asyncio.ensure_future(self._budget_guard(run_id))
        try:
            await asyncio.wait({main, guard}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (guard, main):
                await cancel_and_wait(task)
        if main.done() and not main.cancelled():
            return main.result()
        why = guard.result()
        record = self.ctx.store.get(run_id)
        if record.state is RunState.SERVING:  # trained and home: the budget ends serving, not the run's success
            self.ctx.end(run_id, RunState.FINISHED, f"adapter at {record.adapter}; serving stopped: {why}")
        elif record.state not in ENDED:
            self.ctx.fail(run_id, why)
        await self.release(run_id, why)
        return self.ctx.store.get(run_id)

    async def _budget_guard(self, run_id: str) -> str:
        """Returns why once the run's budget requires its machine to go (never, for a run without a budget)."""
        while True:
            await asyncio.sleep(self.options.budget_poll_seconds)
            record = self.ctx.store.get(run_id)
            if budget_of(record) <= 0 or not self.ledger.rentals(run_id):
                continue
            spent = self.spent(run_id)
            why = budget_breach(record, spent, self.spent_with_stop(run_id))
            if why is not None:
                return why

    async def _drive(self, run_id: str) -> RunRecord:
        compute = compute_of(self.ctx.store.get(run_id))
        assert compute is not None  # drive() sends runs without [compute] to the engine
        await self._settle_own(run_id)
        await self._drop_lost_machine(run_id)
        while True:
            record = self.ctx.store.get(run_id)
            if record.state in TERMINAL:
                await self._release_after(run_id, f"the run is {record.state.value}")
                return record
            rental = rental_of(record) or await self._rent_locked(run_id, compute)
            if rental is None:
                return self.ctx.store.get(run_id)
            record = self.ctx.store.get(run_id)  # renting pointed the run at its machine
            if rental.ready is None or not record.target:  # a process died while this machine came up
                rental = await self._bring_up_again(run_id, compute)
                if rental is None:
                    continue
            outcome = await self._follow(run_id, rental)
            if outcome is not None:
                return outcome

    async def _settle_own(self, run_id: str) -> None:
        """Settles this run's rentals an earlier process left.

        Creates without an answer, terminates not yet confirmed, and machines it rented but never recorded on the run
        (the process died in between) are terminated.
        """
        keep = rental_of(self.ctx.store.get(run_id))
        reconciler = Reconciler(
            self.ctx.store,
            self.ledger,
            self.ctx.secrets,
            open=lambda name, _s: self._client(name),
            terminator=self.terminator,
            patience=self.options.terminate_patience,
            close_clients=False,
        )
        keep_key = None if keep is None else (keep.provider.value, keep.instance_id)
        settled = await reconciler.settle_run(run_id, keep=keep_key)
        for line in settled.lines:
            self.report(line)

    async def _drop_lost_machine(self, run_id: str) -> None:
        """On a resume: a machine that went away meanwhile (outbid, stopped itself) is let go at once."""
        record = self.ctx.store.get(run_id)
        rental = rental_of(record)
        if rental is None or record.state in TERMINAL:
            return
        instance = await self._instance(rental)
        if instance is not None and instance.state in LOST_STATES:
            await self._machine_lost(run_id, rental, f"the machine is {self._lost_words(instance)}")

    async def _follow(self, run_id: str, rental: Rental) -> RunRecord | None:
        """Drives the run on its machine while watching the provider; None when it must move to another machine."""
        drive = asyncio.ensure_future(self.engine.drive(run_id))
        watch = asyncio.ensure_future(self._watch(run_id, rental))
        try:
            await asyncio.wait({drive, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (drive, watch):
                await cancel_and_wait(task)
        if drive.done() and not drive.cancelled():
            return await self._after_drive(run_id, rental, drive.result())
        if self.ctx.store.get(run_id).state in ENDED:  # gone after the run ended (its end terminates it): not lost
            return await self._after_drive(run_id, rental, self.ctx.store.get(run_id))
        lost = watch.result()
        return await self._machine_lost(run_id, rental, lost)

    async def _after_drive(self, run_id: str, rental: Rental, record: RunRecord) -> RunRecord | None:
        if record.state in ENDED:
            await self._release(run_id, rental, self._ending_words(record))
            return self.ctx.store.get(run_id)
        # Paused: the machine stopped answering. The provider says whether it is gone or just slow.
        instance = await self._instance(rental)
        if instance is not None and instance.state not in LOST_STATES:
            why = f"the machine stopped answering over SSH ({record.error})"
        else:
            why = f"the machine is {instance.state.value if instance else 'gone'} at {rental.provider.label}"
        return await self._machine_lost(run_id, rental, why)

    async def _machine_lost(self, run_id: str, rental: Rental, why: str) -> RunRecord | None:
        """Terminates a lost (or idle) machine and moves the run to a new one; None means: drive again."""
        record = self.ctx.store.get(run_id)
        if record.spec.get("serve_started") and record.adapter:  # trained and home: serving ends, nothing moves
            await self._release(run_id, rental, why)
            if self.ctx.store.get(run_id).state not in ENDED:
                self.ctx.end(run_id, RunState.FINISHED, f"adapter at {record.adapter}; served until {why}")
            return self.ctx.store.get(run_id)
        self.report(f"{why}: terminating it and continuing on a new machine from the newest checkpoint at home")
        await self._release(run_id, rental, why)
        used = len(self.ledger.machines(run_id))  # a cluster counts as one: it is rented as one
        if used >= self.options.max_machines:
            return self.ctx.fail(
                run_id, f"{why}; {used} machines were rented for this run, the limit: not renting more"
            )
        if self.ctx.store.get(run_id).state is not RunState.PAUSED:
            self.ctx.store.transition(run_id, RunState.PAUSED, why)
        return None

    def _ending_words(self, record: RunRecord) -> str:
        if record.state is RunState.FINISHED:
            return "the adapter is home"
        return f"the run is {record.state.value}" + (f" ({record.error})" if record.error else "")

    # -- watching --------------------------------------------------------------------------------------------------

    async def _watch(self, run_id: str, rental: Rental) -> str:
        """Polls the provider until the machine is lost or idle too long; returns why."""
        compute = compute_of(self.ctx.store.get(run_id))
        idle_limit = (compute.idle_minutes if compute else 0) * 60
        while True:
            await asyncio.sleep(self.options.poll_seconds)
            instance = await self._instance(rental)
            if instance is None:
                continue  # the provider did not answer: ask again, the engine keeps training meanwhile
            if instance.state in LOST_STATES:
                self._lost_at[rental.instance_id] = instance.ended_at
                return f"the {rental.provider.label} machine {rental.instance_id} was {self._lost_words(instance)}"
            idle = self._idle_seconds(run_id, rental)
            if idle_limit and idle >= idle_limit:
                return f"the machine did nothing for {idle / 60:.0f} min (idle guard: [compute] idle_minutes)"
            await self._retry_terminating(run_id)

    def _idle_seconds(self, run_id: str, rental: Rental) -> float:
        """Seconds since the run last moved (0 during the final pull, which the idle guard never interrupts)."""
        record = self.ctx.store.get(run_id)
        if record.state in PULL_STATES or record.state is RunState.SERVING:  # serving has its own idle limit
            return 0.0
        moved = last_progress(record, self.ctx.store.transitions(run_id), self.ctx.folder(run_id))
        return max(0.0, time.time() - max(moved, rental.ready or rental.created))

    async def _retry_terminating(self, run_id: str) -> None:
        """One more try at each machine of this run a terminate left ``terminating`` (it moved on meanwhile)."""
        for row in self.ledger.machines(run_id):
            if row.state is RentalState.TERMINATING and row.instance_id is not None:
                client = self._client(ProviderName(row.provider))
                if await self.terminator.attempt(client, row.instance_id):
                    self.report(f"{client.name.label} machine {row.instance_id} is terminated at last")

    @staticmethod
    def _lost_words(instance: Instance) -> str:
        words = {
            InstanceState.STOPPED: "stopped (a spot machine outbid or preempted)",
            InstanceState.FAILED: "failed at the provider",
            InstanceState.TERMINATED: "terminated by the provider",
        }[instance.state]
        return words + (f": {instance.status_text}" if instance.status_text else "")

    async def _instance(self, rental: Rental) -> Instance | None:
        try:
            return await self._client(rental.provider).get(rental.instance_id)
        except ProviderError as exc:
            self.report(f"cannot ask {rental.provider.label} about the machine now ({exc.message})")
            return None

    # -- renting ---------------------------------------------------------------------------------------------------

    async def _rent_locked(self, run_id: str, compute: ComputeSpec) -> Rental | None:
        """Rents while holding the run, so two processes following it (the app and a CLI) never both rent.

        Raises:
            RunBusyError: Another process follows the run.
        """
        with self._holding(run_id):  # the engine holds the run once it is let go
            return await self._rent_or_fail(run_id, compute)

    @contextlib.contextmanager
    def _holding(self, run_id: str) -> Iterator[None]:
        """Holds the run's driver lock while renting or bringing a machine up.

        Raises:
            RunBusyError: Another process follows the run.
        """
        lock = self.ctx.driver_lock(run_id)
        try:
            yield
        finally:
            lock.release()

    async def _rent_or_fail(self, run_id: str, compute: ComputeSpec) -> Rental | None:
        try:
            return await self.rent(run_id, compute)
        except RentError as exc:
            self.ctx.fail(run_id, str(exc))
            return None

    async def rent(self, run_id: str, compute: ComputeSpec) -> Rental:
        """Rents the cheapest matching offer, waits until it answers over SSH, and points the run at it.

        Raises:
            RentError: Nothing matching could be rented or brought up (nothing is left billing).
        """
        first = not self.ledger.rentals(run_id)
        offers = self._affordable(run_id, await self._offers(compute, first))
        problems = []
        for offer in offers[: self.options.offers_tried]:
            try:
                instance = await self._create(run_id, compute, offer)
            except ProviderError as exc:
                problems.append(self._next_offer(offer, exc.message))
                continue
            try:
                return await self._bring_up(run_id, compute, offer, instance)
            except UnusableMachineError as exc:  # terminated on the way out of _bring_up
                problems.append(self._next_offer(offer, str(exc)))
        raise RentError(f"no machine could be rented: {'; '.join(problems)}")

    def _next_offer(self, offer: Offer, why: str) -> str:
        """Says that ``offer`` failed and the next is tried; returns ``why``."""
        self.report(f"could not rent {offer.gpu} at {offer.provider.label}: {why}; trying the next")
        return why

    async def _offers(self, compute: ComputeSpec, first: bool) -> list[Offer]:
        """Matching offers in stock, cheapest first (a pinned ``offer`` only for the first machine)."""
        names = [ProviderName(compute.provider)] if first else [ProviderName(p) for p in compute.allowed_providers]
        query = OfferQuery(
            gpu=compute.gpu,
            count=compute.count,
            spot=compute.spot,
            max_price_per_hour=compute.max_price_per_hour,
            disk_gb=compute.disk_gb,
            nodes=compute.nodes,
        )
        found: list[Offer] = []
        problems: list[str] = []
        for name in names:
            try:
                found += await self._client(name).offers(query)
            except ProviderError as exc:
                problems.append(str(exc))
        found = [o for o in found if o.in_stock and (not first or not compute.offer or o.offer_id == compute.offer)]
        if not found:
            raise RentError("; ".join(problems) or self._no_offer_words(compute, names))
        return sorted(found, key=lambda o: o.price_per_hour)

    def _affordable(self, run_id: str, offers: list[Offer]) -> list[Offer]:
        """The offers the run's budget still allows: renting one must leave room to stop it.

        Raises:
            RentError: The budget would be crossed on any of them.
        """
        budget = float(self.ctx.store.get(run_id).spec.get("budget_usd") or 0.0)
        if budget <= 0:
            return offers
        spent = self.spent(run_id)
        room = [o for o in offers if spent + o.price_per_hour * self.options.budget_margin_minutes / 60 < budget]
        if not room:
            raise RentError(
                f"the budget of ${budget:,.2f} would be crossed (${spent:,.2f} spent so far, and stopping a machine "
                f"takes about {self.options.budget_margin_minutes:g} min): raise [budget] max_usd"
            )
        return room

    @staticmethod
    def _no_offer_words(compute: ComputeSpec, names: list[ProviderName]) -> str:
        wanted = f"{compute.count}x {compute.gpu or 'any GPU'}" + (" spot" if compute.spot else "")
        cap = f" at most ${compute.max_price_per_hour:g}/h" if compute.max_price_per_hour else ""
        offer = f" (offer {compute.offer})" if compute.offer else ""
        where = ", ".join(n.label for n in names)
        return (
            f"no offer in stock matches {wanted}{cap}{offer} at {where}; see rentune offers and relax [compute] "
            "gpu, max_price_per_hour or offer"
        )

    async def _create(self, run_id: str, compute: ComputeSpec, offer: Offer) -> Instance:
        """Creates the machine with its rental recorded first (:mod:`.creating`) and points the run at it."""
        bid = bid_for(offer, self.options.bid_markup, compute.max_price_per_hour) if offer.spot else None
        if offer.nodes > 1:
            self.report(
                f"renting a cluster of {offer.nodes} machines with {offer.count}x {offer.gpu} each at "
                f"{offer.provider.label} for ${offer.price_per_hour:.2f}/h (all of them)"
            )
            offer = replace(offer, gpu=f"{offer.count}x {offer.gpu}")  # each machine's, in the ledger
        else:
            self.report(
                f"renting {offer.count}x {offer.gpu} at {offer.provider.label} for ${offer.price_per_hour:.2f}/h"
            )
        info = PROVIDERS[offer.provider]
        request = RentRequest(
            offer=offer,
            public_key=await self._run_key(run_id),
            label=machine_label(await self._installation_id(), run_id),
            image=compute.image or info.default_image or "",
            disk_gb=compute.disk_gb,
            bid_per_hour=bid,
        )
        client = self._client(offer.provider)
        price = offer.price_per_hour if bid is None else bid + offer.storage_per_hour  # what it bills
        row, instance = await self.creator.create(client, run_id, request, price)
        assert row.instance_id is not None
        rental = Rental(  # a cluster's row is all its machines together (each has its own in the ledger)
            offer.provider, row.instance_id, row.gpu, row.price_per_hour, offer.spot, offer.offer_id, row.started
        )
        self.ctx.set_spec(run_id, rental=rental.as_dict(), hourly_rate_usd=row.price_per_hour)
        return instance

    async def _run_key(self, run_id: str) -> str:
        """The run's public key for a new machine; a fresh pair when the run has none or its private half is gone.

        Raises:
            RunError: The keyring would not keep a new private key (the machine could not be reached with it).
        """
        existing = self.ctx.store.get(run_id).spec.get("run_key_public")
        if isinstance(existing, str) and existing and await asyncio.to_thread(load_run_key, run_id) is not None:
            return existing
        public = await asyncio.to_thread(create_run_key, run_id)
        if not public:
            raise RunError(
                "the keyring would not keep this run's new SSH key, so a rented machine could not be reached: unlock "
                "the keyring (or install one) and resume the run"
            )
        self.ctx.set_spec(run_id, run_key_public=public, run_key_installed=False)
        return public

    async def _installation_id(self) -> str:
        if self._installation is None:
            self._installation = await asyncio.to_thread(installation_id)
        return self._installation

    async def _bring_up(self, run_id: str, compute: ComputeSpec, offer: Offer, instance: Instance) -> Rental:
        """Waits until the new machine answers, pins its host key and points the run at it; terminates on failure."""
        rental = await self._point_at_machine(run_id, compute)
        if compute.nodes == 1:
            await self._predict(run_id, offer, rental)
        return rental

    async def _bring_up_again(self, run_id: str, compute: ComputeSpec) -> Rental | None:
        """Waits again for a machine an earlier process rented and died before it came up (its boot is paid for).

        Returns:
            The rental, up; None when the machine is terminated: unusable (the next one is rented), or not up in time
            (the run fails, as when renting).
        """
        self.report("the machine was still coming up when Rentune last stopped: waiting for it again")
        with self._holding(run_id):  # while it comes up, as while renting
            try:
                return await self._point_at_machine(run_id, compute)
            except UnusableMachineError as exc:
                self.report(f"{exc}: renting another")
            except RentError as exc:
                self.ctx.fail(run_id, str(exc))
        return None

    async def _point_at_machine(self, run_id: str, compute: ComputeSpec) -> Rental:
        """Waits until the run's new machine answers, pins its host key and points the run at it (terminated if not).

        Raises:
            UnusableMachineError: The provider gave up on it, or it never got a public SSH address.
            RentError: It did not come up in time.
        """
        rental = rental_of(self.ctx.store.get(run_id))
        assert rental is not None
        try:
            if compute.nodes > 1:
                target = await self._place_cluster(run_id, compute, rental)
            else:
                target, host_key = await self._wait_ready(run_id, compute, rental)
        except BaseException as exc:
            why = str(exc) if isinstance(exc, RentError) else f"bringing it up failed ({exc})"
            await self._release(run_id, rental, why)
            raise
        rental = replace(rental, ready=time.time())
        self.ctx.set_spec(run_id, rental=rental.as_dict(), self_stop=self_stop_settings(compute, rental))
        if compute.nodes == 1:
            self.engine.retarget(run_id, target, rented=True, host_key=host_key)
        waited = rental.ready - rental.created if rental.ready else 0.0
        self.report(f"machine {rental.instance_id} is up after {waited:.0f} s: {target.url}")
        return rental

    async def _predict(self, run_id: str, offer: Offer, rental: Rental) -> None:
        """Stores what sizing predicts for this GPU and price (first machine only), to compare with what it measures."""
        record = self.ctx.store.get(run_id)
        stored = record.spec.get("predicted")
        if isinstance(stored, dict) and stored.get("tokens_per_s"):  # this machine's (or a measured) prediction
            return  # the wizard's estimate for the picked offer has no speed: the machine's own replaces it
        from desktop.services.runs.estimates import calibrated_gpus, predict

        def estimate() -> dict[str, Any] | None:
            gpus, _ = calibrated_gpus(self.ctx.store)
            return predict(record.spec, offer.gpu, offer.count, rental.price_per_hour, gpus)

        try:
            predicted = await asyncio.to_thread(estimate)
        except Exception as exc:  # noqa: BLE001 - an estimate is a nicety: training goes on without one
            self.report(f"no estimate for this machine ({exc})")
            return
        if predicted is not None:
            self.ctx.set_spec(run_id, predicted=predicted)
            self.report(
                f"estimate on this machine: {predicted['hours']:.2f} h, ${predicted['usd']:.2f}, "
                f"{predicted['tokens_per_s']:,.0f} tokens/s, peak {memory_text(predicted['peak_gb'])} per GPU"
            )

    async def _wait_ready(self, run_id: str, compute: ComputeSpec, rental: Rental) -> tuple[SshTarget, str]:
        """Polls until the provider says running with an address, SSH shows a banner and runs a command.

        Raises:
            UnusableMachineError: The provider gave up on it, or it ran without a public SSH address for
                :attr:`RentalOptions.public_port_grace_seconds`.
            RentError: Not up within ``ready_timeout_minutes``.
        """
        running_without_address: list[float] = []  # when the machine was first seen running without one

        async def answers(instance: Instance) -> tuple[SshTarget, str] | None:
            if instance.ssh is None:
                running_without_address[:1] = running_without_address[:1] or [time.monotonic()]
                self._check_public_port(rental, time.monotonic() - running_without_address[0])
                return None
            user = compute.user or instance.ssh.user
            target = SshTarget(user, instance.ssh.host, instance.ssh.port, python=compute.python)
            host_key = await self._ssh_answers(run_id, target)
            return None if host_key is None else (target, host_key)

        return await self._until_up(compute, rental, "machine", answers)

    def _check_public_port(self, rental: Rental, waited: float) -> None:
        """Gives up a machine that has run without a public SSH address for the grace.

        Raises:
            UnusableMachineError: ``waited`` reached :attr:`RentalOptions.public_port_grace_seconds`.
        """
        if waited >= self.options.public_port_grace_seconds:
            raise UnusableMachineError(
                f"the {rental.provider.label} machine {rental.instance_id} ran for {waited:.0f} s without a public "
                "SSH port (its host has no public IP address); it was let go"
            )

    async def _place_cluster(self, run_id: str, compute: ComputeSpec, rental: Rental) -> SshTarget:
        """Waits until every machine of a new cluster answers over SSH, then points the run's machines at them.

        Returns:
            The head's target (rank 0).

        Raises:
            RentError: Not up within ``ready_timeout_minutes``, or the provider gave up on it.
        """
        return await self._until_up(
            compute, rental, "cluster", lambda _instance: self._cluster_answers(run_id, compute, rental)
        )

    async def _until_up(
        self, compute: ComputeSpec, rental: Rental, what: str, answers: Callable[[Instance], Awaitable[_T | None]]
    ) -> _T:
        """Polls the provider until the new machine (or cluster) runs and ``answers`` finds it up over SSH.

        Raises:
            RentError: Not up within ``ready_timeout_minutes``, or the provider gave up on it.
        """
        deadline = rental.created + compute.ready_timeout_minutes * 60
        last = "no answer yet"
        while time.time() < deadline:
            instance = await self._instance(rental)
            if instance is not None:
                last = instance.status_text or instance.state.value
                if instance.state in LOST_STATES:
                    raise UnusableMachineError(f"the new {what} was {self._lost_words(instance)} before it came up")
                if instance.state is InstanceState.RUNNING:
                    found = await answers(instance)
                    if found is not None:
                        return found
                    last = "SSH not answering yet"
            await asyncio.sleep(self.options.ready_poll_seconds)
        minutes, gone = compute.ready_timeout_minutes, "deleted" if what == "cluster" else "terminated"
        raise RentError(
            f"the {rental.provider.label} {what} {rental.instance_id} was not ready after {minutes:g} min "
            f"(last: {last}); it was {gone}, nothing is billing. Try again, another offer, or raise "
            "[compute] ready_timeout_minutes"
        )

    async def _cluster_answers(self, run_id: str, compute: ComputeSpec, rental: Rental) -> SshTarget | None:
        """Points the run at the cluster once each member has a rank, a private address and answers over SSH."""
        client = self._client(rental.provider)
        members = await client.members(rental.instance_id) if isinstance(client, ClusterProvider) else []
        ready = len(members) == compute.nodes and [m.rank for m in members] == list(range(compute.nodes))
        if not ready or any(m.ssh is None or m.address is None for m in members):
            return None
        targets = []
        for member in members:
            assert member.ssh is not None
            user = compute.user or member.ssh.user
            target = SshTarget(user, member.ssh.host, member.ssh.port, python=compute.python)
            host_key = await self._ssh_answers(run_id, target)
            if host_key is None:
                return None
            targets.append((target, host_key))
        head_address = members[0].address
        assert head_address is not None
        self.engine.place_rented_nodes(run_id, targets, head_address)
        self.report(f"cluster {rental.instance_id}: {len(targets)} machines answer; they meet at {head_address}")
        return targets[0][0]

    async def _ssh_answers(self, run_id: str, target: SshTarget) -> str | None:
        """The machine's host key once SSH shows its banner and runs a command (None while it does not).

        Raises:
            RentError: SSH answers but has refused the run's key for :data:`REFUSED_LOGIN_GRACE_S` (a machine just up
                may take a moment to install it; longer, it is a refused login, not a machine still starting).
        """
        if not await ssh_banner(target.host, target.port):
            return None
        key = await asyncio.to_thread(load_run_key, run_id)
        endpoint = Endpoint(target.host, target.port, target.user, (key,) if key else ())
        machine: Machine | None = None
        try:
            machine = await self.ctx.connect(endpoint, None, 15)
            await machine.run("true", time_limit=15)
            return machine.host_key
        except Exception as exc:  # noqa: BLE001 - anything but a refused login means "not up yet"; the deadline bounds it
            if is_refused_login(exc):
                self._refused_login(run_id, target, exc)
            return None
        finally:
            if machine is not None:
                await quietly_close(machine)

    def _refused_login(self, run_id: str, target: SshTarget, exc: BaseException) -> None:
        first = self._refusals.setdefault(run_id, time.monotonic())
        if time.monotonic() - first < REFUSED_LOGIN_GRACE_S:
            return
        raise RentError(
            f"the machine at {target.host}:{target.port} refuses the run's key for {target.user} ({exc}); it was "
            "terminated. Check [compute] user (the image's login) and image (it must let the provider install the "
            "key), or try another offer"
        )

    # -- letting go ------------------------------------------------------------------------------------------------

    async def release(self, run_id: str, why: str) -> None:
        """Terminates the run's machine (if it rents one) and books the stop; safe to call again."""
        rental = rental_of(self.ctx.store.get(run_id))
        if rental is not None:
            await self._release(run_id, rental, why)

    async def _release_after(self, run_id: str, why: str) -> None:
        with contextlib.suppress(ProviderError, OSError):
            await self.release(run_id, why)

    async def _release(self, run_id: str, rental: Rental, why: str) -> None:
        """Terminates the machine until its provider says it is gone, and moves it to the run's machine history.

        A machine not confirmed gone within ``terminate_patience`` stays ``terminating`` in the ledger (billing, as
        far as every sum knows) and is retried while the run goes on, by the app in the background and at every
        start; the run is never left pointing at it.
        """
        client = self._client(rental.provider)
        gone = await self.terminator.until_gone(
            client,
            rental.instance_id,
            patience=self.options.terminate_patience,
            ended_at=self._lost_at.pop(rental.instance_id, None),
        )
        row = self.ledger.get(rental.provider.value, rental.instance_id)
        stopped = row.stopped if row is not None and row.stopped is not None else time.time()
        record = self.ctx.store.get(run_id)
        entry = {**rental.as_dict(), "stopped": stopped, "why": why, "terminating": not gone}
        self.ctx.set_spec(run_id, rental=None, machines=[*record.spec.get("machines", []), entry])
        if gone:
            self.report(f"terminated {rental.provider.label} machine {rental.instance_id} ({why})")
            return
        problem = self.terminator.why_not(rental.provider.value, rental.instance_id)
        self.report(
            f"{rental.provider.label} machine {rental.instance_id} is not terminated yet ({problem or 'no answer'}): "
            "it counts as billing and Rentune keeps terminating it until the provider says it is gone "
            "(rentune machines and rentune doctor show it)"
        )

    def _client(self, name: ProviderName) -> Provider:
        if name not in self._clients:
            self._clients[name] = self._open(name, self.ctx.secrets)
        return self._clients[name]

    async def aclose(self) -> None:
        """Closes the provider clients."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


def bid_for(offer: Offer, markup: float, max_price_per_hour: float | None) -> float:
    """The bid for a spot offer: the machine's part of its price times ``markup``.

    The disk (``storage_per_hour``) is left out of the bid, as the provider bills it on top; with a maximum price,
    the bid is at most that maximum less the disk, so the machine bills no more than the maximum.
    """
    bid = (offer.price_per_hour - offer.storage_per_hour) * markup
    if max_price_per_hour:
        bid = min(bid, max_price_per_hour - offer.storage_per_hour)
    return bid


def self_stop_settings(compute: ComputeSpec, rental: Rental) -> dict[str, Any] | None:
    """What the machine's self-stop needs (no secrets: a Lambda key is added on the way, from the keyring)."""
    if compute.self_stop_minutes <= 0:
        return None
    return {
        "provider": rental.provider.value,
        "api_url": PROVIDERS[rental.provider].url,
        "graphql_url": PROVIDERS[rental.provider].graphql_url,
        "minutes": compute.self_stop_minutes,
        "instance_id": rental.instance_id,
        # Lambda has no per-machine keys, and a cluster's head needs the user's to delete the whole cluster.
        "send_api_key": (rental.provider is ProviderName.LAMBDA or compute.nodes > 1) and compute.send_api_key,
    }


async def ssh_banner(host: str, port: int, time_limit: float = 5.0) -> bool:
    """Whether something at ``host:port`` greets like an SSH server (``SSH-``)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), time_limit)
    except (OSError, TimeoutError):
        return False
    try:
        greeting = await asyncio.wait_for(reader.read(4), time_limit)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return greeting.startswith(b"SSH-")
