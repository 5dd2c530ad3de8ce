"""Testing an SSH host before a run: can we log in, which host key does it have, what GPU and Python does it offer.

The host key is pinned on first contact (trust on first use) and checked against the pinned one afterwards, as the
run engine does; every failure becomes one readable sentence naming the problem and the fix.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from desktop.services.machines.ssh import Endpoint, HostKeyChangedError, RemoteMachine, fingerprint
from desktop.services.platform.logs import get_logger

NO_GPU = "no GPU found (CPU only)"
GPU_QUERY = "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader"
# Prints what the trainer needs from the interpreter as one JSON line; importing torch proves it works.
_PYTHON_CHECK = """
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = bool(torch.cuda.is_available())
except Exception as exc:
    info["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(info))
"""
_log = get_logger("ssh")


class ProbeError(ConnectionError):
    """The host could not be tested; the message says why and what to do."""


@dataclass(frozen=True)
class ProbeResult:
    """What a connection test found.

    Attributes:
        host_key: The host's public key line (OpenSSH format), pinned for the run.
        fingerprint: Its SHA256 fingerprint, as OpenSSH shows it.
        gpus: One ``name, memory`` line per GPU from nvidia-smi (empty: no GPU).
        gpu_problem: Why nvidia-smi gave no answer when it exists but failed ("" otherwise).
        python_version: The interpreter's version ("" when it could not be run).
        python_problem: Why the interpreter could not be run ("" when it ran).
        torch_version: PyTorch's version when importable, else None.
        torch_problem: Why torch could not be imported ("" when it could).
        cuda: Whether torch sees a CUDA device.
    """

    host_key: str
    fingerprint: str
    gpus: tuple[str, ...] = ()
    gpu_problem: str = ""
    python_version: str = ""
    python_problem: str = ""
    torch_version: str | None = None
    torch_problem: str = ""
    cuda: bool = False

    @property
    def gpu_summary(self) -> str:
        """The GPUs in one line: ``2 x NVIDIA H100 80GB HBM3 (81559 MiB)``, or why there is none."""
        if not self.gpus:
            return self.gpu_problem or NO_GPU
        counts: dict[str, int] = {}
        for line in self.gpus:
            name, _, memory = line.partition(",")
            label = f"{name.strip()} ({memory.strip()})" if memory.strip() else name.strip()
            counts[label] = counts.get(label, 0) + 1
        return ", ".join(f"{count} x {label}" for label, count in counts.items())

    @property
    def python_summary(self) -> str:
        """Python and torch in one line, with what is missing."""
        if not self.python_version:
            return self.python_problem
        if self.torch_version is None:
            return f"Python {self.python_version}; torch not importable ({self.torch_problem}): the trainer installs it"
        cuda = "CUDA available" if self.cuda else "no CUDA"
        return f"Python {self.python_version}, torch {self.torch_version} ({cuda})"


def _key_names(endpoint: Endpoint) -> str:
    files = [str(k) for k in endpoint.client_keys if isinstance(k, Path)]
    return ", ".join(files) if files else "your SSH agent or default keys (~/.ssh/id_*)"


def _check_key_files(endpoint: Endpoint) -> None:
    for key in endpoint.client_keys:
        if isinstance(key, Path) and not key.is_file():
            raise ProbeError(f"the key file {key} does not exist; choose your private key file (not the .pub)")


def _login_error(endpoint: Endpoint, exc: asyncssh.Error) -> ProbeError:
    """One readable sentence for a refused login or a broken SSH handshake."""
    where = f"{endpoint.host}:{endpoint.port}"
    if isinstance(exc, asyncssh.PermissionDenied):
        return ProbeError(
            f"{endpoint.user}@{where} refused the login with {_key_names(endpoint)}; check the user name and add the "
            "public key to ~/.ssh/authorized_keys on the server"
        )
    if isinstance(exc, asyncssh.KeyImportError):
        return ProbeError(
            f"the key file could not be read ({exc}); choose an unencrypted OpenSSH private key, or load it into "
            "your SSH agent and leave the key file empty"
        )
    return ProbeError(f"{where} closed the SSH connection ({exc.reason}); check the host's sshd settings")


def _network_error(endpoint: Endpoint, exc: OSError, time_limit: float) -> ProbeError:
    """One readable sentence for a host that cannot be reached."""
    where = f"{endpoint.host}:{endpoint.port}"
    if isinstance(exc, TimeoutError):
        return ProbeError(
            f"{where} did not answer within {time_limit:.0f} s; check the host and port, the firewall and any VPN"
        )
    if isinstance(exc, socket.gaierror):
        return ProbeError(f"the host name {endpoint.host!r} could not be found; check its spelling and your network")
    if isinstance(exc, ConnectionRefusedError):
        return ProbeError(f"nothing accepts SSH connections on {where}; check the port and that sshd runs there")
    return ProbeError(
        f"{where} cannot be reached ({exc.strerror or exc or type(exc).__name__}); check the host, the port and "
        "the network"
    )


async def _connect(endpoint: Endpoint, pinned: str | None, time_limit: float) -> RemoteMachine:
    _check_key_files(endpoint)
    try:
        return await RemoteMachine.connect(endpoint, pinned, time_limit)
    except HostKeyChangedError as exc:
        raise HostKeyChangedError(
            f"the host key of {endpoint.host}:{endpoint.port} is not the one pinned when you last tested it "
            f"({fingerprint(pinned or '')}). This may be an attack or a reinstalled machine; if you trust it, press "
            "Forget pinned key and test again"
        ) from exc
    except asyncssh.Error as exc:
        raise _login_error(endpoint, exc) from exc
    except OSError as exc:  # TimeoutError included
        raise _network_error(endpoint, exc, time_limit) from exc


async def _gpus(machine: RemoteMachine) -> tuple[tuple[str, ...], str]:
    """nvidia-smi's GPU lines, and why there are none when nvidia-smi exists but failed."""
    result = await asyncio.wait_for(machine.conn.run(GPU_QUERY, check=False), 60)
    if result.exit_status == 0:
        return tuple(line.strip() for line in str(result.stdout).splitlines() if line.strip()), ""
    if result.exit_status == 127:  # the shell found no nvidia-smi
        return (), ""
    detail = (str(result.stderr).strip() or str(result.stdout).strip()).splitlines()
    return (), f"nvidia-smi failed ({detail[-1][:200] if detail else result.exit_status}); check the NVIDIA driver"


async def _python(machine: RemoteMachine, python: str) -> dict[str, object]:
    """What the interpreter reports, or ``{"problem": ...}`` when it cannot run."""
    command = f"{shlex.quote(python)} -c {shlex.quote(_PYTHON_CHECK)}"
    result = await asyncio.wait_for(machine.conn.run(command, check=False), 120)
    lines = str(result.stdout).strip().splitlines()
    if result.exit_status == 0 and lines:
        try:
            info = json.loads(lines[-1])
        except json.JSONDecodeError:
            info = None
        if isinstance(info, dict):
            return info
    if result.exit_status == 127:
        return {"problem": f"{python} was not found on the host; install Python 3.10+ or give the interpreter's path"}
    detail = (str(result.stderr).strip() or "no output").splitlines()[-1][:200]
    return {"problem": f"{python} failed on the host ({detail}); give a working Python 3.10+ interpreter"}


async def probe_host(
    endpoint: Endpoint, pinned: str | None, python: str = "python3", time_limit: float = 20
) -> ProbeResult:
    """Logs in (pinning the host key on first use) and reports the host key, GPUs, Python and torch.

    Args:
        endpoint: Where and how to log in.
        pinned: The host key pinned by an earlier test (None: trust the key offered now).
        python: The interpreter the trainer will run with.
        time_limit: Seconds to wait for the connection.

    Raises:
        HostKeyChangedError: The host offers another key than ``pinned``.
        ProbeError: The host cannot be reached or refuses the login; the message says what to fix.
    """
    machine = await _connect(endpoint, pinned, time_limit)
    try:
        gpus, gpu_problem = await _gpus(machine)
        info = await _python(machine, python)
    except (OSError, asyncssh.Error) as exc:  # TimeoutError included
        raise ProbeError(
            f"the connection to {endpoint.host}:{endpoint.port} broke during the test ({type(exc).__name__}); "
            "test again"
        ) from exc
    finally:
        await machine.close()
    _log.info("tested %s@%s:%s: %s", endpoint.user, endpoint.host, endpoint.port, gpus or "no GPU")
    return ProbeResult(
        host_key=machine.host_key,
        fingerprint=fingerprint(machine.host_key),
        gpus=gpus,
        gpu_problem=gpu_problem,
        python_version=str(info.get("python", "")),
        python_problem=str(info.get("problem", "")),
        torch_version=str(info["torch"]) if info.get("torch") else None,
        torch_problem=str(info.get("torch_error", "")),
        cuda=bool(info.get("cuda", False)),
    )
