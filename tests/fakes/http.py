"""The plumbing every fake cloud shares: a real HTTP server on loopback (or an in-process httpx transport), the
book of instances it ever created with their times, and switchable faults.

A fake subclasses :class:`FakeCloud` and implements :meth:`FakeCloud.handle`. Statuses move with time: an instance
created at ``t`` is starting until ``t + boot_seconds``, then running (its sshd is started at that moment).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.fakes.machines import MachineAddress, MachinePool


@dataclass
class FakeRequest:
    """One request as the fake sees it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None

    @property
    def bearer(self) -> str | None:
        """The API key from ``Authorization: Bearer`` or ``?api_key=``."""
        header = self.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        keys = self.query.get("api_key")
        return keys[0] if keys else None


@dataclass
class FakeResponse:
    """What the fake answers."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        """The body as bytes (JSON unless already bytes)."""
        if isinstance(self.body, bytes):
            return self.body
        return b"" if self.body is None else json.dumps(self.body).encode()


@dataclass
class FakeInstance:
    """An instance in the fake's book.

    Attributes:
        id: The provider's id.
        label: Its name.
        gpu: The GPU display name.
        price_per_hour: Whole machine, dollars per hour.
        spot: Interruptible.
        public_key: The key the client handed over.
        created: Wall-clock creation time.
        running_since: When it became reachable (None before).
        stopped: When it was stopped or outbid (None while not).
        terminated: When it was destroyed (None while not).
        address: Its machine, once booted.
        env: Variables set in its sessions.
        extra: Provider-specific fields.
    """

    id: str
    label: str
    gpu: str
    price_per_hour: float
    spot: bool
    public_key: str
    created: float
    running_since: float | None = None
    stopped: float | None = None
    terminated: float | None = None
    address: MachineAddress | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Not terminated (stopped instances still exist and may bill storage)."""
        return self.terminated is None


class FaultKind(StrEnum):
    """What goes wrong with one call."""

    SERVER_ERROR = "server_error"  # a 5xx answer
    TIMEOUT = "timeout"  # no answer in time
    DROP = "drop"  # the connection drops
    RATE_LIMIT = "rate_limit"  # a 429 (always before acting: providers refuse before they act)
    SLOW = "slow"  # the answer comes, late


@dataclass(frozen=True)
class CallFault:
    """A fault for one call: what happens, and whether the provider acted on the request first.

    Attributes:
        kind: What goes wrong.
        after_acting: The provider did what was asked (created, terminated) before the fault hit the answer.
        status: The status of a server error.
        delay: Seconds a slow answer takes (in-process: awaited; served: slept).
    """

    kind: FaultKind
    after_acting: bool = False
    status: int = 502
    delay: float = 0.0


@dataclass
class QueuedFault:
    """A fault waiting for the next call that matches ``method`` and the ``path`` pattern (``re.search``), or, with
    ``creates``, for the next call that creates a machine whatever its path (:meth:`FakeCloud.is_create`)."""

    method: str
    path: str
    fault: CallFault
    times: int = 1
    creates: bool = False


@dataclass(frozen=True)
class FiredFault:
    """A fault that took effect: on a call (its kind is a :class:`FaultKind`), or the provider's own doing to a
    machine ("outbid", "preempted", "lost") or a refused terminate ("failing_terminate").

    Attributes:
        kind: What happened.
        method: The call's method ("" for the provider's own doing).
        path: The call's path.
        create: The call creates a machine (:meth:`FakeCloud.is_create`).
        after_acting: The provider did what the call asked before the fault hit the answer.
        instance: The machine it happened to (the provider's own doing), else None.
    """

    kind: str
    method: str = ""
    path: str = ""
    create: bool = False
    after_acting: bool = False
    instance: str | None = None


