"""``SPEC.toml``: the human-editable description of a run, shared by the CLI and the GUI.

Sections: ``[model] base``; ``[data] train`` (and ``eval``); ``[training]`` with the payload's job keys under the
same names; ``[target] ssh = "ssh://user@host:port"``, ``identity``, ``python``, ``host_key`` (optional: the host key
pinned in advance, e.g. by the wizard's Test connection); ``[budget] hourly_rate_usd`` (what the machine costs per
hour) and ``max_usd`` (the run is stopped, its checkpoint kept, once the cost so far reaches it). Relative paths are
relative to the spec file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from trainer_payload.protocol import JobSpec, JobSpecError

_TRAINING_EXCLUDED = {"base_model", "train_file", "eval_file", "output_dir", "version"}


class RunSpecError(ValueError):
    """The run spec is invalid; the message names the section and key."""


@dataclass(frozen=True)
class SshTarget:
    """An SSH host to train on.

    Attributes:
        user: Login user.
        host: Host name or address.
        port: SSH port.
        identity: Private key file used to log in (None: the SSH agent or default keys).
        python: The interpreter to run the payload with on the host.
        workdir: Folder for run folders on the host (default ``~/.rentune/runs``).
        authorized_keys: The file the host's sshd reads client keys from (default ``~/.ssh/authorized_keys``);
            the run's own key is added there for the run's lifetime.
        host_key: The host's public key line pinned in advance (None: pinned on first contact); a host offering
            another key is refused.
    """

    user: str
    host: str
    port: int = 22
    identity: Path | None = None
    python: str = "python3"
    workdir: str | None = None
    authorized_keys: str | None = None
    host_key: str | None = None

    @property
    def url(self) -> str:
        """The target as ``ssh://user@host:port``."""
        return f"ssh://{self.user}@{self.host}:{self.port}"


def parse_ssh_url(url: str) -> tuple[str, str, int]:
    """Splits ``ssh://user@host:port`` (port optional).

    Raises:
        RunSpecError: The URL is not of that form.
    """
    parts = urlsplit(url)
    try:
        port = parts.port or 22
    except ValueError as exc:
        raise RunSpecError(f"target {url!r}: the port must be a number") from exc
    if parts.scheme != "ssh" or not parts.hostname or not parts.username:
        raise RunSpecError(f"target {url!r} must look like ssh://user@host:port")
    return parts.username, parts.hostname, port


@dataclass(frozen=True)
class RunSpec:
    """A run as the user described it.

    Attributes:
        base_model: Hub id or local path of the model.
        train_file: Training data (``messages`` JSONL, ideally from ``rentune data prepare``).
        eval_file: Optional eval data.
        training: The payload job keys (method, lora_r, seq_len...).
        target: Where to train.
        budget_usd: Stop the run once its cost so far reaches this (0: no limit; needs ``hourly_rate_usd``).
        hourly_rate_usd: What the target costs per hour (own servers: as the user states it).
        source: The spec file.
    """

    base_model: str
    train_file: Path
    eval_file: Path | None
    training: dict[str, Any]
    target: SshTarget | None
    budget_usd: float = 0.0
    hourly_rate_usd: float = 0.0
    source: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def job_dict(self, train_name: str, eval_name: str | None) -> dict[str, Any]:
        """The payload's ``job.json`` for this spec, with data paths relative to the remote job folder."""
        return {
            "base_model": self.base_model,
            "train_file": train_name,
            "eval_file": eval_name,
            "output_dir": "out",
            **self.training,
        }


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise RunSpecError(f"[{name}] must be a table")
    return value


