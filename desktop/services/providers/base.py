"""What every GPU cloud looks like to Rentune: offers, instances, the errors they raise, and one interface.

Each provider module (:mod:`.runpod`, :mod:`.vast`, :mod:`.lambda_cloud`) turns its API into these types, so the
rest of the app never sees a provider's own field names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from desktop.services.providers.listing import Listing


class ProviderName(StrEnum):
    """The GPU clouds Rentune rents from."""

    RUNPOD = "runpod"
    VAST = "vast"
    LAMBDA = "lambda"

    @property
    def label(self) -> str:
        """The provider's name as users know it."""
        return {"runpod": "RunPod", "vast": "Vast.ai", "lambda": "Lambda"}[self.value]


@dataclass(frozen=True)
class OfferQuery:
    """What the user asks of an offer (every field optional).

    Attributes:
        gpu: A GPU name (display name or the provider's own id, case-insensitive).
        count: GPUs per machine (None: any count the provider sells).
        min_vram_gb: Memory per GPU, at least.
        max_price_per_hour: The whole machine's price per hour, at most.
        spot: Interruptible offers (bids) instead of on-demand ones.
        disk_gb: Disk the machine needs.
        nodes: Machines rented together as one cluster (1: a single machine).
    """

    gpu: str | None = None
    count: int | None = None
    min_vram_gb: float | None = None
    max_price_per_hour: float | None = None
    spot: bool = False
    disk_gb: int = 50
    nodes: int = 1


@dataclass(frozen=True)
class Offer:
    """A machine a provider would rent out now.

    Attributes:
        provider: Who rents it.
        offer_id: The provider-specific id to create it from (opaque to everyone else).
        gpu: The GPU's display name ("RTX 4090", "A10").
        gpu_id: The provider's own GPU or type id ("NVIDIA GeForce RTX 4090", "gpu_1x_a10").
        count: GPUs in the machine.
        vram_gb: Memory per GPU, GB.
        price_per_hour: Dollars per hour for the whole machine as it bills, its disk included where the provider
            bills that by the hour (for spot: the lowest bid that wins it now, plus that disk).
        spot: Interruptible (may be taken away when outbid or preempted).
        reliability: The provider's reliability score from 0 to 1 (None where it publishes none).
        location: Region, data centre or "City, CC".
        in_stock: Whether it can be rented right now.
        nodes: Machines rented together as one cluster, each with ``count`` GPUs (``price_per_hour`` is all of
            them together).
        storage_per_hour: The part of ``price_per_hour`` that is the disk: billed whether the machine runs or not,
            and never part of a spot bid (Vast's; 0 where the price has no such part).
    """

    provider: ProviderName
    offer_id: str
    gpu: str
    gpu_id: str
    count: int
    vram_gb: float
    price_per_hour: float
    spot: bool
    reliability: float | None
    location: str
    in_stock: bool = True
    nodes: int = 1
    storage_per_hour: float = 0.0


def _squash(name: str) -> str:
    return name.lower().replace(" ", "").replace("-", "").replace("_", "").replace("nvidia", "").replace("geforce", "")


def gpu_matches(offer: Offer, name: str) -> bool:
    """Whether ``name`` names the offer's GPU: its display name or the provider's id, ignoring case and spaces."""
    key = _squash(name)
    return key in {_squash(offer.gpu), _squash(offer.gpu_id)}


def offer_matches(offer: Offer, query: OfferQuery) -> bool:
    """Whether an offer meets a query (stock is not judged here)."""
    return (
        (query.gpu is None or gpu_matches(offer, query.gpu))
        and (query.count is None or offer.count == query.count)
        and (query.min_vram_gb is None or offer.vram_gb >= query.min_vram_gb)
        and (query.max_price_per_hour is None or offer.price_per_hour <= query.max_price_per_hour)
        and offer.spot == query.spot
        and offer.nodes == query.nodes
    )


