"""A fake RunPod: its REST API v2 for pods and the GPU catalog, and its GraphQL API for spot only.

REST answers under ``/v2`` (and at the server's root, so ``RENTUNE_RUNPOD_URL`` may be the bare served URL) with
v2's shapes: ``{"gpus": [...]}`` from ``GET /catalog/gpus`` (``include=AVAILABILITY`` needs ``product`` and the
other way round, else 400), ``Pod`` objects, ``{"pods": [...]}``, a 201 for a create, a 204 for a delete, and RFC 9457
problem bodies ``{"title", "status", "detail", "errors"?}`` for every error. A create body with a field v2 does not
know (``interruptible``, say) is a 422, and one without ``gpu.count`` fails as "no instances available", as RunPod's
does. Pods are the :class:`~tests.fakes.http.FakeCloud` book: ``PROVISIONING`` when created, ``STARTING`` until the
machine has booted, then ``RUNNING`` with ``ssh.direct`` and ``runtime.ports`` naming its sshd as ``22/tcp``; a
stopped or outbid pod is ``EXITED`` (cost 0, no runtime); a deleted pod is gone (404, no longer listed).
:attr:`FakeRunPod.statuses` forces a pod's status (``ERROR``, say).

GraphQL (``POST /graphql``, exactly: ``/graphql/`` is a 404) serves only what Rentune still asks it: ``gpuTypes``
with spot prices and ``podRentInterruptable``. Its queries are parsed and validated for real (graphql-core against an
SDL), so a misspelt field fails as it would at RunPod, with HTTP 200 and ``errors``.
:attr:`FakeRunPod.graphql_status` makes it answer every request with one status instead
(410 once RunPod has retired it).

A pod's own key (``RUNPOD_API_KEY`` inside it, ``pod-scoped-<id>``) may only delete or stop that pod. The 401 body,
the bid-too-low message and the 404 after a delete (rather than ``TERMINATED``) are not confirmed against RunPod.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from graphql import GraphQLError, build_schema, graphql_sync

from tests.fakes.http import FakeCloud, FakeInstance, FakeRequest, FakeResponse
from tests.fakes.runpod_clusters import ClusterBook, FakeClusters

SDL = """
enum CloudTypeEnum { ALL SECURE COMMUNITY }
enum PodStatus { CREATED RUNNING RESTARTING EXITED PAUSED DEAD TERMINATED }
enum PodType { INTERRUPTABLE RESERVED }

input GpuTypeFilter { id: String cluster: Boolean }
input GpuLowestPriceInput {
  gpuCount: Int secureCloud: Boolean dataCenterId: String countryCode: String minDisk: Int minMemoryInGb: Int
  minVcpuCount: Int minCudaVersion: String
}
input EnvironmentVariableInput { key: String! value: String! }
input PodRentInterruptableInput {
  name: String imageName: String! gpuTypeId: String! cloudType: CloudTypeEnum gpuCount: Int containerDiskInGb: Int
  volumeInGb: Int volumeMountPath: String supportPublicIp: Boolean startSsh: Boolean ports: String
  dockerArgs: String env: [EnvironmentVariableInput] dataCenterId: String countryCode: String templateId: String
  bidPerGpu: Float!
}

type LowestPrice {
  minimumBidPrice: Float uninterruptablePrice: Float minVcpu: Float minMemory: Float stockStatus: String
  countryCode: String
}
type GpuType {
  id: String! displayName: String memoryInGb: Int maxGpuCount: Int securePrice: Float communityPrice: Float
  secureSpotPrice: Float communitySpotPrice: Float secureCloud: Boolean communityCloud: Boolean
  lowestPrice(input: GpuLowestPriceInput): LowestPrice
}
type Pod { id: String! name: String imageName: String desiredStatus: PodStatus podType: PodType costPerHr: Float }