def _path(value: Any, base: Path, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise RunSpecError(f"{key} must be a file path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _host_key(value: Any) -> str | None:
    """``[target] host_key``: an OpenSSH public key line (``ssh-ed25519 AAAA...``), or None when absent."""
    if value is None or value == "":
        return None
    parts = value.split() if isinstance(value, str) else []
    if len(parts) < 2 or not (parts[0].startswith(("ssh-", "ecdsa-", "sk-")) and parts[1].startswith("AAAA")):
        raise RunSpecError(
            "[target] host_key must be the host's public key line (like ssh-ed25519 AAAA...); remove it to pin the "
            "key on first contact"
        )
    return " ".join(parts[:2])


def _target(section: dict[str, Any], base: Path) -> SshTarget | None:
    if "ssh" not in section:
        return None
    user, host, port = parse_ssh_url(str(section["ssh"]))
    identity = _path(section["identity"], base, "[target] identity") if section.get("identity") else None
    workdir = str(section["workdir"]) if section.get("workdir") else None
    authorized = str(section["authorized_keys"]) if section.get("authorized_keys") else None
    python = str(section.get("python", "python3"))
    return SshTarget(user, host, port, identity, python, workdir, authorized, _host_key(section.get("host_key")))


def _dollars(section: dict[str, Any], key: str) -> float:
    """``[budget] key`` as a number of dollars (0 when absent)."""
    value = section.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise RunSpecError(f"[budget] {key} = {value!r} must be a number of dollars, like 10 or 2.5 (0: none)")
    return float(value)


_KIND_WORDS: dict[Any, str] = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _is_kind(value: Any, kind: Any) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _check_training_types(training: dict[str, Any]) -> None:
    """Refuses a ``[training]`` value of the wrong type, naming the key, the type it needs and its default."""
    hints = get_type_hints(JobSpec)
    defaults = {f.name: f.default for f in fields(JobSpec)}
    for key, value in training.items():
        kind = hints.get(key)
        if kind in _KIND_WORDS and not _is_kind(value, kind):
            example = json.dumps(defaults[key])  # TOML writes these simple values as JSON does
            raise RunSpecError(f"[training] {key} = {value!r} must be {_KIND_WORDS[kind]}, like {key} = {example}")


def run_spec_from_dict(data: dict[str, Any], base_dir: Path, source: Path | None = None) -> RunSpec:
    """Validates a decoded ``SPEC.toml``.

    Raises:
        RunSpecError: A section or key is missing or invalid.
    """
    model = _section(data, "model").get("base")
    if not isinstance(model, str) or not model:
        raise RunSpecError("[model] base is required (a Hub id or a model folder)")
    data_section = _section(data, "data")
    train = _path(data_section.get("train"), base_dir, "[data] train")
    evaluation = _path(data_section["eval"], base_dir, "[data] eval") if data_section.get("eval") else None
    training = dict(_section(data, "training"))
    clash = sorted(set(training) & _TRAINING_EXCLUDED)
    if clash:
        raise RunSpecError(f"[training] cannot set {', '.join(clash)} (they come from [model] and [data])")
    local_model = Path(model).expanduser()
    if not local_model.is_absolute() and (base_dir / local_model).exists():
        model = str((base_dir / local_model).resolve())
    _check_training_types(training)
    try:
        JobSpec.from_dict({"base_model": model, "train_file": "t", "output_dir": "o", **training})
    except (JobSpecError, TypeError) as exc:
        raise RunSpecError(f"[training]: {exc}") from exc
    budget, rate = _budget(_section(data, "budget"))
    target = _target(_section(data, "target"), base_dir)
    return RunSpec(model, train, evaluation, training, target, budget, rate, source)


def _budget(section: dict[str, Any]) -> tuple[float, float]:
    """``[budget] max_usd`` and ``hourly_rate_usd``; a budget needs a rate, or the cost so far is unknown."""
    budget, rate = _dollars(section, "max_usd"), _dollars(section, "hourly_rate_usd")
    if budget > 0 and rate <= 0:
        raise RunSpecError(
            f"[budget] max_usd = {budget:g} needs [budget] hourly_rate_usd (what the machine costs per hour) to "
            "know when it is reached; set the rate, or remove max_usd"
        )
    return budget, rate
