"""Every machine at every provider, each tied to the run that owns it; Rentune's machines no live run owns are orphans.

Rentune names its machines ``rentune-<run id>``. Such a machine is an orphan when that run is unknown here, has
ended or has failed, or rents another machine now: nothing will use it, yet it bills. Machines with other names are
the user's own and are never touched.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from desktop.core.runs.states import TERMINAL, RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.meter import BillingMachine
from desktop.services.billing.rentals import Rental, rental_of
from desktop.services.platform.secrets import SecretSource, SecretStore, SecretStoreError
from desktop.services.providers.base import BILLING, GONE, Instance, InstanceState, ProviderError, ProviderName
from desktop.services.providers.market import OpenProvider, gather_instances
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.runs.store import RunStore

#: The prefix of the machines Rentune rents.
MACHINE_PREFIX = "rentune-"


@dataclass(frozen=True)
class Machine:
    """A machine at a provider and who owns it.

    Attributes:
        instance: The provider's machine.
        run_id: The live run it belongs to (None when no live run owns it).
        orphan: Rentune rented it, no live run owns it, and it still exists.
    """

    instance: Instance
    run_id: str | None
    orphan: bool


@dataclass(frozen=True)
class MachinesReport:
    """Every machine of the user's accounts.

    Attributes:
        machines: One per machine, by provider and name.
        notes: One line per provider left out, and why.
        unkeyed: The providers left out for want of an API key.
        answered: The providers that answered (the list is complete only for them).
    """

    machines: list[Machine]
    notes: list[str]
    unkeyed: list[ProviderName]
    answered: list[ProviderName]

    @property
    def orphans(self) -> list[Machine]:
        """The machines no live run owns."""
        return [machine for machine in self.machines if machine.orphan]


def live_runs(store: RunStore) -> dict[str, Rental | None]:
    """The runs that may still use a machine (not ended, not failed), each with the machine it rents now."""
    return {
        record.id: rental_of(record)
        for record in store.all()
        if record.state not in TERMINAL and record.state is not RunState.FAILED
    }


def owner(instance: Instance, live: dict[str, Rental | None]) -> str | None:
    """The live run a machine belongs to, read from its name (None for another name or no live run).

    A run that records the machine it rents owns only that one: another machine with its name is a leftover (a
    machine it moved away from that could not be terminated then).
    """
    if not instance.name.startswith(MACHINE_PREFIX):
        return None
    run_id = instance.name.removeprefix(MACHINE_PREFIX)
    if run_id not in live:
        return None
    rental = live[run_id]
    if rental is not None and (rental.provider, rental.instance_id) != (instance.provider, instance.instance_id):
        return None
    return run_id


def _machine(instance: Instance, live: dict[str, Rental | None]) -> Machine:
    run_id = owner(instance, live)
    ours = instance.name.startswith(MACHINE_PREFIX)
    return Machine(instance, run_id, ours and run_id is None and instance.state not in GONE)


async def list_machines(
    store: RunStore,
    secrets: SecretStore | None,
    names: list[ProviderName],
    *,
    open: OpenProvider = open_provider,
) -> MachinesReport:
    """Lists every machine at every provider with a key, each with its live run or marked an orphan.

    Args:
        store: The runs.
        secrets: Where API keys are read (the keyring and the environment by default).
        names: The providers to ask.
        open: Opens a provider's client (tests inject their own).
    """
    found = await gather_instances(names, secrets, open=open)
    live = live_runs(store)
    machines = [_machine(instance, live) for instance in found.instances]
    machines.sort(key=lambda m: (m.instance.provider.value, m.instance.name, m.instance.instance_id))
    return MachinesReport(machines, found.notes, found.unkeyed, found.answered)


def billing_rate(instances: list[Instance]) -> float:
    """Dollars per hour the machines bill now (those starting or running)."""
    return sum(instance.price_per_hour for instance in instances if instance.state in BILLING)


def burn_rate(report: MachinesReport) -> float:
    """Dollars per hour the orphans bill now (those starting or running)."""
    return billing_rate([machine.instance for machine in report.orphans])


async def stop_orphans(
    store: RunStore,
    report: MachinesReport,
    secrets: SecretStore | None,
    *,
    open: OpenProvider = open_provider,
) -> tuple[list[Instance], list[str]]:
    """Terminates the report's orphans, checking each against the runs again first.

    A machine whose run came alive since the report, or whose name is not Rentune's, is left alone.

    Returns:
        The machines terminated, and one line per machine that could not be.
    """
    live = live_runs(store)
    doomed = [m.instance for m in report.orphans if _machine(m.instance, live).orphan]
    by_provider: dict[ProviderName, list[Instance]] = {}
    for instance in doomed:
        by_provider.setdefault(instance.provider, []).append(instance)
    results = await asyncio.gather(*(_terminate(name, group, secrets, open) for name, group in by_provider.items()))
    return [i for stopped, _ in results for i in stopped], [note for _, notes in results for note in notes]


async def _terminate(
    name: ProviderName, instances: list[Instance], secrets: SecretStore | None, open: OpenProvider
) -> tuple[list[Instance], list[str]]:
    stopped: list[Instance] = []
    notes: list[str] = []
    try:
        provider = open(name, secrets)
    except (ProviderError, SecretStoreError) as exc:
        return [], [f"{name.label}: cannot stop {len(instances)} machines: {exc}"]
    try:
        for instance in instances:
            try:
                await provider.terminate(instance.instance_id)
            except ProviderError as exc:
                notes.append(f"{name.label}: cannot stop {instance.name} ({instance.instance_id}): {exc.message}")
            else:
                stopped.append(instance)
    finally:
        await provider.aclose()
    return stopped, notes


def keyed_providers(secrets: SecretStore | None = None) -> list[ProviderName]:
    """The providers the user has an API key for (keyring or environment); none when no keyring is usable."""
    store = secrets or SecretStore()
    keyed = []
    for name in ProviderName:
        status = store.status(PROVIDERS[name].secret)
        if status.source in (SecretSource.KEYRING, SecretSource.ENVIRONMENT):
            keyed.append(name)
    return keyed


async def find_orphans(
    store: RunStore, secrets: SecretStore | None = None, *, time_limit: float = 15.0, open: OpenProvider = open_provider
) -> MachinesReport | None:
    """The machines at the providers with a key, for a look at start (None when no provider has a key).

    A provider that does not answer within ``time_limit`` is left out silently: the check is a courtesy at start,
    never a reason to wait.
    """
    try:
        names = await asyncio.to_thread(keyed_providers, secrets)
    except SecretStoreError:
        return None
    if not names:
        return None
    try:
        return await asyncio.wait_for(list_machines(store, secrets, names, open=open), time_limit)
    except TimeoutError:
        return None


async def orphan_warning(
    store: RunStore, secrets: SecretStore | None = None, *, time_limit: float = 15.0, open: OpenProvider = open_provider
) -> str | None:
    """One line warning of machines no live run owns, with what they burn (None when there are none)."""
    report = await find_orphans(store, secrets, time_limit=time_limit, open=open)
    if report is None:
        return None
    orphans = report.orphans
    if not orphans:
        return None
    listed = ", ".join(f"{m.instance.provider.label} {m.instance.instance_id} ({m.instance.name})" for m in orphans)
    one = len(orphans) == 1
    count = "1 orphaned machine (no live run owns it) bills" if one else f"{len(orphans)} orphaned machines bill"
    return f"warning: {count} ${burn_rate(report):.2f}/h: {listed}; rentune machines --stop-orphans terminates " + (
        "it" if one else "them"
    )


class MachineInUseError(RuntimeError):
    """A live run uses the machine now: stop the run instead of terminating its machine."""


async def terminate_machine(
    store: RunStore,
    machine: BillingMachine,
    secrets: SecretStore | None = None,
    *,
    ledger: Ledger | None = None,
    open: OpenProvider = open_provider,
) -> None:
    """Terminates a machine no live run uses at its provider, and books its stop in the ledger.

    Raises:
        MachineInUseError: A live run uses it now (it came alive since the reading): stop the run instead.
        ProviderError: The provider would not terminate it (the message says why).
        SecretStoreError: The provider's API key cannot be read.
    """
    if not machine.rented:
        raise MachineInUseError("an own server is not rented: stop its run instead")
    provider = ProviderName(machine.provider)
    probe = Instance(
        provider, machine.instance_id, f"rentune-{machine.run_id}", InstanceState.RUNNING, machine.rate_per_hour
    )
    if machine.run_id is not None and owner(probe, live_runs(store)) is not None:
        raise MachineInUseError(f"run {machine.run_id} uses this machine now: stop the run instead")
    client = open(provider, secrets)
    try:
        await client.terminate(machine.instance_id)
    finally:
        await client.aclose()
    await asyncio.to_thread(_book_stop, ledger, machine)


def _book_stop(ledger: Ledger | None, machine: BillingMachine) -> None:
    (ledger or Ledger()).close(machine.provider, machine.instance_id)
