"""A fake RunPod GraphQL API: queries are parsed and validated for real (graphql-core against an SDL of the types
Rentune uses), so a misspelt field or argument fails as it would at RunPod, with HTTP 200 and ``errors``.

Pods are the :class:`~tests.fakes.http.FakeCloud` book: ``runtime`` stays null until the pod's machine has booted
(then it lists the sshd's port as ``22/tcp``), a stopped or outbid pod is ``EXITED`` with no runtime, and a
terminated pod is gone (``pod`` answers null; ``myself.pods`` no longer lists it). The 401 body and the bid-too-low
message are not confirmed against RunPod.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from graphql import GraphQLError, build_schema, graphql_sync

from tests.fakes.http import FakeCloud, FakeInstance, FakeRequest, FakeResponse

SDL = """
scalar Void

enum CloudTypeEnum { ALL SECURE COMMUNITY }
enum PodStatus { CREATED RUNNING RESTARTING EXITED PAUSED DEAD TERMINATED }
enum PodType { INTERRUPTABLE RESERVED }

input GpuTypeFilter { id: String cluster: Boolean }
input GpuLowestPriceInput {
  gpuCount: Int secureCloud: Boolean dataCenterId: String countryCode: String minDisk: Int minMemoryInGb: Int
  minVcpuCount: Int minCudaVersion: String
}
input EnvironmentVariableInput { key: String! value: String! }
input PodFindAndDeployOnDemandInput {
  name: String imageName: String! gpuTypeId: String! cloudType: CloudTypeEnum gpuCount: Int containerDiskInGb: Int
  volumeInGb: Int volumeMountPath: String supportPublicIp: Boolean startSsh: Boolean ports: String
  dockerArgs: String env: [EnvironmentVariableInput] dataCenterId: String countryCode: String templateId: String
}
input PodRentInterruptableInput {
  name: String imageName: String! gpuTypeId: String! cloudType: CloudTypeEnum gpuCount: Int containerDiskInGb: Int
  volumeInGb: Int volumeMountPath: String supportPublicIp: Boolean startSsh: Boolean ports: String
  dockerArgs: String env: [EnvironmentVariableInput] dataCenterId: String countryCode: String templateId: String
  bidPerGpu: Float!
}
input PodFilter { podId: String! }
input PodStopInput { podId: String! }
input PodTerminateInput { podId: String! }

type LowestPrice {
  minimumBidPrice: Float uninterruptablePrice: Float minVcpu: Float minMemory: Float stockStatus: String
  countryCode: String
}
type GpuType {
  id: String! displayName: String memoryInGb: Int maxGpuCount: Int securePrice: Float communityPrice: Float
  secureSpotPrice: Float communitySpotPrice: Float secureCloud: Boolean communityCloud: Boolean
  lowestPrice(input: GpuLowestPriceInput): LowestPrice
}
type Port { ip: String isIpPublic: Boolean privatePort: Int publicPort: Int type: String }
type PodRuntime { uptimeInSeconds: Int ports: [Port] }
type Machine { podHostId: String gpuDisplayName: String }
type Pod {
  id: String! name: String imageName: String desiredStatus: PodStatus podType: PodType costPerHr: Float
  gpuCount: Int machineId: String lastStatusChange: String runtime: PodRuntime machine: Machine
}
type User { id: String! pods: [Pod] }

