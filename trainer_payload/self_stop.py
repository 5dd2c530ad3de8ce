"""Laptop-closed safety: terminates this rented machine once training has ended and nobody came for the result.

Started detached next to the trainer when the user opts in (``[compute] self_stop_minutes``). Every poll it looks
at the output folder: when the trainer has written ``STOP_MACHINE`` (done, failed, or idle) and the desktop has not
touched ``HEARTBEAT`` for ``minutes``, the machine terminates itself through its provider's API, so a closed laptop
never pays past the end of training. The newest checkpoint pulled home is where a later ``rentune resume`` goes on.

What it authenticates with:

* RunPod: the pod's own ``RUNPOD_API_KEY`` and ``RUNPOD_POD_ID`` (RunPod puts them in every pod); nothing is sent.
* Vast.ai: the instance's own ``CONTAINER_API_KEY`` and ``CONTAINER_ID``; nothing is sent.
* Lambda: Lambda has no per-machine keys, so the user's API key is sent (only with ``send_api_key = true``), on
  stdin into this process's environment: never in argv or on disk.

Standard library only: it runs with the machine's own Python, before or without the trainer's environment.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trainer_payload.protocol import HEARTBEAT_NAME, SELF_STOP_ENV, STOP_MARKER_NAME

_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class SelfStopError(RuntimeError):
    """The settings or the machine's environment do not allow a self-stop; the message says what is missing."""


@dataclass(frozen=True)
class SelfStopConfig:
    """How and when this machine stops itself.

    Attributes:
        provider: ``runpod``, ``vast`` or ``lambda``.
        api_url: The provider's API root (the URL the desktop uses).
        minutes: How long after training ended (with no desktop around) the machine terminates.
        instance_id: The machine's id at the provider (needed for Lambda; the others read their own).
        api_key: Lambda only: the user's key (sent only with their consent).
        poll_seconds: How often the output folder is looked at.
    """

    provider: str
    api_url: str
    minutes: float
    instance_id: str = ""
    api_key: str = ""
    poll_seconds: float = 30.0

    @classmethod
    def from_json(cls, text: str) -> SelfStopConfig:
        """Reads the settings the desktop sent.

        Raises:
            SelfStopError: Not a JSON object with a known provider, an http(s) URL and a positive number of minutes.
        """
        try:
            data = json.loads(text)
            config = cls(
                provider=str(data["provider"]),
                api_url=str(data["api_url"]).rstrip("/"),
                minutes=float(data["minutes"]),
                instance_id=str(data.get("instance_id", "")),
                api_key=str(data.get("api_key", "")),
                poll_seconds=float(data.get("poll_seconds", 30.0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SelfStopError(f"unreadable self-stop settings ({exc})") from None
        if config.provider not in ("runpod", "vast", "lambda") or config.minutes <= 0:
            raise SelfStopError(f"self-stop needs a known provider and minutes > 0, got {config.provider!r}")
        if not config.api_url.startswith(("https://", "http://")):
            raise SelfStopError("self-stop needs the provider's API URL")
        return config


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


def terminate_request(config: SelfStopConfig) -> urllib.request.Request:
    """The provider's API call that terminates this machine, authenticated as described in the module docstring.

    Raises:
        SelfStopError: The machine's id or key is not available.
    """
    if config.provider == "runpod":
        pod = _safe_id(machine_variable("RUNPOD_POD_ID"), "RUNPOD_POD_ID")
        body = {"query": "mutation($id: String!) { podTerminate(input: {podId: $id}) }", "variables": {"id": pod}}
        return _request("POST", config.api_url, machine_variable("RUNPOD_API_KEY"), body)
    if config.provider == "vast":
        instance = _safe_id(machine_variable("CONTAINER_ID"), "CONTAINER_ID")
        return _request("DELETE", f"{config.api_url}/instances/{instance}/", machine_variable("CONTAINER_API_KEY"))
    instance = _safe_id(config.instance_id, "the instance id")
    body = {"instance_ids": [instance]}
    return _request("POST", f"{config.api_url}/instance-operations/terminate", config.api_key, body)


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
    """Whether training ended (``STOP_MACHINE``) and neither that nor the desktop's heartbeat is recent enough."""
    ended = _mtime(output_dir / STOP_MARKER_NAME)
    if ended is None:
        return False
    seen = max(ended, _mtime(output_dir / HEARTBEAT_NAME) or 0.0)
    return now - seen >= minutes * 60


def send(request: urllib.request.Request, time_limit: float = 30.0) -> str:
    """Sends the terminate call; returns the provider's answer.

    Raises:
        SelfStopError: The provider refused (or answered with errors).
        OSError: The provider could not be reached.
    """
    try:
        with urllib.request.urlopen(request, timeout=time_limit) as response:  # noqa: S310 - URL checked
            answer = str(response.read(4096).decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        raise SelfStopError(f"the provider refused: HTTP {exc.code} {exc.read(300).decode(errors='replace')}") from None
    if '"errors"' in answer or '"success": false' in answer or '"success":false' in answer:
        raise SelfStopError(f"the provider refused: {answer[:300]}")
    return answer


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}", flush=True)


def watch(config: SelfStopConfig, output_dir: Path) -> int:
    """Waits until the machine is due to stop, then terminates it (retrying until the provider agrees)."""
    _log(f"self-stop armed: terminate {config.minutes:g} min after training ends with nobody following")
    while True:
        if due(output_dir, config.minutes, time.time()):
            try:
                answer = send(terminate_request(config))
            except (SelfStopError, OSError) as exc:
                _log(f"could not terminate yet: {exc}")
            else:
                _log(f"terminated this machine: {answer[:200]}")
                return 0
        time.sleep(config.poll_seconds)


def main() -> int:
    """Runs the self-stop in the run's folder with the settings from :data:`SELF_STOP_ENV`."""
    try:
        config = SelfStopConfig.from_json(os.environ.pop(SELF_STOP_ENV, ""))
    except SelfStopError as exc:
        _log(str(exc))
        return 2
    return watch(config, Path("out"))


if __name__ == "__main__":
    sys.exit(main())
