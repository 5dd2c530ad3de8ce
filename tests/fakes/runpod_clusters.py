"""The fake RunPod's Instant Clusters: ``/v2/clusters`` in v2's shapes, each member pod a machine of its own.

``POST /clusters`` (``CreateClusterRequest``: ``name``, ``type``, ``compute`` with ``gpuTypeId``, ``gpuCountPerPod``,
``podCount`` 2..250; ``cloud``, ``registry``, ``templateId`` or any other unknown field is a 422) books one pod per
node: each boots its own sshd, as a pod does, and moves ``PROVISIONING`` → ``STARTING`` → ``RUNNING``. Members carry
``cluster: {id, rank, ip}`` (the overlay address is the loopback here, where every machine is) and the env RunPod
sets (``MASTER_ADDR``/``PRIMARY_ADDR``, ``NODE_RANK``, ``NUM_NODES``, ``NUM_TRAINERS``, ``WORLD_SIZE``). They are
left out of ``GET /pods`` unless ``includeClusterPods=true``, and ``DELETE /pods/{member}`` is a 409: only
``DELETE /clusters/{id}`` (204) ends them, all at once; the cluster then answers 404. ``GET /clusters/{id}`` has
no status of its own: ``pods.byStatus`` and ``primary`` say where it stands.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, ClassVar

from tests.fakes.http import FakeInstance, FakeRequest, FakeResponse

#: The fields ``CreateClusterRequest`` allows (any other, ``cloud`` or ``registry`` included, is a 422).
CLUSTER_FIELDS = frozenset(
    {"name", "type", "compute", "dataCenterIds", "mounts", "startSsh", "startJupyter", "image", "args", "disk", "env"}
    | {"ports"}
)
COMPUTE_FIELDS = frozenset({"gpuTypeId", "gpuCountPerPod", "podCount"})
CLUSTER_TYPES = ("APPLICATION", "TRAINING", "SLURM", "RAY")
OVERLAY_ADDRESS = "127.0.0.1"


class ClusterBook:
    """What the fake keeps per cluster: its create body and its member pods in rank order."""

    def __init__(self, cluster_id: str, body: dict[str, Any], members: list[str]) -> None:
        self.id, self.body, self.members = cluster_id, body, members
        self.created = time.time()
        self.deleted: float | None = None


class FakeClusters:
    """Mixed into :class:`~tests.fakes.runpod.FakeRunPod`: the cluster routes and their book."""

    # The pod parts of the fake come from FakeRunPod (book, pod_of, status_of) and FakeCloud (terminate_instance).
    clusters: dict[str, ClusterBook]
    instances: dict[str, FakeInstance]
    failing_lists: dict[str, int]
    as_sent: Any
    faults: Any
    book: Any
    pod_of: Any
    status_of: Any
    terminate_instance: Any
    billed_seconds: Any

    CLUSTER_ROUTES: ClassVar[list[tuple[str, str, str]]] = [
        ("GET", r"/clusters", "_list_clusters"),
        ("POST", r"/clusters", "_create_cluster"),
        ("GET", r"/clusters/(?P<cluster_id>[^/]+)", "_get_cluster"),
        ("DELETE", r"/clusters/(?P<cluster_id>[^/]+)", "_delete_cluster"),
        ("GET", r"/clusters/(?P<cluster_id>[^/]+)/pods", "_cluster_pods"),
    ]

    def _create_cluster(self, request: FakeRequest) -> FakeResponse:
        from tests.fakes.runpod import CATALOG, OUT_OF_STOCK, list_price, problem, stock

        body = request.json()
        invalid = cluster_problems(body)
        if invalid:
            return problem(422, "request body does not match the schema", invalid)
        compute = body["compute"]
        gpu_id, per_pod, pods = compute["gpuTypeId"], compute["gpuCountPerPod"], compute["podCount"]
        if gpu_id not in CATALOG:
            return problem(400, f"unknown GPU type {gpu_id!r}")
        price = list_price(gpu_id, "SECURE")
        if self.faults.out_of_stock or price is None or stock(gpu_id, "SECURE", per_pod) == "NONE":
            return problem(400, OUT_OF_STOCK)
        cluster_id = "c" + secrets.token_hex(4)
        members = [self._book_member(cluster_id, body, rank, price * per_pod).id for rank in range(pods)]
        self.clusters[cluster_id] = ClusterBook(cluster_id, body, members)
        return FakeResponse(201, self.cluster_of(self.clusters[cluster_id]))

    def _book_member(self, cluster_id: str, body: dict[str, Any], rank: int, price: float) -> FakeInstance:
        compute = body["compute"]
        env = {
            **(body.get("env") or {}),
            "MASTER_ADDR": OVERLAY_ADDRESS,
            "PRIMARY_ADDR": OVERLAY_ADDRESS,
            "NODE_RANK": str(rank),
            "NUM_NODES": str(compute["podCount"]),
            "NUM_TRAINERS": str(compute["gpuCountPerPod"]),
            "WORLD_SIZE": str(compute["podCount"] * compute["gpuCountPerPod"]),
        }
        pod_body = {
            "name": f"{body['name']}-{rank}",
            "image": body.get("image"),
            "gpu": {"id": compute["gpuTypeId"], "count": compute["gpuCountPerPod"]},
            "disk": body.get("disk", 0),
            "ports": body.get("ports") or [],
            "env": env,
        }
        instance = self.book(pod_body, "SECURE", compute["gpuCountPerPod"], round(price, 4))
        instance.extra.update(cluster=cluster_id, rank=rank)
        return instance

    def member_pods(self, cluster_id: str) -> list[FakeInstance]:
        """The cluster's pods, in rank order."""
        return [self.instances[pod_id] for pod_id in self.clusters[cluster_id].members]

    def cluster_of(self, book: ClusterBook) -> dict[str, Any]:
        """The cluster as v2's ``Cluster`` (no status of its own)."""
        pods = self.member_pods(book.id)
        by_status: dict[str, int] = {}
        for pod in pods:
            status = self.status_of(pod)
            by_status[status] = by_status.get(status, 0) + 1
        primary = pods[0]
        answer: dict[str, Any] = {
            "id": book.id,
            "name": book.body["name"],
            "type": book.body["type"],
            "compute": book.body["compute"],
            "createdAt": None,
            "pods": {"total": len(pods), "byStatus": by_status},
            "network": {"cidr": "10.65.0.0/16"},
            "primary": {"podId": primary.id, "status": self.status_of(primary)},
        }
        if self.status_of(primary) == "RUNNING" and primary.address is not None:
            answer["primary"]["sshEndpoint"] = f"{primary.address.host}:{primary.address.port}"
        return dict(self.as_sent(book.id, answer))

    def member_pod_of(self, instance: FakeInstance) -> dict[str, Any]:
        """A member as a v2 ``Pod`` with its place in the cluster (the overlay address once it runs)."""
        pod = self.pod_of(instance)
        place: dict[str, Any] = {"id": instance.extra["cluster"], "rank": instance.extra["rank"]}
        if self.status_of(instance) == "RUNNING":
            place["ip"] = OVERLAY_ADDRESS
        return {**pod, "cluster": place}

    def _live_cluster(self, cluster_id: str) -> ClusterBook | None:
        book = self.clusters.get(cluster_id)
        return book if book is not None and book.deleted is None else None

    def _list_clusters(self, request: FakeRequest) -> FakeResponse:
        from tests.fakes.runpod import problem

        if "clusters" in self.failing_lists:
            return problem(self.failing_lists["clusters"], "internal error listing clusters")
        live = [self.cluster_of(book) for book in self.clusters.values() if book.deleted is None]
        return FakeResponse(200, {"clusters": live})

    def _get_cluster(self, request: FakeRequest, cluster_id: str) -> FakeResponse:
        from tests.fakes.runpod import problem

        book = self._live_cluster(cluster_id)
        return problem(404, "Cluster not found") if book is None else FakeResponse(200, self.cluster_of(book))

    def _cluster_pods(self, request: FakeRequest, cluster_id: str) -> FakeResponse:
        from tests.fakes.runpod import problem

        if self._live_cluster(cluster_id) is None:
            return problem(404, "Cluster not found")
        return FakeResponse(200, {"pods": [self.member_pod_of(pod) for pod in self.member_pods(cluster_id)]})

    def _delete_cluster(self, request: FakeRequest, cluster_id: str) -> FakeResponse:
        from tests.fakes.runpod import problem

        book = self._live_cluster(cluster_id)
        if book is None:
            return problem(404, "Cluster not found")
        for pod in self.member_pods(cluster_id):
            self.terminate_instance(pod)
        book.deleted = time.time()
        return FakeResponse(204, None)

    def cluster_billed_usd(self, cluster_id: str) -> float:
        """Dollars RunPod bills for the cluster: each pod's price for each second it existed."""
        return sum(self.members_billed_usd(cluster_id))

    def members_billed_usd(self, cluster_id: str) -> list[float]:
        """Dollars RunPod bills for each pod of the cluster, in rank order."""
        return [pod.price_per_hour * self.billed_seconds(pod.id) / 3600 for pod in self.member_pods(cluster_id)]

    def members_billed(self, cluster_id: str) -> list[tuple[float, float]]:
        """What RunPod bills for each pod of the cluster, in rank order: its price per hour and its billed seconds."""
        return [(pod.price_per_hour, self.billed_seconds(pod.id)) for pod in self.member_pods(cluster_id)]