class InstanceState(StrEnum):
    """Where a rented machine stands, in the words the app acts on."""

    STARTING = "starting"  # created, not yet reachable (provisioning, loading the image, booting)
    RUNNING = "running"  # up: SSH may still take a moment
    STOPPED = "stopped"  # stopped or outbid: no GPU, but storage may still bill
    FAILED = "failed"  # the provider gave up on it (an error, a machine that will never run)
    TERMINATED = "terminated"  # gone for good; nothing bills


#: States in which the machine will never run (again): a wait for it ends at once.
LOST = frozenset({InstanceState.STOPPED, InstanceState.FAILED, InstanceState.TERMINATED})
#: States in which nothing bills and nothing will run again.
GONE = frozenset({InstanceState.TERMINATED})
#: States in which a machine bills for its GPU.
BILLING = frozenset({InstanceState.STARTING, InstanceState.RUNNING})


@dataclass(frozen=True)
class SshAddress:
    """How to log in to a rented machine."""

    host: str
    port: int
    user: str


@dataclass(frozen=True)
class Instance:
    """A machine rented from a provider.

    Attributes:
        provider: Who rents it.
        instance_id: The provider's id.
        name: Its label (Rentune names its machines ``rentune-<run id>``).
        state: Where it stands.
        price_per_hour: Dollars per hour for the whole machine.
        gpu: The GPU's display name ("" when the provider does not say).
        spot: Interruptible.
        ssh: Where to log in (None until the provider publishes an address).
        status_text: The provider's own words for its state (for messages).
        created_at: When the provider says it created the machine (epoch seconds; None where it does not say).
        ended_at: When the provider says the machine stopped billing (terminated, preempted; None where it does not
            say, or while it runs).
    """

    provider: ProviderName
    instance_id: str
    name: str
    state: InstanceState
    price_per_hour: float
    gpu: str = ""
    spot: bool = False
    ssh: SshAddress | None = None
    status_text: str = ""
    created_at: float | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class RentRequest:
    """What to rent and how to set it up.

    Attributes:
        offer: The offer to rent.
        public_key: The OpenSSH public key line allowed to log in (the run's own key).
        label: The machine's name (``rentune-<run id>``).
        image: The container image (ignored where the provider rents VMs).
        disk_gb: Disk for the container.
        bid_per_hour: For spot offers, the bid for the whole machine, its disk left out (the provider bills the
            offer's ``storage_per_hour`` on top; None: on-demand).
        on_send: Awaited right before the create request goes out (see :meth:`sending`).
    """

    offer: Offer
    public_key: str
    label: str
    image: str
    disk_gb: int = 50
    bid_per_hour: float | None = None
    on_send: Callable[[], Awaitable[None]] | None = field(default=None, compare=False, repr=False)

    async def sending(self) -> None:
        """Called by a provider right before its create request, after any setup (a key upload).

        The rental's record starts there, the earliest a machine can bill from (what a provider that reports no start
        time is booked by).
        """
        if self.on_send is not None:
            await self.on_send()


