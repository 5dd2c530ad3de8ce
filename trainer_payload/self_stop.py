"""Laptop-closed safety: terminates this rented machine once training has ended and nobody came for the result.

Started detached next to the trainer when the user opts in (``[compute] self_stop_minutes``). Every poll it looks
at the output folder: when the trainer has written ``STOP_MACHINE`` (done, failed, or idle) and the desktop has not
touched ``HEARTBEAT`` for ``minutes``, the machine terminates itself through its provider's API, so a closed laptop
never pays past the end of training. The newest checkpoint pulled home is where a later ``rentune resume`` goes on.

What it authenticates with:

* RunPod: the pod's own ``RUNPOD_API_KEY`` and ``RUNPOD_POD_ID`` (RunPod puts them in every pod); nothing is sent.
  It deletes the pod through REST v2 (``DELETE {api_url}/pods/{id}``); where v2 does not take the call (404, 405,
  or a pod key v2 does not accept: 401, 403) it terminates through GraphQL (``podTerminate`` at ``graphql_url``).
* A RunPod cluster (Instant Clusters): its machines cannot end it with their pods' keys (a member pod refuses to be
  deleted, and only ``DELETE {api_url}/clusters/{id}`` ends them all), so the user's API key is sent (only with
  ``send_api_key = true``) to the head alone, as for Lambda; the head deletes the whole cluster.
* Vast.ai: the instance's own ``CONTAINER_API_KEY`` and ``CONTAINER_ID``; nothing is sent.
* Lambda: Lambda has no per-machine keys, so the user's API key is sent (only with ``send_api_key = true``), in the
  settings on stdin. It lives only in this process's memory: never in an environment, in argv or on disk.

Started as ``python -m trainer_payload.self_stop --detach PIDFILE`` with its settings as one JSON line on stdin: it
reads them, then detaches (a session of its own, stdin from ``/dev/null``) and writes the watcher's pid to PIDFILE,
so the command that started it ends at once. Without ``--detach`` it watches in the foreground.

Standard library only: it runs with the machine's own Python, before or without the trainer's environment.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from trainer_payload.protocol import (
    COURIER_BUSY_NAME,
    COURIER_BUSY_SECONDS,
    COURIER_DIR_NAME,
    HEARTBEAT_NAME,
    STOP_MARKER_NAME,
)

_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: RunPod's REST v2 base, where ``DELETE /pods/{id}`` terminates a pod.
RUNPOD_V2_URL = "https://api.runpod.io/v2"
#: The prefix of a RunPod cluster's instance id (``cluster:<id>``): the head deletes the whole cluster.
RUNPOD_CLUSTER_PREFIX = "cluster:"
#: The answers of one call after which the next way to terminate is tried (RunPod: v2, then GraphQL).
_TRY_NEXT = frozenset({401, 403, 404, 405})
#: The most bytes of settings read from stdin (they are a few hundred).
_SETTINGS_LIMIT = 1 << 16


class SelfStopError(RuntimeError):
    """The settings or the machine's environment do not allow a self-stop; the message says what is missing."""


class ProviderRefusedError(SelfStopError):
    """The provider answered the terminate call with an error.

    Attributes:
        status: The HTTP status (None when the answer was a 200 with errors in it).
    """

    def __init__(self, status: int | None, answer: str) -> None:
        self.status = status
        said = f"HTTP {status} {answer}" if status is not None else answer
        super().__init__(f"the provider refused: {said[:300]}")


