"""The faults a soak schedule injects, and the tally of those that fired (read from the fakes, never queued counts).

A queued fault may never meet its call (no run rented at that provider, say): only what a fake records in
:attr:`tests.fakes.http.FakeCloud.fired` counts.
"""

from __future__ import annotations

import random
from collections import Counter

from desktop.services.providers.base import ProviderName
from tests.fakes.http import CallFault, FakeCloud, FakeInstance, FaultKind, FiredFault

#: Slow answers queued at a provider at most, and how slow each is at most (seconds).
SLOW_ANSWERS = 3
SLOW_ANSWER_MAX_S = 1.5
#: The faults a create call may meet: what goes wrong, and whether the provider made the machine first.
CREATE_FAULTS = (
    (FaultKind.SERVER_ERROR, True),
    (FaultKind.TIMEOUT, True),
    (FaultKind.DROP, False),
    (FaultKind.RATE_LIMIT, False),
    (FaultKind.SERVER_ERROR, False),
    (FaultKind.TIMEOUT, False),
)
#: Every kind of fault the soak injects, as :func:`kind_of` names them: the CI seeds must fire each.
FAULT_KINDS = (
    *(f"create {kind.value}{' after acting' if after else ''}" for kind, after in CREATE_FAULTS),
    "slow answer",
    "look or list server_error",
    "look or list drop",
    "failing terminate",
    "outbid",
    "preempted",
    "lost machine",
)


def kind_of(fired: FiredFault) -> str:
    """The soak's name for a fault that fired."""
    provider_doing = {"outbid": "outbid", "preempted": "preempted", "lost": "lost machine"}
    if fired.kind in provider_doing:
        return provider_doing[fired.kind]
    if fired.kind == "failing_terminate":
        return "failing terminate"
    if fired.kind == FaultKind.SLOW.value:
        return "slow answer"
    if fired.create:
        return f"create {fired.kind}{' after acting' if fired.after_acting else ''}"
    return f"look or list {fired.kind}" if fired.method == "GET" else f"{fired.method} {fired.kind}"


def fired_kinds(clouds: dict[ProviderName, FakeCloud]) -> Counter[str]:
    """The faults that fired at the fakes, by kind."""
    tally: Counter[str] = Counter()
    for cloud in clouds.values():
        with cloud.lock:
            tally.update(kind_of(fired) for fired in cloud.fired)
    return tally


def queue_call_faults(rng: random.Random, clouds: dict[ProviderName, FakeCloud], renting: set[ProviderName]) -> None:
    """Random faults at each provider's calls: creates (where the runs rent first, so that they meet one), looks and
    lists, terminates, and spot machines outbid."""
    for name, cloud in clouds.items():
        for _ in range(rng.randint(1, 2) if name in renting else 0):
            kind, after = rng.choice(CREATE_FAULTS)
            cloud.fail_next_create(CallFault(kind, after_acting=after, status=rng.choice([502, 504])))
        if rng.random() < 0.5:
            slow = CallFault(FaultKind.SLOW, delay=rng.uniform(0.2, SLOW_ANSWER_MAX_S))
            cloud.fail_next("GET", r".", slow, times=SLOW_ANSWERS)
        if rng.random() < 0.5:
            failing = CallFault(rng.choice([FaultKind.SERVER_ERROR, FaultKind.DROP]))
            cloud.fail_next("GET", r".", failing, times=rng.randint(1, 3))
        if rng.random() < 0.4:
            cloud.faults.failing_terminates += rng.randint(1, 12)
        if name is not ProviderName.LAMBDA and rng.random() < 0.5:
            cloud.faults.outbid_after = rng.uniform(0.1, 1.0)


def take_a_machine_away(rng: random.Random, clouds: dict[ProviderName, FakeCloud]) -> bool:
    """A machine running at any provider preempted or lost (the provider's doing); False when none runs."""
    running = []
    for cloud in clouds.values():
        with cloud.lock:
            running += [(cloud, instance) for instance in cloud.instances.values() if _running(instance)]
    if not running:
        return False
    cloud, instance = rng.choice(running)
    if rng.random() < 0.5:
        cloud.preempt_instance(instance)
    else:
        cloud.lose_instance(instance)
    return True


def _running(instance: FakeInstance) -> bool:
    taken = instance.stopped is not None or "preempted" in instance.extra
    return instance.live and not taken and instance.running_since is not None


def clear_faults(clouds: dict[ProviderName, FakeCloud]) -> None:
    """Every fault switched off (a last start settles on a quiet provider)."""
    for cloud in clouds.values():
        with cloud.lock:
            cloud.faults.queued.clear()
            cloud.faults.failing_terminates = 0
            cloud.faults.outbid_after = None