class ProviderError(RuntimeError):
    """A provider refused or failed a request; ``str()`` keeps the provider's own message.

    Attributes:
        provider: Which provider.
        message: The provider's message (or what went wrong talking to it), with the fix where there is one.
        reason: The provider's own words alone (``message`` when none were given apart).
        instance_id: A machine the failed request made and left behind (a create whose setup failed, a bid too low
            that still booked a stopped machine): whoever asked records it and terminates it until it is gone.
        status: The HTTP status of the provider's answer, or None when no answer came (or none applies).
    """

    def __init__(
        self,
        provider: ProviderName,
        message: str,
        reason: str | None = None,
        *,
        instance_id: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(f"{provider.label}: {message}")
        self.provider = provider
        self.message = message
        self.reason = reason or message
        self.instance_id = instance_id
        self.status = status


class UncertainOutcomeError(ProviderError):
    """The request may have taken effect: it was sent, then no answer came (a timeout, a drop) or a 5xx did.

    A create answered this way is never sent again: the machine is looked up by its label instead.
    """


class AuthError(ProviderError):
    """The API key was refused (missing, wrong or revoked)."""


class NoCapacityError(ProviderError):
    """The offer is gone or out of stock."""


class RateLimitedError(ProviderError):
    """Too many requests, still refused after the retries."""


class BidTooLowError(ProviderError):
    """A spot bid below what the machine costs now."""


class NoClustersError(ProviderError):
    """The provider rents no clusters (several machines networked as one) through its API."""


class SpotUnavailableError(ProviderError):
    """The provider's spot market could not be read now (RunPod's GraphQL failed, refused or is retired).

    Only the spot offers are missing: whoever lists on-demand offers too keeps them and says why spot is absent.
    """


class MissingKeyError(ProviderError):
    """No API key for the provider in the keyring or the environment."""


class Provider(Protocol):
    """One GPU cloud's API, in Rentune's types."""

    name: ProviderName

    async def check_key(self) -> None:
        """Makes a cheap authenticated call.

        Raises:
            AuthError: The key is refused.
            ProviderError: The provider cannot be reached or failed.
        """

    async def offers(self, query: OfferQuery) -> list[Offer]:
        """Offers matching ``query`` (out-of-stock ones included, marked ``in_stock=False``)."""

    async def create(self, request: RentRequest) -> Instance:
        """Rents a machine; it is usually still starting when this returns. Sent once: only a 429 is retried.

        Raises:
            NoCapacityError: The offer is gone.
            BidTooLowError: The spot bid is below the current price.
            UncertainOutcomeError: No answer, or a 5xx: a machine may exist; look it up by ``request.label``.
            ProviderError: Any other refusal; ``instance_id`` names a machine it left behind, if any.
        """

    async def complete_create(self, instance_id: str, request: RentRequest) -> None:
        """Does what :meth:`create` does after its request, for a machine found by its label after an unclear create.

        Vast.ai attaches the run's key in a second call; elsewhere the create request carried everything.

        Raises:
            ProviderError: The provider refused (the machine stays rented: terminate it).
        """

    async def get(self, instance_id: str) -> Instance:
        """The machine's state now (TERMINATED when the provider no longer knows it)."""

    async def stop(self, instance_id: str) -> None:
        """Stops the machine, keeping its disk (raises :class:`ProviderError` where there is no stop)."""

    async def terminate(self, instance_id: str) -> None:
        """Destroys the machine; a machine already gone is not an error."""

    async def instances(self) -> list[Instance]:
        """Every machine of this account that could be read (:meth:`listing`'s, its notes logged)."""

    async def listing(self) -> Listing:
        """Every machine of this account (every page), with a note per row or part of the list that was left out.

        A row that cannot be read is left out alone; a part of the account listed apart (RunPod's clusters) that
        fails leaves the rest listed.

        Raises:
            ProviderError: Nothing could be listed.
        """

    async def named(self, label: str) -> list[Instance]:
        """The machines of this account named ``label`` that are not gone (after a create whose outcome is unknown).

        Raises:
            ProviderError: The provider cannot be asked, or none was found while a row or part that may be it could
                not be read (whether it exists is unknown).
        """

    async def aclose(self) -> None:
        """Closes the HTTP client."""


def no_clusters_words(provider: ProviderName) -> str:
    """Why a provider without a cluster API cannot rent several machines as one, and what to do instead."""
    return (
        f"{provider.label} has no API for renting several machines as one cluster: rent a cluster at RunPod "
        '([compute] provider = "runpod" with nodes), or train on machines you have with [target] hosts'
    )


def named_in(instances: list[Instance], label: str) -> list[Instance]:
    """The machines named ``label`` that are not gone (a provider's :meth:`Provider.named` over its listing)."""
    return [instance for instance in instances if instance.name == label and instance.state not in GONE]