type Query { gpuTypes(input: GpuTypeFilter): [GpuType] }
type Mutation { podRentInterruptable(input: PodRentInterruptableInput!): Pod }
"""

SCHEMA = build_schema(SDL)

OUT_OF_STOCK = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)

#: id -> (display name, GB, max count, secure $, community $, secure spot $, community spot $, secure stock,
#: community stock); None: not sold there / out of stock.
CATALOG: dict[str, tuple[Any, ...]] = {
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24, 8, 0.69, 0.44, 0.34, 0.29, "HIGH", "HIGH"),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 80, 8, 1.64, 1.19, 0.82, 0.60, "MEDIUM", "LOW"),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 80, 8, 2.99, None, 1.75, None, None, None),
}
CLOUDS = ("SECURE", "COMMUNITY")
COUNTRY = {"SECURE": "US", "COMMUNITY": "CA"}
DATA_CENTER = {"SECURE": "US-KS-2", "COMMUNITY": "CA-MTL-1"}

#: The fields ``CreatePodRequest`` and its ``gpu`` allow (any other is a 422).
CREATE_FIELDS = frozenset(
    {"name", "image", "args", "disk", "env", "ports", "registry", "cloud", "gpu", "cpu", "dataCenterIds", "mounts"}
    | {"globalNetworking", "startSsh", "startJupyter", "templateId"}
)
GPU_FIELDS = frozenset({"id", "count", "allowedCudaVersions", "minCudaVersion", "minRamPerGpu", "minVcpuCountPerGpu"})


def problem(status: int, detail: str, errors: list[str] | None = None) -> FakeResponse:
    """An RFC 9457 problem body, as v2 answers every error."""
    titles = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 422: "Unprocessable Entity"}
    body: dict[str, Any] = {"title": titles.get(status, "Error"), "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return FakeResponse(status, body, {"Content-Type": "application/problem+json"})


def _iso(moment: float | None) -> str | None:
    return None if moment is None else datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def stock(type_id: str, cloud: str, count: int) -> str:
    """The v2 availability of a GPU type in a cloud for a count (NONE when not sold there or the count is too big)."""
    _name, _memory, max_count, *_prices, secure, community = CATALOG[type_id]
    level = secure if cloud == "SECURE" else community
    return str(level) if level and count <= max_count else "NONE"


def list_price(type_id: str, cloud: str) -> float | None:
    """The on-demand price per GPU in a cloud (None: not sold there)."""
    entry = CATALOG[type_id]
    price = entry[3] if cloud == "SECURE" else entry[4]
    return None if price is None else float(price)


def catalog_gpu(type_id: str, cloud: str | None, count: int) -> dict[str, Any]:
    """A ``GpuType`` of ``GET /catalog/gpus`` (availability only when ``cloud`` is given, as with include)."""
    name, memory, max_count, secure, community, *_ = CATALOG[type_id]
    gpu: dict[str, Any] = {
        "id": type_id,
        "name": name,
        "pool": None,
        "manufacturer": "NVIDIA",
        "memory": memory,
        "secure": secure is not None,
        "community": community is not None,
        "price": {"secure": secure or 0.0, "community": community or 0.0},
        "maxCount": {"secure": max_count if secure else 0, "community": max_count if community else 0},
    }
    if cloud is not None:
        level = stock(type_id, cloud, count)
        gpu["availability"] = level
        if level != "NONE":  # omitted entirely when unavailable everywhere
            gpu["dataCenters"] = [{"id": DATA_CENTER[cloud], "name": DATA_CENTER[cloud], "availability": level}]
    return gpu


def graphql_gpu_type(type_id: str) -> dict[str, Any]:
    """A catalog entry as GraphQL's ``GpuType`` (``lowestPrice`` answers per cloud and count)."""
    name, memory, max_count, secure, community, secure_spot, community_spot, *_ = CATALOG[type_id]

    def lowest_price(_info: object, input: dict[str, Any] | None = None) -> dict[str, Any]:
        wanted = input or {}
        cloud = "SECURE" if wanted.get("secureCloud") else "COMMUNITY"
        level = stock(type_id, cloud, wanted.get("gpuCount") or 1)
        return {
            "minimumBidPrice": secure_spot if cloud == "SECURE" else community_spot,
            "uninterruptablePrice": list_price(type_id, cloud),
            "stockStatus": None if level == "NONE" else level.title(),
            "countryCode": COUNTRY[cloud],
        }

    return {
        "id": type_id,
        "displayName": name,
        "memoryInGb": memory,
        "maxGpuCount": max_count,
        "securePrice": secure,
        "communityPrice": community,
        "secureSpotPrice": secure_spot,
        "communitySpotPrice": community_spot,
        "secureCloud": secure is not None,
        "communityCloud": community is not None,
        "lowestPrice": lowest_price,
    }