def booked_as_billed(booked_usd: float, billed: tuple[float, float]) -> str | None:
    """None when booked dollars are what the provider bills (``billed``: price per hour, seconds) within 1 % of the
    billed time or 1 s, whichever is more; else what differs. A tolerance in time: a row booked at $0 never passes."""
    price, seconds = billed
    booked_seconds = booked_usd * 3600 / price
    if abs(booked_seconds - seconds) <= max(0.01 * seconds, 1.0):
        return None
    return f"booked ${booked_usd:.6f} ({booked_seconds:.2f} s at ${price}/h), billed {seconds:.2f} s"


def cluster_problems(body: Any) -> list[str]:
    """What v2 would refuse in a ``CreateClusterRequest``."""
    if not isinstance(body, dict):
        return ["$: expected an object"]
    problems = [f"$: additional properties '{key}' not allowed" for key in body if key not in CLUSTER_FIELDS]
    compute = body.get("compute")
    if not body.get("name") or body.get("type") not in CLUSTER_TYPES:
        problems.append(f"$: name and type (one of {list(CLUSTER_TYPES)}) are required")
    if not isinstance(compute, dict) or set(compute) != COMPUTE_FIELDS:
        problems.append(f"$.compute: exactly {sorted(COMPUTE_FIELDS)} are required")
    elif not (isinstance(compute["podCount"], int) and 2 <= compute["podCount"] <= 250):
        problems.append("$.compute.podCount: must be from 2 to 250")
    elif not (isinstance(compute["gpuCountPerPod"], int) and compute["gpuCountPerPod"] >= 1):
        problems.append("$.compute.gpuCountPerPod: must be at least 1")
    return problems
