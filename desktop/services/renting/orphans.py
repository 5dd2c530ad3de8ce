"""Every machine at every provider, each tied to the run that owns it; Rentune's machines no live run owns are orphans.

Rentune names its machines ``rentune-<installation>-<run id>`` (:mod:`desktop.core.runs.labels`). A machine of this
installation is an orphan when its run is unknown here, has ended or has failed, or rents another machine now:
nothing will use it, yet it bills. A machine another installation rented (a second computer on the same account) is
shown as that computer's, with what it bills, and is never an orphan: stopping it takes
``--include-other-computers``. Machines with other names are the user's own and are never touched.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from desktop.core.runs.labels import parse_label
from desktop.core.runs.states import TERMINAL, RunState
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.meter import BillingMachine
from desktop.services.billing.rentals import Rental, rental_of
from desktop.services.platform.secrets import SecretSource, SecretStore, SecretStoreError
from desktop.services.platform.settings import installation_id
from desktop.services.providers.base import BILLING, GONE, Instance, ProviderError, ProviderName
from desktop.services.providers.market import PROVIDER_TIMEOUT_S, OpenProvider, gather_instances
from desktop.services.providers.registry import PROVIDERS, open_provider
from desktop.services.renting.terminator import Terminator
from desktop.services.runs.store import RunStore

#: Seconds a stopped orphan is given to be confirmed gone (it stays ``terminating`` in the ledger after that).
STOP_PATIENCE_S = 20.0


@dataclass(frozen=True)
class Machine:
    """A machine at a provider and who owns it.

    Attributes:
        instance: The provider's machine.
        run_id: The live run it belongs to (None when no live run owns it).
        orphan: This installation rented it, no live run owns it, and it still exists.
        other_computer: Another Rentune installation (a second computer on the account) rented it.
    """

    instance: Instance
    run_id: str | None
    orphan: bool
    other_computer: bool = False


@dataclass(frozen=True)
class MachinesReport:
    """Every machine of the user's accounts.

    Attributes:
        machines: One per machine, by provider and name.
        notes: One line per provider left out, and why, then one per row or part of a list left out (``unread``).
        unkeyed: The providers left out for want of an API key.
        answered: The providers that answered (the list is complete only for them, but for ``unread``).
        unread: One line per machine (or part of a provider's list) that could not be read: it may bill unseen.
    """

    machines: list[Machine]
    notes: list[str]
    unkeyed: list[ProviderName]
    answered: list[ProviderName]
    unread: list[str] = field(default_factory=list)

    @property
    def orphans(self) -> list[Machine]:
        """The machines of this installation no live run owns."""
        return [machine for machine in self.machines if machine.orphan]

    @property
    def other_computers(self) -> list[Machine]:
        """The machines another Rentune installation rented that still exist."""
        return [m for m in self.machines if m.other_computer and m.instance.state not in GONE]


def live_runs(store: RunStore) -> dict[str, Rental | None]:
    """The runs that may still use a machine (not ended, not failed), each with the machine it rents now."""
    return {
        record.id: rental_of(record)
        for record in store.all()
        if record.state not in TERMINAL and record.state is not RunState.FAILED
    }


def owner(instance: Instance, live: dict[str, Rental | None], installation: str) -> str | None:
    """The live run of this installation a machine belongs to, read from its name (None: no live run owns it).

    A run that records the machine it rents owns only that one: another machine with its name is a leftover (a
    machine it moved away from that could not be terminated then).
    """
    label = parse_label(instance.name)
    if label is None or not label.belongs_to(installation) or label.run_id not in live:
        return None
    rental = live[label.run_id]
    if rental is not None and (rental.provider, rental.instance_id) != (instance.provider, instance.instance_id):
        return None
    return label.run_id


def _machine(instance: Instance, live: dict[str, Rental | None], installation: str) -> Machine:
    label = parse_label(instance.name)
    if label is None:
        return Machine(instance, None, False)
    if not label.belongs_to(installation):
        return Machine(instance, None, False, other_computer=True)
    run_id = owner(instance, live, installation)
    return Machine(instance, run_id, run_id is None and instance.state not in GONE)


async def list_machines(
    store: RunStore,
    secrets: SecretStore | None,
    names: list[ProviderName],
    *,
    open: OpenProvider = open_provider,
    installation: str | None = None,
    limit_s: float = PROVIDER_TIMEOUT_S,
) -> MachinesReport:
    """Lists every machine at every provider with a key, each with its live run or marked an orphan.

    Args:
        store: The runs.
        secrets: Where API keys are read (the keyring and the environment by default).
        names: The providers to ask.
        open: Opens a provider's client (tests inject their own).
        installation: This installation's id (the settings' by default).
        limit_s: Seconds each provider has to answer; a slow one is left out with a note, the rest are listed.
    """
    mine = await _installation(installation)
    found = await gather_instances(names, secrets, open=open, limit_s=limit_s)
    live = live_runs(store)
    machines = [_machine(instance, live, mine) for instance in found.instances]
    machines.sort(key=lambda m: (m.instance.provider.value, m.instance.name, m.instance.instance_id))
    return MachinesReport(machines, found.notes, found.unkeyed, found.answered, found.unread)


async def _installation(given: str | None) -> str:
    """``given``, else this installation's id from the settings."""
    if given:
        return given
    return await asyncio.to_thread(installation_id)