@dataclass(frozen=True)
class SelfStopConfig:
    """How and when this machine stops itself.

    Attributes:
        provider: ``runpod``, ``vast`` or ``lambda``.
        api_url: The provider's API root (for RunPod its REST v2 base, such as :data:`RUNPOD_V2_URL`).
        minutes: How long after training ended (with no desktop around) the machine terminates.
        instance_id: The machine's id at the provider (needed for Lambda and a RunPod cluster, ``cluster:<id>``; the
            others read their own).
        api_key: Lambda and a RunPod cluster only: the user's key (sent only with their consent); never shown.
        poll_seconds: How often the output folder is looked at.
        graphql_url: RunPod only: its GraphQL endpoint, for when REST v2 does not take the call.
    """

    provider: str
    api_url: str
    minutes: float
    instance_id: str = ""
    api_key: str = field(default="", repr=False)
    poll_seconds: float = 30.0
    graphql_url: str = ""

    def __post_init__(self) -> None:
        """Trims the URLs, and fills in RunPod's (see :meth:`from_json`)."""
        api_url, graphql_url = self.api_url.rstrip("/"), self.graphql_url.rstrip("/")
        if self.provider == "runpod":
            api_url, graphql_url = _runpod_urls(api_url or RUNPOD_V2_URL, graphql_url)
        object.__setattr__(self, "api_url", api_url)
        object.__setattr__(self, "graphql_url", graphql_url)

    @classmethod
    def from_json(cls, text: str) -> SelfStopConfig:
        """Reads the settings the desktop sent.

        RunPod's ``api_url`` defaults to :data:`RUNPOD_V2_URL` and its ``graphql_url`` to ``/graphql`` beside the
        v2 base; settings written before REST v2 named the GraphQL endpoint as ``api_url``, and are read as that
        endpoint with ``/v2`` beside it.

        Raises:
            SelfStopError: Not a JSON object with a known provider, http(s) URLs, a positive number of minutes and
                a poll of at most an hour.
        """
        try:
            data = json.loads(text)
            config = cls(
                provider=str(data["provider"]),
                api_url=str(data.get("api_url") or ""),
                minutes=float(data["minutes"]),
                instance_id=str(data.get("instance_id", "")),
                api_key=str(data.get("api_key", "")),
                poll_seconds=float(data.get("poll_seconds", 30.0)),
                graphql_url=str(data.get("graphql_url") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SelfStopError(f"unreadable self-stop settings ({exc})") from None
        if config.provider not in ("runpod", "vast", "lambda") or not config.minutes > 0:
            raise SelfStopError(f"self-stop needs a known provider and minutes > 0, got {config.provider!r}")
        if not 0 < config.poll_seconds <= 3600:
            raise SelfStopError(f"self-stop polls every 0 to 3600 seconds, not {config.poll_seconds:g}")
        urls = (config.api_url, config.graphql_url) if config.provider == "runpod" else (config.api_url,)
        if not all(url.startswith(("https://", "http://")) for url in urls):
            raise SelfStopError("self-stop needs the provider's API URL")
        return config


def _runpod_urls(api_url: str, graphql_url: str) -> tuple[str, str]:
    """RunPod's REST v2 base and GraphQL endpoint (see :meth:`SelfStopConfig.from_json`)."""
    if api_url.endswith("/graphql"):
        return api_url.removesuffix("/graphql") + "/v2", graphql_url or api_url
    return api_url, graphql_url or api_url.removesuffix("/v2") + "/graphql"


def machine_variable(name: str, init_environ: Path = Path("/proc/1/environ")) -> str:
    """A variable the provider set for the machine: this process's environment, else the container's first process.

    SSH sessions do not always inherit the container's environment, where RunPod and Vast put the machine's id and
    its own key.
    """
    value = os.environ.get(name, "")
    if value:
        return value
    try:
        entries = init_environ.read_bytes().split(b"\0")
    except OSError:
        return ""
    prefix = name.encode() + b"="
    return next((e[len(prefix) :].decode(errors="replace") for e in entries if e.startswith(prefix)), "")


def _safe_id(value: str, what: str) -> str:
    if not _SAFE_ID.fullmatch(value):
        raise SelfStopError(f"{what} is missing or not a plain id")
    return value


def terminate_requests(config: SelfStopConfig) -> list[urllib.request.Request]:
    """The provider's API calls that terminate this machine, in the order tried (see :func:`terminate`).

    Each is authenticated as described in the module docstring; only a RunPod pod has a second way.

    Raises:
        SelfStopError: The machine's id or key is not available.
    """
    if config.provider == "runpod" and config.instance_id.startswith(RUNPOD_CLUSTER_PREFIX):
        cluster = _safe_id(config.instance_id.removeprefix(RUNPOD_CLUSTER_PREFIX), "the cluster's id")
        return [_request("DELETE", f"{config.api_url}/clusters/{cluster}", config.api_key)]
    if config.provider == "runpod":
        pod = _safe_id(machine_variable("RUNPOD_POD_ID"), "RUNPOD_POD_ID")
        key = machine_variable("RUNPOD_API_KEY")
        body = {"query": "mutation($id: String!) { podTerminate(input: {podId: $id}) }", "variables": {"id": pod}}
        return [
            _request("DELETE", f"{config.api_url}/pods/{pod}", key),
            _request("POST", config.graphql_url, key, body),
        ]
    if config.provider == "vast":
        instance = _safe_id(machine_variable("CONTAINER_ID"), "CONTAINER_ID")
        return [_request("DELETE", f"{config.api_url}/instances/{instance}/", machine_variable("CONTAINER_API_KEY"))]
    instance = _safe_id(config.instance_id, "the instance id")
    body = {"instance_ids": [instance]}
    return [_request("POST", f"{config.api_url}/instance-operations/terminate", config.api_key, body)]


def terminate(config: SelfStopConfig, time_limit: float = 30.0) -> str:
    """Terminates this machine: the first of :func:`terminate_requests`, the next only where one was not taken.

    A call is not taken when the provider answers 404 or 405 (no such endpoint there), 401 or 403 (it does not
    accept the machine's key); any other refusal is final for this attempt.

    Raises:
        SelfStopError: The machine's id or key is missing, or the provider refused.
        OSError: The provider could not be reached.
    """
    *first, last = terminate_requests(config)
    for request in first:
        try:
            return send(request, time_limit)
        except ProviderRefusedError as exc:
            if exc.status not in _TRY_NEXT:
                raise
            _log(f"{request.get_method()} {request.full_url} was not taken ({exc}); trying {last.full_url}")
    return send(last, time_limit)


def _request(method: str, url: str, key: str, body: object = None) -> urllib.request.Request:
    if not key:
        raise SelfStopError("no API key for the self-stop on this machine")
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", "Accept": "application/json"}
    return urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310 - http(s) checked


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def due(output_dir: Path, minutes: float, now: float) -> bool:
    """Whether training ended (``STOP_MACHINE``) and neither that nor the desktop's heartbeat is recent enough.

    Never while the courier is sending a checkpoint to the bucket (its ``BUSY`` fresh): a stop then would lose it. A
    courier that stopped making progress stops touching it, and the machine stops minutes later.
    """
    ended = _mtime(output_dir / STOP_MARKER_NAME)
    busy = _mtime(output_dir / COURIER_DIR_NAME / COURIER_BUSY_NAME)
    if ended is None or (busy is not None and now - busy < COURIER_BUSY_SECONDS):
        return False
    seen = max(ended, _mtime(output_dir / HEARTBEAT_NAME) or 0.0)
    return now - seen >= minutes * 60


def send(request: urllib.request.Request, time_limit: float = 30.0) -> str:
    """Sends one terminate call; returns the provider's answer (its status, when it answered without a body).

    Raises:
        ProviderRefusedError: The provider refused (or answered with errors).
        OSError: The provider could not be reached.
    """
    try:
        with urllib.request.urlopen(request, timeout=time_limit) as response:  # noqa: S310 - URL checked
            answer = str(response.read(4096).decode(errors="replace")) or f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        raise ProviderRefusedError(exc.code, exc.read(300).decode(errors="replace")) from None
    if '"errors"' in answer or '"success": false' in answer or '"success":false' in answer:
        raise ProviderRefusedError(None, answer)
    return answer


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}", flush=True)


def watch(config: SelfStopConfig, output_dir: Path) -> int:
    """Waits until the machine is due to stop, then terminates it (retrying until the provider agrees)."""
    _log(f"self-stop armed: terminate {config.minutes:g} min after training ends with nobody following")
    while True:
        if due(output_dir, config.minutes, time.time()):
            try:
                answer = terminate(config)
            except (SelfStopError, OSError) as exc:
                _log(f"could not terminate yet: {exc}")
            else:
                _log(f"terminated this machine: {answer[:200]}")
                return 0
        time.sleep(config.poll_seconds)


def detach(pid_file: Path) -> int | None:
    """Goes on as a watcher of its own, so the command that started this process ends now.

    The watcher runs in a session of its own (an SSH logout does not end it) with stdin from ``/dev/null``; stdout
    and stderr stay where they were sent (the self-stop's log). Its pid is in ``pid_file`` before this returns in
    the starting process. Settings read before keep living in the watcher's memory only.

    Returns:
        None in the watcher, which goes on; in the starting process, the status to exit with (0 once the watcher
        runs and its pid is written).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle:
        return os.waitstatus_to_exitcode(os.waitpid(middle, 0)[1])
    os.setsid()
    watcher = os.fork()
    if watcher:
        os._exit(_write_pid(pid_file, watcher))
    _stdin_from_nothing()
    return None


def _write_pid(pid_file: Path, pid: int) -> int:
    """Writes the watcher's pid (whole, or not at all); stops the watcher and says 1 when it cannot."""
    partial = pid_file.with_name(pid_file.name + ".part")
    try:
        partial.write_text(f"{pid}\n", encoding="ascii")
        partial.replace(pid_file)
    except OSError as exc:
        _log(f"could not write {pid_file} ({exc}); the self-stop is not armed")
        os.kill(pid, signal.SIGKILL)
        return 1
    return 0


def _stdin_from_nothing() -> None:
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)


def _pid_file(args: list[str]) -> Path | None:
    if not args:
        return None
    if len(args) == 2 and args[0] == "--detach" and args[1]:
        return Path(args[1])
    raise SelfStopError("usage: python -m trainer_payload.self_stop [--detach PIDFILE] < settings.json")


def main(args: list[str] | None = None) -> int:
    """Reads the settings (one JSON line on stdin), then watches the run's ``out`` folder (detached on request).

    Args:
        args: The command line after the module's name: empty, or ``--detach PIDFILE``.
    """
    try:
        pid_file = _pid_file(sys.argv[1:] if args is None else args)
        config = SelfStopConfig.from_json(sys.stdin.readline(_SETTINGS_LIMIT))
    except SelfStopError as exc:
        _log(str(exc))
        return 2
    if pid_file is not None:
        started = detach(pid_file)
        if started is not None:
            return started
    return watch(config, Path("out"))


if __name__ == "__main__":
    sys.exit(main())