class FaultyAnswerError(Exception):
    """Raised inside the fake to make the transport fail the call instead of answering."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Faults:
    """Faults a test switches on.

    Attributes:
        out_of_stock: Every create fails for lack of capacity.
        never_ready: Instances stay starting forever.
        rate_limit_once: The next request gets a 429 (then this turns itself off).
        server_error_once: The next request gets a 503.
        reject_key: Every key is refused.
        outbid_after: A spot instance is taken away this many seconds after it started running (once).
        bid_too_low: Spot creates fail as bid too low.
        queued: Faults for the next matching calls (see :meth:`FakeCloud.fail_next`).
        failing_terminates: This many terminate calls are refused with a 500 before one succeeds (none acts).

    Each fault that takes effect is recorded in :attr:`FakeCloud.fired` (a queued one may never meet its call).
    """

    out_of_stock: bool = False
    never_ready: bool = False
    rate_limit_once: bool = False
    server_error_once: bool = False
    reject_key: bool = False
    outbid_after: float | None = None
    bid_too_low: bool = False
    queued: list[QueuedFault] = field(default_factory=list)
    failing_terminates: int = 0


class FakeCloud(ABC):
    """Base of the fake providers: instances, machines, time, faults, a state file, and two ways to serve."""

    valid_key = "test-key"

    def __init__(self, root: Path, *, boot_seconds: float = 1.0) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.pool = MachinePool(root / "machines")
        self.boot_seconds = boot_seconds
        self.faults = Faults()
        self.instances: dict[str, FakeInstance] = {}
        self.malformed: dict[str, dict[str, Any]] = {}
        self.requests: list[FakeRequest] = []
        self.fired: list[FiredFault] = []
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._next_id = 1000

    # -- the book ------------------------------------------------------------------------------------------------

    def new_id(self) -> str:
        """A fresh instance id."""
        self._next_id += 1
        return str(self._next_id)

    def add(self, instance: FakeInstance) -> FakeInstance:
        """Books a new instance."""
        self.instances[instance.id] = instance
        self.save()
        return instance

    def refresh(self, instance: FakeInstance) -> FakeInstance:
        """Moves an instance along with time: boots its machine when due, takes it away when outbid."""
        now = time.time()
        if instance.terminated is not None or instance.stopped is not None:
            return instance
        due = now >= instance.created + self.boot_seconds
        if instance.running_since is None and not self.faults.never_ready and due:
            instance.address = self.pool.start(instance.id, instance.public_key, instance.env)
            instance.running_since = now
            self.save()
        outbid = self.faults.outbid_after
        started = instance.running_since
        if instance.spot and started is not None and outbid is not None and now >= started + outbid:
            self.faults.outbid_after = None  # once
            self.stop_instance(instance, outbid=True)
            self.fired.append(FiredFault("outbid", instance=instance.id))
        return instance

    def preempt_instance(self, instance: FakeInstance) -> None:
        """The provider takes the machine back (a spot machine preempted): stopped, its disk kept."""
        with self.lock:
            self.stop_instance(instance, outbid=True)
            self.fired.append(FiredFault("preempted", instance=instance.id))

    def lose_instance(self, instance: FakeInstance) -> None:
        """The provider loses the machine (its host died): terminated by the provider, not by the client."""
        with self.lock:
            instance.extra["lost"] = True
            self.terminate_instance(instance)
            self.fired.append(FiredFault("lost", instance=instance.id))

    def stop_instance(self, instance: FakeInstance, *, outbid: bool = False) -> None:
        """Stops it: the machine goes away, the disk (the book entry) stays."""
        instance.stopped = instance.stopped or time.time()
        instance.extra["outbid"] = outbid
        self.pool.kill(instance.id)
        self.save()

    def terminate_instance(self, instance: FakeInstance) -> None:
        """Destroys it: the machine goes away and nothing bills any more."""
        if instance.terminated is None:
            instance.terminated = time.time()
        self.pool.kill(instance.id)
        self.save()

    #: Where an instance's billing start is kept in ``extra`` (None: its ``created`` time).
    billing_start_key: str | None = None

    def billed_seconds(self, instance_id: str) -> float:
        """Seconds the provider bills the instance for: from its billing start to its termination (or now).

        Stopped time counts (a stopped machine still bills its disk); only a termination ends the count.

        Raises:
            KeyError: No instance of that id was ever created.
        """
        with self.lock:
            instance = self.instances[instance_id]
            start = instance.created if self.billing_start_key is None else instance.extra[self.billing_start_key]
            end = instance.terminated if instance.terminated is not None else time.time()
            return max(0.0, end - float(start))

    def malform(self, instance_id: str, **fields: Any) -> None:
        """Makes every answer describing the instance send these fields instead (a row a client cannot read)."""
        with self.lock:
            self.malformed.setdefault(instance_id, {}).update(fields)

    def as_sent(self, instance_id: str, row: dict[str, Any]) -> dict[str, Any]:
        """The row as the provider sends it: with the fields :meth:`malform` set for the instance, if any."""
        return {**row, **self.malformed.get(instance_id, {})}

    def live_instances(self) -> list[FakeInstance]:
        """Instances not terminated."""
        return [i for i in self.instances.values() if i.live]

    def save(self) -> None:
        """Writes the book to ``state.json`` (what a test asserts on)."""
        rows = []
        for instance in self.instances.values():
            row = asdict(instance)
            row["address"] = None if instance.address is None else [instance.address.host, instance.address.port]
            rows.append(row)
        (self.root / "state.json").write_text(json.dumps(rows, indent=2, default=str))

    # -- serving -------------------------------------------------------------------------------------------------

    @abstractmethod
    def handle(self, request: FakeRequest) -> FakeResponse:
        """Answers one request (each fake answers as its provider does)."""

    def fail_next(self, method: str, path: str, fault: CallFault, times: int = 1) -> None:
        """Makes the next ``times`` calls of ``method`` to a path matching ``path`` (a regular expression) fail."""
        with self.lock:
            self.faults.queued.append(QueuedFault(method.upper(), path, fault, times))

    def fail_next_create(self, fault: CallFault, times: int = 1) -> None:
        """Makes the next ``times`` calls that create a machine fail, whichever of the fake's create calls they are."""
        with self.lock:
            self.faults.queued.append(QueuedFault("", "", fault, times, creates=True))

    def is_terminate(self, request: FakeRequest) -> bool:
        """Whether the request terminates a machine (each fake knows its own call)."""
        return False

    def is_create(self, request: FakeRequest) -> bool:
        """Whether the request creates a machine (each fake knows its own calls)."""
        return False

    def _queued_for(self, request: FakeRequest) -> QueuedFault | None:
        """The first queued fault waiting for ``request``."""
        for queued in self.faults.queued:
            if queued.creates:
                if self.is_create(request):
                    return queued
            elif queued.method == request.method and re.search(queued.path, request.path):
                return queued
        return None

    def _take_fault(self, request: FakeRequest) -> CallFault | None:
        """The fault this call meets (taken from the queue and recorded as fired), or None."""
        queued = self._queued_for(request)
        if queued is not None:
            queued.times -= 1
            if queued.times <= 0:
                self.faults.queued.remove(queued)
            self._fire(request, queued.fault.kind.value, queued.fault.after_acting)
            return queued.fault
        if self.faults.failing_terminates > 0 and self.is_terminate(request):
            self.faults.failing_terminates -= 1
            self._fire(request, "failing_terminate")
            return CallFault(FaultKind.SERVER_ERROR, status=500)
        return None

    def _fire(self, request: FakeRequest, kind: str, after_acting: bool = False) -> None:
        self.fired.append(FiredFault(kind, request.method, request.path, self.is_create(request), after_acting))

    def dispatch(self, request: FakeRequest) -> FakeResponse:
        """Records the request, applies the faults (before or after acting), then :meth:`handle` under the lock.

        Raises:
            FaultyAnswerError: The call's fault is a timeout or a dropped connection.
        """
        with self.lock:
            self.requests.append(request)
            if self.faults.rate_limit_once:
                self.faults.rate_limit_once = False
                self._fire(request, FaultKind.RATE_LIMIT.value)
                return FakeResponse(429, {"error": "rate limited"}, {"Retry-After": "0"})
            if self.faults.server_error_once:
                self.faults.server_error_once = False
                self._fire(request, FaultKind.SERVER_ERROR.value)
                return FakeResponse(503, {"error": "unavailable"})
            fault = self._take_fault(request)
            if fault is not None and not fault.after_acting and fault.kind is not FaultKind.SLOW:
                return _fault_answer(request, fault)
            for instance in list(self.instances.values()):
                self.refresh(instance)
            reply = self.handle(request)
            if fault is not None and fault.kind is not FaultKind.SLOW:
                return _fault_answer(request, fault)
            self._mark_revealed(reply)
            return reply

    def _mark_revealed(self, reply: FakeResponse) -> None:
        """Marks each machine whose id an answer that reached the client names (``extra["revealed"]``).

        A machine the provider took away before any answer named it (a create whose answer was lost, the machine
        lost before a look-up) could not be known to the client: the soak tells such a machine from one it forgot.
        A number that only looks like an id marks a machine too, which errs on the strict side.
        """
        if reply.status >= 300 or reply.body is None:
            return
        text = reply.encoded().decode("utf-8", "replace")
        for instance in self.instances.values():
            if "revealed" not in instance.extra and re.search(rf'"{instance.id}"|[:\[,] *{instance.id}\b', text):
                instance.extra["revealed"] = True

    def delay_for(self, request: FakeRequest) -> float:
        """Seconds the next answer to ``request`` is held back (a slow provider), without taking the fault.

        Only when the fault the call meets first is a slow answer: that is the one :meth:`dispatch` then takes.
        """
        with self.lock:
            queued = self._queued_for(request)
            return queued.fault.delay if queued is not None and queued.fault.kind is FaultKind.SLOW else 0.0

    def transport(self) -> httpx.AsyncBaseTransport:
        """An in-process transport answering like the server would (a slow answer is awaited, not slept)."""
        return _CloudTransport(self)

    def serve(self) -> str:
        """Starts a real HTTP server on 127.0.0.1; returns its base URL."""
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                fake = FakeRequest(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
                time.sleep(cloud.delay_for(fake))
                try:
                    reply = cloud.dispatch(fake)
                except FaultyAnswerError:
                    self.close_connection = True  # no answer at all: the client sees the connection drop
                    return
                body = reply.encoded()
                self.send_response(reply.status)
                for key, value in _json_headers(reply).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any  # noqa: N815 - http.server's names

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        """Stops the server and kills every machine."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.pool.kill_all()


def _json_headers(reply: FakeResponse) -> dict[str, str]:
    kind = "application/octet-stream" if isinstance(reply.body, bytes) else "application/json"
    return {"Content-Type": kind, **reply.headers}


class _CloudTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """Answers in-process through :meth:`FakeCloud.dispatch` (async clients await a slow answer's delay)."""

    def __init__(self, cloud: FakeCloud) -> None:
        self.cloud = cloud

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        parts = urlsplit(str(request.url))
        headers = {k.lower(): v for k, v in request.headers.items()}
        fake = FakeRequest(request.method, parts.path, parse_qs(parts.query), headers, request.read())
        try:
            reply = self.cloud.dispatch(fake)
        except FaultyAnswerError as fault:
            raise fault.error from None
        return httpx.Response(reply.status, content=reply.encoded(), headers=_json_headers(reply), request=request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        parts = urlsplit(str(request.url))
        fake = FakeRequest(
            request.method,
            parts.path,
            parse_qs(parts.query),
            {k.lower(): v for k, v in request.headers.items()},
            await request.aread(),
        )
        delay = self.cloud.delay_for(fake)
        if delay:
            await asyncio.sleep(delay)
        try:
            reply = self.cloud.dispatch(fake)
        except FaultyAnswerError as fault:
            raise fault.error from None
        return httpx.Response(reply.status, content=reply.encoded(), headers=_json_headers(reply), request=request)


def _fault_answer(request: FakeRequest, fault: CallFault) -> FakeResponse:
    """The answer a fault gives (or the transport error it raises through :class:`FaultyAnswerError`)."""
    if fault.kind is FaultKind.RATE_LIMIT:
        return FakeResponse(429, {"error": "rate limited"}, {"Retry-After": "0"})
    if fault.kind is FaultKind.SERVER_ERROR:
        return FakeResponse(fault.status, {"error": f"upstream failure ({fault.status})"})
    fake_request = httpx.Request(request.method, f"http://fake{request.path}")
    if fault.kind is FaultKind.TIMEOUT:
        raise FaultyAnswerError(httpx.ReadTimeout("timed out waiting for the answer", request=fake_request))
    raise FaultyAnswerError(httpx.RemoteProtocolError("the server closed the connection", request=fake_request))