def billing_rate(instances: list[Instance]) -> float:
    """Dollars per hour the machines bill now (those starting or running)."""
    return sum(instance.price_per_hour for instance in instances if instance.state in BILLING)


def burn_rate(report: MachinesReport) -> float:
    """Dollars per hour the orphans bill now (those starting or running)."""
    return billing_rate([machine.instance for machine in report.orphans])


def other_computers_rate(report: MachinesReport) -> float:
    """Dollars per hour the machines of other Rentune installations bill now."""
    return billing_rate([machine.instance for machine in report.other_computers])


async def stop_orphans(
    store: RunStore,
    report: MachinesReport,
    secrets: SecretStore | None,
    *,
    open: OpenProvider = open_provider,
    include_other_computers: bool = False,
    ledger: Ledger | None = None,
    installation: str | None = None,
) -> tuple[list[Instance], list[str]]:
    """Terminates the report's orphans until gone, checking each against the runs again first; closes their rentals.

    A machine whose run came alive since the report, or whose name is not Rentune's, is left alone; so is another
    installation's, unless ``include_other_computers``.

    Returns:
        The machines terminated, and one line per machine that could not be (or is not confirmed gone yet).
    """
    mine = await _installation(installation)
    live = live_runs(store)
    doomed = []
    for listed in report.machines:  # an orphan when listed, and still one now (its run may have come alive)
        now = _machine(listed.instance, live, mine)
        other = include_other_computers and listed.other_computer and now.other_computer
        if ((listed.orphan and now.orphan) or other) and listed.instance.state not in GONE:
            doomed.append(listed.instance)
    by_provider: dict[ProviderName, list[Instance]] = {}
    for instance in doomed:
        by_provider.setdefault(instance.provider, []).append(instance)
    terminator = Terminator(ledger if ledger is not None else await asyncio.to_thread(Ledger))
    results = await asyncio.gather(
        *(_terminate(name, group, secrets, open, terminator) for name, group in by_provider.items())
    )
    return [i for stopped, _ in results for i in stopped], [note for _, notes in results for note in notes]


async def _terminate(
    name: ProviderName,
    instances: list[Instance],
    secrets: SecretStore | None,
    open: OpenProvider,
    terminator: Terminator,
) -> tuple[list[Instance], list[str]]:
    stopped: list[Instance] = []
    notes: list[str] = []
    try:
        provider = open(name, secrets)
    except (ProviderError, SecretStoreError) as exc:
        return [], [f"{name.label}: cannot stop {len(instances)} machines: {exc}"]
    try:
        for instance in instances:
            if await terminator.until_gone(provider, instance.instance_id, patience=STOP_PATIENCE_S):
                stopped.append(instance)
            else:
                why = terminator.why_not(name.value, instance.instance_id)
                notes.append(f"{name.label}: cannot stop {instance.name} ({instance.instance_id}): {why}")
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

    A provider that does not answer within ``time_limit`` is left out with a note; the others are reported.
    """
    try:
        names = await asyncio.to_thread(keyed_providers, secrets)
    except SecretStoreError:
        return None
    if not names:
        return None
    return await list_machines(store, secrets, names, open=open, limit_s=time_limit)


async def orphan_warning(
    store: RunStore, secrets: SecretStore | None = None, *, time_limit: float = 15.0, open: OpenProvider = open_provider
) -> str | None:
    """One line warning of machines no live run owns, with what they burn, or of machines that could not be read.

    None when there are neither.
    """
    report = await find_orphans(store, secrets, time_limit=time_limit, open=open)
    if report is None:
        return None
    if not report.orphans:
        return unread_warning(report)
    orphans = report.orphans
    listed = ", ".join(f"{m.instance.provider.label} {m.instance.instance_id} ({m.instance.name})" for m in orphans)
    one = len(orphans) == 1
    if report.notes:
        listed += " (" + "; ".join(report.notes) + ")"
    count = "1 orphaned machine (no live run owns it) bills" if one else f"{len(orphans)} orphaned machines bill"
    return f"warning: {count} ${burn_rate(report):.2f}/h: {listed}; rentune machines --stop-orphans terminates " + (
        "it" if one else "them"
    )


def unread_warning(report: MachinesReport) -> str | None:
    """A warning that machines were left out of a provider's list, which may bill unseen (None when none were)."""
    if not report.unread:
        return None
    return (
        f"warning: machines left out of the search for orphans ({'; '.join(report.unread)}); they may bill unseen: "
        "check them at the provider's console, or run rentune machines again later"
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
    rental = live_runs(store).get(machine.run_id or "")
    if rental is not None and (rental.provider.value, rental.instance_id) == (machine.provider, machine.instance_id):
        raise MachineInUseError(f"run {machine.run_id} uses this machine now: stop the run instead")
    terminator = Terminator(ledger if ledger is not None else await asyncio.to_thread(Ledger))
    client = open(provider, secrets)
    try:
        gone = await terminator.until_gone(client, machine.instance_id, patience=STOP_PATIENCE_S)
    finally:
        await client.aclose()
    if not gone:
        why = terminator.why_not(machine.provider, machine.instance_id)
        raise ProviderError(provider, f"the machine is not terminated yet ({why}); Rentune keeps trying")