class FakeRunPod(FakeClusters, FakeCloud):
    """RunPod's REST v2 (under ``/v2`` or the root) and its spot-only GraphQL (``/graphql``).

    Attributes:
        statuses: Pod id -> a v2 status it reports whatever the book says (``ERROR``, ``TERMINATED``, ...).
        graphql_status: When set, ``/graphql`` answers every request with this status (404, 410, 500).
        failing_lists: ``"pods"`` or ``"clusters"`` -> a status (500, 503) that list (``GET /pods``, ``GET
            /clusters``) answers with every time, as a problem body; the other routes answer as usual.
        no_public_ip_clouds: Clouds whose pods land on hosts without a public IP: they run (and bill) with
            ``ssh.direct`` null and no public port for ``22/tcp``, so they are never reachable.
    """

    def __init__(self, root: Path, *, boot_seconds: float = 1.0) -> None:
        super().__init__(root, boot_seconds=boot_seconds)
        self.statuses: dict[str, str] = {}
        self.graphql_status: int | None = None
        self.failing_lists: dict[str, int] = {}
        self.no_public_ip_clouds: set[str] = set()
        self.clusters: dict[str, ClusterBook] = {}
        self._routes = [
            *self.CLUSTER_ROUTES,
            ("GET", r"/catalog/gpus", "_catalog"),
            ("GET", r"/pods", "_list"),
            ("POST", r"/pods", "_create"),
            ("GET", r"/pods/(?P<pod_id>[^/]+)", "_get"),
            ("DELETE", r"/pods/(?P<pod_id>[^/]+)", "_delete"),
            ("POST", r"/pods/(?P<pod_id>[^/]+)/action", "_action"),
        ]

    def handle(self, request: FakeRequest) -> FakeResponse:
        """Routes to GraphQL (``/graphql`` exactly) or to REST v2, after checking the key.

        GraphQL is served at ``/graphql`` only, the route RunPod's own clients post to: ``/graphql/`` falls through
        to REST, which has no such route (a 404), so a client that adds a slash loses its spot offers here too.
        """
        if request.path == "/graphql":
            return self._graphql(request)
        path = request.path.removeprefix("/v2") if request.path.startswith("/v2/") else request.path
        refusal = self._refusal(request, path)
        if refusal is not None:
            return refusal
        for method, pattern, answer in self._routes:
            match = re.fullmatch(pattern, path.rstrip("/"))
            if match and method == request.method:
                reply: FakeResponse = getattr(self, answer)(request, **match.groupdict())
                return reply
        return problem(404, f"no route {request.method} {request.path}")

    def is_terminate(self, request: FakeRequest) -> bool:
        """``DELETE /pods/{id}`` (or the ``terminate`` action) terminates a pod; ``DELETE /clusters/{id}`` a cluster."""
        if request.method == "DELETE" and re.search(r"/(pods|clusters)/[^/]+/?$", request.path):
            return True
        body = request.json() if request.method == "POST" and request.path.endswith("/action") else None
        return isinstance(body, dict) and body.get("action") == "terminate"

    def is_create(self, request: FakeRequest) -> bool:
        """``POST /pods`` and ``POST /clusters`` create; so does GraphQL's ``podRentInterruptable`` (a spot pod)."""
        if request.method != "POST":
            return False
        if request.path.rstrip("/").endswith("/graphql"):
            return b"podRentInterruptable" in request.body
        return re.search(r"/(pods|clusters)/?$", request.path) is not None

    # -- keys ------------------------------------------------------------------------------------------------------

    def _refusal(self, request: FakeRequest, path: str) -> FakeResponse | None:
        """A 401 for a wrong key, a 403 for a pod's own key used beyond deleting or stopping that pod."""
        bearer = request.bearer or ""
        if self.faults.reject_key:
            return problem(401, "invalid bearer token")
        if bearer == self.valid_key:
            return None
        if not bearer.startswith("pod-scoped-"):
            return problem(401, "missing bearer token" if not bearer else "invalid bearer token")
        own = bearer.removeprefix("pod-scoped-")
        allowed = {("DELETE", f"/pods/{own}"), ("POST", f"/pods/{own}/action")}
        if own not in self.instances or (request.method, path.rstrip("/")) not in allowed:
            return problem(403, "a pod's own key may only stop or delete that pod")
        return None

    # -- catalog ---------------------------------------------------------------------------------------------------

    def _catalog(self, request: FakeRequest) -> FakeResponse:
        query = {key: values[0] for key, values in request.query.items()}
        include, product = query.get("include"), query.get("product")
        if (include == "AVAILABILITY") != bool(product):
            return problem(400, "include=AVAILABILITY requires product, and product requires include=AVAILABILITY")
        cloud = query.get("cloud", "SECURE") if include else None
        if cloud not in (None, *CLOUDS):
            return problem(422, f"invalid cloud {cloud!r}")
        count = int(query.get("count", "1"))
        return FakeResponse(200, {"gpus": [catalog_gpu(type_id, cloud, count) for type_id in CATALOG]})

    # -- pods ------------------------------------------------------------------------------------------------------

    def _create(self, request: FakeRequest) -> FakeResponse:
        body = request.json()
        invalid = self._invalid(body)
        if invalid:
            return problem(422, "request body does not match the schema", invalid)
        gpu, cloud = body["gpu"], body.get("cloud", "SECURE")
        if gpu["id"] not in CATALOG:
            return problem(400, f"unknown GPU type {gpu['id']!r}")
        count = gpu.get("count")
        price = list_price(gpu["id"], cloud)
        if self.faults.out_of_stock or count is None or price is None or stock(gpu["id"], cloud, count) == "NONE":
            return problem(400, OUT_OF_STOCK)
        instance = self.book(body, cloud, count, round(price * count, 4))
        return FakeResponse(201, self.pod_of(instance))

    @staticmethod
    def _invalid(body: Any) -> list[str]:
        """What v2 would refuse in a create body (unknown fields, missing name, image or gpu, a bad cloud)."""
        if not isinstance(body, dict):
            return ["$: expected an object"]
        problems = [f"$: additional properties '{key}' not allowed" for key in body if key not in CREATE_FIELDS]
        gpu = body.get("gpu")
        if not isinstance(gpu, dict) or not gpu.get("id"):
            problems.append("$.gpu: required (the fake rents GPU pods only)")
        else:
            problems += [f"$.gpu: additional properties '{key}' not allowed" for key in gpu if key not in GPU_FIELDS]
        if not body.get("name") or not body.get("image"):
            problems.append("$: name and image are required")
        if body.get("cloud", "SECURE") not in CLOUDS:
            problems.append(f"$.cloud: value must be one of {list(CLOUDS)}")
        return problems

    def book(self, body: dict[str, Any], cloud: str, count: int, price: float, *, spot: bool = False) -> FakeInstance:
        """Books a pod from a v2 create body (a spot rental passes the same fields, translated)."""
        env = dict(body.get("env") or {})
        public_key = env.pop("PUBLIC_KEY", "")
        pod_id = self.new_id()
        env.update({"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": f"pod-scoped-{pod_id}"})
        instance = FakeInstance(
            id=pod_id,
            label=str(body.get("name") or ""),
            gpu=CATALOG[body["gpu"]["id"]][0],
            price_per_hour=price,
            spot=spot,
            public_key=public_key,
            created=time.time(),
            env=env,
            extra={"body": body, "cloud": cloud, "count": count, "api": "graphql" if spot else "rest"},
        )
        return self.add(instance)

    def _list(self, request: FakeRequest) -> FakeResponse:
        if "pods" in self.failing_lists:
            return problem(self.failing_lists["pods"], "internal error listing pods")
        members = request.query.get("includeClusterPods", ["false"])[0] == "true"
        pods = [self.pod_of(i) for i in self.live_instances() if members or "cluster" not in i.extra]
        return FakeResponse(200, {"pods": pods})

    def _get(self, request: FakeRequest, pod_id: str) -> FakeResponse:
        instance = self.instances.get(pod_id)
        if instance is None or not instance.live:
            return problem(404, "pod not found")
        return FakeResponse(200, self.pod_of(instance))

    def _delete(self, request: FakeRequest, pod_id: str) -> FakeResponse:
        instance = self.instances.get(pod_id)
        if instance is None or not instance.live:
            return problem(404, "pod not found")
        if "cluster" in instance.extra:
            return problem(409, "this pod belongs to a cluster: delete the cluster instead")
        self.terminate_instance(instance)
        return FakeResponse(204, None)

    def _action(self, request: FakeRequest, pod_id: str) -> FakeResponse:
        action = (request.json() or {}).get("action")
        instance = self.instances.get(pod_id)
        if instance is None or not instance.live:
            return problem(404, "pod not found")
        if action == "terminate":
            self.terminate_instance(instance)
            return FakeResponse(204, None)
        if action != "stop":
            return problem(422, f"the fake supports stop and terminate, not {action!r}")
        self.stop_instance(instance)
        return FakeResponse(200, self.pod_of(instance))

    def status_of(self, instance: FakeInstance) -> str:
        """The v2 status: forced, else from the book (just created, booting, running, stopped, deleted)."""
        if instance.id in self.statuses:
            return self.statuses[instance.id]
        if not instance.live:
            return "TERMINATED"
        if instance.stopped is not None:
            return "EXITED"
        if instance.running_since is not None and instance.address is not None:
            return "RUNNING"
        return "PROVISIONING" if time.time() < instance.created + self.boot_seconds / 2 else "STARTING"

    def pod_of(self, instance: FakeInstance) -> dict[str, Any]:
        """The instance as a v2 ``Pod``, as sent (with any fields :meth:`~tests.fakes.http.FakeCloud.malform` set)."""
        return self.as_sent(instance.id, self.pod_fields(instance))

    def pod_fields(self, instance: FakeInstance) -> dict[str, Any]:
        """The instance as a v2 ``Pod``."""
        status = self.status_of(instance)
        body = instance.extra["body"]
        return {
            "id": instance.id,
            "name": instance.label,
            "status": status,
            "actions": {"RUNNING": ["stop", "restart", "terminate"]}.get(status, ["start", "terminate"]),
            "image": body.get("image"),
            "args": body.get("args", ""),
            "disk": body.get("disk", 0),
            "mounts": {},
            "ports": body.get("ports") or [],
            "env": dict(body.get("env") or {}),
            "registry": None,
            "cloud": instance.extra["cloud"],
            "dataCenterId": DATA_CENTER[instance.extra["cloud"]],
            "cudaVersion": "12.8",
            "gpu": {"id": body["gpu"]["id"], "count": instance.extra["count"]},
            "ssh": self.ssh_of(instance, status, public=self._public(instance)),
            "template": None,
            "cost": instance.price_per_hour if status in ("PROVISIONING", "STARTING", "RUNNING") else 0.0,
            "locked": False,
            "runtime": self.runtime_of(instance, public=self._public(instance)) if status == "RUNNING" else None,
            "createdAt": _iso(instance.created),
            "startedAt": _iso(instance.running_since),
            "globalNetworking": {"enabled": False},
        }

    def _public(self, instance: FakeInstance) -> bool:
        """Whether the pod's host has a public IP (its ``22/tcp`` gets a public port)."""
        return instance.extra["cloud"] not in self.no_public_ip_clouds

    @staticmethod
    def ssh_of(instance: FakeInstance, status: str, *, public: bool = True) -> dict[str, Any]:
        """``ssh``: the proxy once placed, ``direct`` only while running with ``22/tcp`` published publicly."""
        proxy = {"host": "ssh.runpod.io", "port": 22, "username": f"{instance.id}-64411eb2"}
        proxy["command"] = f"ssh {proxy['username']}@ssh.runpod.io"
        address = instance.address
        published = "22/tcp" in instance.extra["body"].get("ports", [])
        if status != "RUNNING" or address is None or not published or not public:
            return {"proxy": proxy, "direct": None}
        command = f"ssh root@{address.host} -p {address.port}"
        return {
            "proxy": proxy,
            "direct": {"host": address.host, "port": address.port, "username": "root", "command": command},
        }

    @staticmethod
    def runtime_of(instance: FakeInstance, *, public: bool = True) -> dict[str, Any] | None:
        """The running container: its uptime and the sshd's port as ``22/tcp`` (with no public port or IP on a
        host without a public IP)."""
        if instance.address is None or instance.running_since is None:
            return None
        port: dict[str, Any] = {"private": 22, "public": None, "type": "tcp", "ip": None}
        if public:
            port.update(public=instance.address.port, ip=instance.address.host)
        return {"uptime": int(time.time() - instance.running_since), "gpus": [], "ports": [port]}

    # -- GraphQL, spot only --------------------------------------------------------------------------------------

    def _graphql(self, request: FakeRequest) -> FakeResponse:
        """Runs a GraphQL operation (errors answered with HTTP 200, as RunPod does)."""
        if self.graphql_status is not None:
            return FakeResponse(self.graphql_status, {"error": "GraphQL is not served here"})
        if request.bearer != self.valid_key or self.faults.reject_key:
            return FakeResponse(401, {"error": "Unauthorized"})
        body = request.json() if request.method == "POST" else None
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return FakeResponse(400, {"errors": [{"message": "POST a JSON body with a GraphQL query"}]})
        result = graphql_sync(SCHEMA, body["query"], root_value=self, variable_values=body.get("variables"))
        reply: dict[str, Any] = {"data": result.data}
        if result.errors:
            reply["errors"] = [error.formatted for error in result.errors]
        return FakeResponse(200, reply)

    def gpuTypes(self, _info: object, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The catalog, or the one type ``input.id`` names (graphql-core calls this as a root field)."""
        wanted = (input or {}).get("id")
        return [graphql_gpu_type(type_id) for type_id in CATALOG if wanted in (None, type_id)]

    def podRentInterruptable(self, _info: object, input: dict[str, Any]) -> dict[str, Any]:
        """Rents a spot pod at ``bidPerGpu``, or raises RunPod's error (out of stock, unknown GPU, bid too low)."""
        cloud, count = input.get("cloudType") or "SECURE", input.get("gpuCount") or 1
        if input["gpuTypeId"] not in CATALOG:
            raise GraphQLError(f"Invalid GPU type id: {input['gpuTypeId']}")
        lowest = graphql_gpu_type(input["gpuTypeId"])["lowestPrice"](
            None, {"gpuCount": count, "secureCloud": cloud != "COMMUNITY"}
        )
        if self.faults.out_of_stock or lowest["stockStatus"] is None or lowest["minimumBidPrice"] is None:
            raise GraphQLError(OUT_OF_STOCK)
        bid, minimum = float(input["bidPerGpu"]), float(lowest["minimumBidPrice"])
        if self.faults.bid_too_low or bid < minimum:
            raise GraphQLError(f"Your bid price of ${bid}/hr is too low; the minimum bid is ${minimum}/hr.")
        body = self._as_rest_body(input)
        instance = self.book(body, cloud, count, round(bid * count, 4), spot=True)
        instance.extra["input"] = input
        return {
            "id": instance.id,
            "name": instance.label,
            "imageName": input["imageName"],
            "desiredStatus": "RUNNING",
            "podType": "INTERRUPTABLE",
            "costPerHr": instance.price_per_hour,
        }

    @staticmethod
    def _as_rest_body(spec: dict[str, Any]) -> dict[str, Any]:
        """A GraphQL pod input in v2's create-body shape (what the book keeps for every pod)."""
        return {
            "name": spec.get("name") or "",
            "image": spec["imageName"],
            "gpu": {"id": spec["gpuTypeId"], "count": spec.get("gpuCount") or 1},
            "disk": spec.get("containerDiskInGb") or 0,
            "ports": [p.strip() for p in (spec.get("ports") or "").split(",") if p.strip()],
            "env": {e["key"]: e["value"] for e in spec.get("env") or []},
        }
