"""RunPod Instant Clusters through REST v2 (``/clusters``): several pods rented, networked and deleted as one.

A cluster is created with ``POST /clusters`` (type ``TRAINING``; ``compute`` = GPU type, GPUs per pod, pod count),
read with ``GET /clusters/{id}`` (no status of its own: readiness comes from ``pods.byStatus``), its members with
``GET /clusters/{id}/pods`` (full Pod objects with ``cluster.rank`` and ``cluster.ip``, the private overlay address
the nodes train over), and ended with ``DELETE /clusters/{id}`` (204; every member pod goes with it; members cannot
be deleted one by one). Facts: ``../shared/reference/runpod_v2.md`` section 6.

To the rest of Rentune a cluster is one rented machine whose id is ``cluster:<id>`` (created, watched, billed and
terminated as one): :class:`~desktop.services.providers.runpod.RunPodProvider` sends such ids here. Its price is
every pod's together; its members are read apart (:func:`members_from`) to reach each node.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from desktop.services.providers.base import Instance, InstanceState, ProviderName, RentRequest, SshAddress

RUNPOD = ProviderName.RUNPOD
#: The prefix of a cluster's instance id (``cluster:<RunPod's cluster id>``), telling it from a pod's.
CLUSTER_PREFIX = "cluster:"
#: The cloud word in a cluster offer's id (``"<gpuTypeId>|CLUSTER|<GPUs per pod>|<pods>"``).
CLUSTER_CLOUD = "CLUSTER"
#: Pods a cluster may have (RunPod's ``podCount`` range).
POD_COUNT_RANGE = (2, 250)
#: Pod statuses of a member that will never run again: the cluster is lost.
LOST_POD_STATUSES = frozenset({"EXITED", "ERROR", "TERMINATED", "DEAD", "PAUSED"})


def is_cluster_id(instance_id: str) -> bool:
    """Whether an instance id names a cluster rather than a pod."""
    return instance_id.startswith(CLUSTER_PREFIX)


def cluster_id_of(instance_id: str) -> str:
    """RunPod's own id of a cluster instance id."""
    return instance_id.removeprefix(CLUSTER_PREFIX)


def cluster_offer_id(gpu_id: str, gpus_per_pod: int, pods: int) -> str:
    """The offer id of a cluster of ``pods`` pods with ``gpus_per_pod`` GPUs of a type each."""
    return f"{gpu_id}|{CLUSTER_CLOUD}|{gpus_per_pod}|{pods}"


def parse_cluster_offer_id(offer_id: str) -> tuple[str, int, int] | None:
    """The GPU type, GPUs per pod and pod count of a cluster offer id (None: a pod's offer id)."""
    parts = offer_id.rsplit("|", 3)
    if len(parts) != 4 or parts[1] != CLUSTER_CLOUD or not (parts[2].isdigit() and parts[3].isdigit()):
        return None
    return parts[0], int(parts[2]), int(parts[3])


def create_cluster_body(request: RentRequest, gpu_id: str, gpus_per_pod: int, pods: int) -> dict[str, Any]:
    """The ``CreateClusterRequest``: a training cluster, the run's key on every member, SSH on ``22/tcp``.

    No ``cloud``, ``registry`` or ``templateId`` (clusters refuse them); no ``mounts``, so nothing bills storage once
    the cluster is deleted.
    """
    return {
        "name": request.label,
        "type": "TRAINING",
        "compute": {"gpuTypeId": gpu_id, "gpuCountPerPod": gpus_per_pod, "podCount": pods},
        "image": request.image,
        "disk": request.disk_gb,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": request.public_key.strip()},
        "startSsh": True,
    }


def cluster_state(cluster: Mapping[str, Any]) -> InstanceState:
    """The cluster's state from its pods' statuses: running when every pod runs, lost when any will never run."""
    pods = cluster.get("pods") or {}
    by_status = {str(k).upper(): int(v) for k, v in (pods.get("byStatus") or {}).items() if isinstance(v, int)}
    total = int(pods.get("total") or sum(by_status.values()))
    if any(by_status.get(status, 0) for status in LOST_POD_STATUSES):
        return InstanceState.FAILED
    if total and by_status.get("RUNNING", 0) == total:
        return InstanceState.RUNNING
    return InstanceState.STARTING


def status_words(cluster: Mapping[str, Any]) -> str:
    """RunPod's pod statuses of a cluster in a few words (``2 RUNNING, 1 PROVISIONING``)."""
    by_status = (cluster.get("pods") or {}).get("byStatus") or {}
    return ", ".join(f"{count} {status}" for status, count in sorted(by_status.items()) if count) or "no pods yet"


def instance_from_cluster(cluster: Mapping[str, Any], price_per_hour: float = 0.0, gpu: str = "") -> Instance:
    """A cluster as one :class:`Instance` (its SSH address is the primary's, once it publishes one)."""
    compute = cluster.get("compute") or {}
    return Instance(
        provider=RUNPOD,
        instance_id=CLUSTER_PREFIX + str(cluster["id"]),
        name=str(cluster.get("name") or ""),
        state=cluster_state(cluster),
        price_per_hour=price_per_hour,
        gpu=gpu or f"{compute.get('podCount', '?')} x {compute.get('gpuCountPerPod', '?')}x {compute.get('gpuTypeId')}",
        ssh=None,
        status_text=status_words(cluster),
        created_at=None,
    )


@dataclass(frozen=True)
class ClusterMember:
    """One pod of a cluster, as the run reaches it.

    Attributes:
        pod_id: RunPod's pod id.
        rank: Its node rank (0: the primary, where the others meet).
        address: Its address on the cluster's private network (None until assigned).
        ssh: Where to log in to it (None until it runs with ``22/tcp`` published).
        status: RunPod's status word.
    """

    pod_id: str
    rank: int
    address: str | None
    ssh: SshAddress | None
    status: str


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def members_from(body: Mapping[str, Any], ssh_of: Any) -> list[ClusterMember]:
    """The members of ``GET /clusters/{id}/pods``, in rank order; ``ssh_of`` reads a Pod's SSH address.

    A member with no rank yet, or a rank that is not a small whole number, is left out, and an overlay address that
    is not an IP address is none (the provider's answer is untrusted input; a cluster not yet ranked is not ready).
    """
    members = []
    for pod in body.get("pods") or []:
        place = pod.get("cluster") if isinstance(pod, dict) else None
        if not isinstance(place, dict):
            continue
        rank, ip = place.get("rank"), place.get("ip")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < POD_COUNT_RANGE[1]:
            continue
        address = ip if isinstance(ip, str) and _is_ip(ip) else None
        members.append(ClusterMember(str(pod["id"]), rank, address, ssh_of(pod), str(pod.get("status") or "")))
    return sorted(members, key=lambda member: member.rank)