type Query {
  gpuTypes(input: GpuTypeFilter): [GpuType]
  pod(input: PodFilter): Pod
  myself: User
}
type Mutation {
  podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput): Pod
  podRentInterruptable(input: PodRentInterruptableInput!): Pod
  podStop(input: PodStopInput!): Pod
  podTerminate(input: PodTerminateInput): Void
}
"""

SCHEMA = build_schema(SDL)

OUT_OF_STOCK = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)

#: id -> (display name, GB, max count, secure $, community $, secure spot $, community spot $, secure stock,
#: community stock); None: not sold there / out of stock.
CATALOG: dict[str, tuple[Any, ...]] = {
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24, 8, 0.69, 0.44, 0.34, 0.29, "High", "High"),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 80, 8, 1.64, 1.19, 0.82, 0.60, "Medium", "Low"),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 80, 8, 2.99, None, 1.75, None, None, None),
}
COUNTRY = {"SECURE": "US", "COMMUNITY": "CA"}


def gpu_type(type_id: str) -> dict[str, Any]:
    """A catalog entry as RunPod's ``GpuType`` (``lowestPrice`` answers per cloud and count)."""
    name, memory, max_count, secure, community, secure_spot, community_spot, *stock = CATALOG[type_id]

    def lowest_price(_info: object, input: dict[str, Any] | None = None) -> dict[str, Any]:
        wanted = input or {}
        secure_cloud = bool(wanted.get("secureCloud"))
        fits = (wanted.get("gpuCount") or 1) <= max_count
        return {
            "minimumBidPrice": secure_spot if secure_cloud else community_spot,
            "uninterruptablePrice": secure if secure_cloud else community,
            "stockStatus": (stock[0] if secure_cloud else stock[1]) if fits else None,
            "countryCode": COUNTRY["SECURE" if secure_cloud else "COMMUNITY"],
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


class FakeRunPod(FakeCloud):
    """RunPod's GraphQL endpoint, answering at any path (``/graphql`` or the root of :meth:`serve`'s URL)."""

    def __init__(self, root: Path, *, boot_seconds: float = 1.0) -> None:
        super().__init__(root, boot_seconds=boot_seconds)

    def handle(self, request: FakeRequest) -> FakeResponse:
        """Checks the key, then runs the GraphQL operation (errors answered with HTTP 200, as RunPod does)."""
        try:
            body = request.json()
        except ValueError:
            body = None
        self.scope = self._pod_scope(request.bearer, body)
        if (request.bearer != self.valid_key and self.scope is None) or self.faults.reject_key:
            return FakeResponse(401, {"error": "Unauthorized"})
        if request.method != "POST" or not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return FakeResponse(400, {"errors": [{"message": "POST a JSON body with a GraphQL query"}]})
        result = graphql_sync(SCHEMA, body["query"], root_value=self, variable_values=body.get("variables"))
        reply: dict[str, Any] = {"data": result.data}
        if result.errors:
            reply["errors"] = [error.formatted for error in result.errors]
        return FakeResponse(200, reply)

    def _pod_scope(self, bearer: str | None, body: Any) -> str | None:
        """The pod a pod-scoped key (``RUNPOD_API_KEY`` inside a pod) belongs to, when it only stops or terminates
        pods; None for any other key or operation."""
        if not bearer or not bearer.startswith("pod-scoped-") or not isinstance(body, dict):
            return None
        pod_id = bearer.removeprefix("pod-scoped-")
        query = str(body.get("query", ""))
        if pod_id not in self.instances or not ("podTerminate" in query or "podStop" in query):
            return None
        return pod_id

    def _check_scope(self, pod_id: str) -> None:
        scope = getattr(self, "scope", None)
        if scope is not None and pod_id != scope:
            raise GraphQLError("a pod's own key may only stop or terminate that pod")

    # -- queries (graphql-core calls these as root fields) -----------------------------------------------------------

    def gpuTypes(self, _info: object, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The catalog, or the one type ``input.id`` names."""
        wanted = (input or {}).get("id")
        return [gpu_type(type_id) for type_id in CATALOG if wanted in (None, type_id)]

    def pod(self, _info: object, input: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A live pod, or null (terminated or never existed)."""
        instance = self.instances.get((input or {}).get("podId", ""))
        return None if instance is None or not instance.live else self.pod_of(instance)

    def myself(self, _info: object) -> dict[str, Any]:
        """The account and its pods that are not terminated."""
        return {"id": "user_fake", "pods": [self.pod_of(i) for i in self.live_instances()]}

    # -- mutations ---------------------------------------------------------------------------------------------------

    def podFindAndDeployOnDemand(self, _info: object, input: dict[str, Any]) -> dict[str, Any]:
        """Rents an on-demand pod."""
        return self.pod_of(self.deploy("podFindAndDeployOnDemand", input, spot=False))

    def podRentInterruptable(self, _info: object, input: dict[str, Any]) -> dict[str, Any]:
        """Rents a spot pod at ``bidPerGpu``."""
        return self.pod_of(self.deploy("podRentInterruptable", input, spot=True))

    def podStop(self, _info: object, input: dict[str, Any]) -> dict[str, Any]:
        """Stops a pod: its machine goes away, the pod stays EXITED."""
        self._check_scope(input["podId"])
        instance = self.live(input["podId"], "pod not found to stop")
        self.stop_instance(instance)
        return self.pod_of(instance)

    def podTerminate(self, _info: object, input: dict[str, Any] | None = None) -> None:
        """Destroys a pod (a pod already gone is an error, as dstack reports)."""
        self._check_scope((input or {}).get("podId", ""))
        instance = self.live((input or {}).get("podId", ""), "pod not found to terminate")
        self.terminate_instance(instance)

    # -- the book ----------------------------------------------------------------------------------------------------

    def live(self, pod_id: str, missing: str) -> FakeInstance:
        """The pod, unless terminated or unknown (then a GraphQL error with ``missing``)."""
        instance = self.instances.get(pod_id)
        if instance is None or not instance.live:
            raise GraphQLError(missing)
        return instance

    def deploy(self, mutation: str, spec: dict[str, Any], *, spot: bool) -> FakeInstance:
        """Books a pod from a deploy input, or raises RunPod's error for it."""
        cloud = spec.get("cloudType") or "ALL"
        count = spec.get("gpuCount") or 1
        per_gpu = self.gpu_price(spec, cloud, count, spot)
        env = {e["key"]: e["value"] for e in spec.get("env") or []}
        public_key = env.pop("PUBLIC_KEY", "")
        pod_id = self.new_id()
        env.update({"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": f"pod-scoped-{pod_id}"})
        instance = FakeInstance(
            id=pod_id,
            label=spec.get("name") or "",
            gpu=CATALOG[spec["gpuTypeId"]][0],
            price_per_hour=round(per_gpu * count, 4),
            spot=spot,
            public_key=public_key,
            created=time.time(),
            env=env,
            extra={"mutation": mutation, "input": spec, "cloud": cloud, "count": count},
        )
        return self.add(instance)

    def gpu_price(self, spec: dict[str, Any], cloud: str, count: int, spot: bool) -> float:
        """What the pod costs per GPU, or RunPod's error: out of stock, unknown GPU, bid too low."""
        if spec["gpuTypeId"] not in CATALOG:
            raise GraphQLError(f"Invalid GPU type id: {spec['gpuTypeId']}")
        entry = gpu_type(spec["gpuTypeId"])
        lowest = entry["lowestPrice"](None, {"gpuCount": count, "secureCloud": cloud != "COMMUNITY"})
        price = lowest["uninterruptablePrice"]
        if self.faults.out_of_stock or lowest["stockStatus"] is None or price is None:
            raise GraphQLError(OUT_OF_STOCK)
        if not spot:
            return float(price)
        bid, minimum = float(spec["bidPerGpu"]), float(lowest["minimumBidPrice"])
        if self.faults.bid_too_low or bid < minimum:
            raise GraphQLError(f"Your bid price of ${bid}/hr is too low; the minimum bid is ${minimum}/hr.")
        return bid

    def pod_of(self, instance: FakeInstance) -> dict[str, Any]:
        """The instance as a RunPod ``Pod`` (``runtime`` null until its machine runs)."""
        running = instance.address is not None and instance.stopped is None and instance.running_since is not None
        return {
            "id": instance.id,
            "name": instance.label,
            "imageName": instance.extra.get("input", {}).get("imageName"),
            "desiredStatus": "TERMINATED" if not instance.live else "EXITED" if instance.stopped else "RUNNING",
            "podType": "INTERRUPTABLE" if instance.spot else "RESERVED",
            "costPerHr": instance.price_per_hour,
            "gpuCount": instance.extra.get("count", 1),
            "machineId": f"machine-{instance.id}",
            "runtime": self.runtime_of(instance) if running else None,
            "machine": {"podHostId": f"{instance.id}-host", "gpuDisplayName": instance.gpu},
        }

    @staticmethod
    def runtime_of(instance: FakeInstance) -> dict[str, Any]:
        """The running container: its uptime and the sshd's port as public ``22/tcp``."""
        assert instance.address is not None and instance.running_since is not None
        port = {"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22, "publicPort": instance.address.port}
        return {"uptimeInSeconds": int(time.time() - instance.running_since), "ports": [{**port, "type": "tcp"}]}
