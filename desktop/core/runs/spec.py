"""``SPEC.toml``: the human-editable description of a run, shared by the CLI and the GUI.

Sections: ``[model] base``; ``[data] train`` (and ``eval``); ``[training]`` with the payload's job keys under the
same names; ``[target] ssh = "ssh://user@host:port"``, ``identity``, ``python``, ``host_key`` (optional: the host key
pinned in advance, e.g. by the wizard's Test connection), or ``hosts = ["ssh://user@a:22", "ssh://user@b:22"]`` to
train on several machines as one run (the first is the head, rank 0; ``head_address`` is where the others reach it
when its SSH host name is not, ``head_port`` the port they use); or, instead of ``[target]``, ``[compute]`` to rent a
machine from a GPU cloud (see :class:`ComputeSpec`); ``[budget] hourly_rate_usd`` (what an own machine costs per
hour; a rented one's price is known) and ``max_usd`` (the run is stopped, its checkpoint kept, before the cost
reaches it); ``[export] on_machine = ["merged", "gguf:Q8_0"]`` (what the machine makes from the adapter after
training, before it is let go: for a model whose merge does not fit this computer); ``[serve] after_training = true``
(the machine then serves the tuned model, OpenAI-compatible, through a port forwarded to this computer, until
``idle_minutes`` pass without a request or the run is stopped; see :class:`ServeSpec`); ``[judge] on_machine = true``
(base against tuned on the held-out rows, on the machine before it goes; see :class:`JudgeSpec`). Relative paths are
relative to the spec file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from trainer_payload.protocol import (
    ON_MACHINE_GGUF_TYPES,
    PREFERENCE_OBJECTIVES,
    TRACKERS,
    JobSpec,
    JobSpecError,
)

_TRAINING_EXCLUDED = {"base_model", "train_file", "eval_file", "output_dir", "version", "run_name"}
#: Job keys of a run across machines: each machine's own, set from ``[target] hosts`` (never by hand).
_NODE_KEYS = {"num_nodes", "node_rank", "head_address", "head_port"}
#: The port the nodes of a multi-machine run meet on at the head, unless ``[target] head_port`` says otherwise.
DEFAULT_HEAD_PORT = 29500


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


#: The GPU clouds ``[compute] provider`` may name (their clients live in ``desktop.services.providers``).
PROVIDER_NAMES = ("runpod", "vast", "lambda")


@dataclass(frozen=True)
class ComputeSpec:
    """A machine to rent for the run (``[compute]``).

    Attributes:
        provider: The GPU cloud (``runpod``, ``vast`` or ``lambda``).
        gpu: The GPU as ``rentune offers`` prints it, or the provider's own id (case-insensitive).
        count: GPUs in the machine.
        spot: Rent an interruptible machine (cheaper; recovered on another one when taken away).
        max_price_per_hour: The most the whole machine may cost per hour (None: no limit).
        offer: A specific ``offer_id`` from ``rentune offers`` (None: the cheapest matching offer).
        image: The container image (None: a PyTorch image the provider is known to run).
        python: The interpreter on the machine.
        disk_gb: Container disk.
        ready_timeout_minutes: How long a new machine may take to answer over SSH before it is given up.
        providers: Providers a spot run may move to when its machine is taken away (the first is ``provider``).
        user: The SSH login user (None: the provider's usual one, ``root`` or ``ubuntu``).
        idle_minutes: A rented machine that trains nothing for this long is terminated (0: never).
        self_stop_minutes: Laptop-closed safety (0: off): the machine terminates itself this long after training
            ended when nobody follows the run (RunPod and Vast.ai use the machine's own key).
        send_api_key: Lambda only: allow sending your Lambda API key to the machine for the self-stop (Lambda has
            no per-machine keys).
        nodes: Machines rented together as one cluster, each with ``count`` GPUs (RunPod Instant Clusters), one
            run across all of them; 1 is one machine.
    """

    provider: str
    gpu: str | None = None
    count: int = 1
    spot: bool = False
    max_price_per_hour: float | None = None
    offer: str | None = None
    image: str | None = None
    python: str = "python3"
    disk_gb: int = 50
    ready_timeout_minutes: float = 10.0
    providers: tuple[str, ...] = ()
    user: str | None = None
    idle_minutes: float = 20.0
    self_stop_minutes: float = 0.0
    send_api_key: bool = False
    nodes: int = 1

    @property
    def allowed_providers(self) -> tuple[str, ...]:
        """Where the run may rent: ``provider`` first, then the others ``providers`` allows."""
        return tuple(dict.fromkeys((self.provider, *self.providers)))


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


def targets_from_lines(text: str, base: SshTarget, machines: int) -> tuple[SshTarget, ...]:
    """The servers typed one per line for a run on ``machines`` machines, the head first.

    A line is ``user@host:port`` (``ssh://`` and the port optional). Each server gets ``base``'s key, interpreter and
    folders, and is pinned on first contact.

    Raises:
        RunSpecError: A line is not a server address, one server is named twice, or not one per machine.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != machines:
        raise RunSpecError(
            f"the run trains on {machines} machines: give one server per line ({len(lines)} given), the head first"
        )
    found = []
    for line in lines:
        user, host, port = parse_ssh_url(line if line.startswith("ssh://") else f"ssh://{line}")
        found.append(replace(base, user=user, host=host, port=port, host_key=None))
    if len({target.url for target in found}) != len(found):
        raise RunSpecError("a server is named twice: each machine of the run is a server of its own")
    return tuple(found)


@dataclass(frozen=True)
class ServeSpec:
    """``[serve]``: keep the machine after training and serve the tuned model from it (OpenAI-compatible).

    Attributes:
        name: The model name requests give (vLLM's LoRA module name; llama.cpp's model alias).
        idle_minutes: Serving ends, and the machine with it, after this long without a request.
        local_port: The port on this computer forwarded to the server (0: any free one).
        context: The context window the server gives the model, in tokens.
        backend: ``auto`` (vLLM with a GPU, else llama.cpp), ``vllm`` or ``llama.cpp``.
    """

    name: str = "tuned"
    idle_minutes: float = 30.0
    local_port: int = 0
    context: int = 4096
    backend: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The section as the run record keeps it."""
        return {
            "name": self.name,
            "idle_minutes": self.idle_minutes,
            "local_port": self.local_port,
            "context": self.context,
            "backend": self.backend,
        }


SERVE_BACKENDS = ("auto", "vllm", "llama.cpp")
_SERVE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def serve_from_dict(section: dict[str, Any]) -> ServeSpec | None:
    """``[serve]``: None unless ``after_training = true``.

    Raises:
        RunSpecError: An unknown key, or a value of the wrong kind or range; the message names it and the fix.
    """
    known = {"after_training", "name", "idle_minutes", "local_port", "context", "backend"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise RunSpecError(f"[serve] does not know {', '.join(unknown)}; it takes {', '.join(sorted(known))}")
    if section.get("after_training", False) is not True:
        if section.get("after_training", False) is not False:
            raise RunSpecError("[serve] after_training must be true or false")
        return None
    name = section.get("name", ServeSpec.name)
    if not isinstance(name, str) or not _SERVE_NAME.fullmatch(name):
        raise RunSpecError(f"[serve] name = {name!r}: give 1-64 letters, digits, - or _ (requests use it as model)")
    idle = section.get("idle_minutes", ServeSpec.idle_minutes)
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not 0.05 <= idle <= 1440:
        raise RunSpecError(f"[serve] idle_minutes = {idle!r}: give minutes from 0.05 to 1440 (a day)")
    port = section.get("local_port", 0)
    if type(port) is not int or not (port == 0 or 1024 <= port <= 65535):
        raise RunSpecError(f"[serve] local_port = {port!r}: give a port from 1024 to 65535, or 0 for any free one")
    context = section.get("context", ServeSpec.context)
    if type(context) is not int or not 128 <= context <= 1 << 20:
        raise RunSpecError(f"[serve] context = {context!r}: give a whole number of tokens from 128 up")
    backend = section.get("backend", "auto")
    if backend not in SERVE_BACKENDS:
        raise RunSpecError(f"[serve] backend = {backend!r}: give one of {', '.join(SERVE_BACKENDS)}")
    return ServeSpec(name, float(idle), port, context, backend)


@dataclass(frozen=True)
class JudgeSpec:
    """``[judge] on_machine = true``: base against tuned on the held-out rows, on the machine before it is let go.

    The GPU is paid for already, and answering twice per row there takes minutes where a laptop takes hours; the
    answers come home and are scored here (the report on the Models page, as ``rentune eval`` writes it).

    Attributes:
        max_examples: Held-out rows judged at most (the first ones).
        max_new_tokens: Longest answer generated per model and row, in tokens.
    """

    max_examples: int = 50
    max_new_tokens: int = 128

    def to_dict(self) -> dict[str, int]:
        """The section as the run record (and the machine's export job) keeps it."""
        return {"max_examples": self.max_examples, "max_new_tokens": self.max_new_tokens}


def judge_from_dict(section: dict[str, Any]) -> JudgeSpec | None:
    """``[judge]``: None unless ``on_machine = true``.

    Raises:
        RunSpecError: An unknown key, or a value of the wrong kind or range; the message names it and the fix.
    """
    known = {"on_machine", "max_examples", "max_new_tokens"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise RunSpecError(f"[judge] does not know {', '.join(unknown)}; it takes {', '.join(sorted(known))}")
    on_machine = section.get("on_machine", False)
    if on_machine not in (True, False) or type(on_machine) is not bool:
        raise RunSpecError("[judge] on_machine must be true or false")
    if not on_machine:
        return None
    values = {key: section.get(key, getattr(JudgeSpec, key)) for key in ("max_examples", "max_new_tokens")}
    for key, value in values.items():
        if type(value) is not int or not 1 <= value <= 10_000:
            raise RunSpecError(f"[judge] {key} = {value!r}: give a whole number from 1 to 10000")
    return JudgeSpec(**values)


@dataclass(frozen=True)
class RunSpec:
    """A run as the user described it.

    Attributes:
        base_model: Hub id or local path of the model.
        train_file: Training data (``messages`` JSONL, ideally from ``rentune data prepare``).
        eval_file: Optional eval data.
        training: The payload job keys (method, lora_r, seq_len...).
        target: Where to train (None when ``compute`` rents the machine).
        budget_usd: Stop the run once its cost so far reaches this (0: no limit; needs ``hourly_rate_usd``).
        hourly_rate_usd: What the target costs per hour (own servers: as the user states it).
        source: The spec file.
        compute: The machine to rent (None when ``target`` names one).
        estimate: What the wizard estimated at launch (``[estimate]``: ``hours``, and ``usd``, ``gpu``, ``count``,
            ``tokens_per_s``, ``peak_gb`` when known); the monitor compares the run with it.
        export_on_machine: What the machine makes after training (``merged``, ``gguf:TYPE``), empty for nothing.
        nodes: The other machines of a run across several (``[target] hosts`` after the first), in rank order.
        head_address: Where the other machines reach the head (rank 0): its address on their network.
        head_port: The port they meet on there.
        serve: Serve the tuned model from the machine after training (None: the machine goes once the adapter is
            home).
        judge: Judge base against tuned on the machine before it goes (None: judged at home, when asked).
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
    compute: ComputeSpec | None = None
    estimate: dict[str, Any] | None = None
    export_on_machine: tuple[str, ...] = ()
    nodes: tuple[SshTarget, ...] = ()
    head_address: str | None = None
    head_port: int = DEFAULT_HEAD_PORT
    serve: ServeSpec | None = None
    judge: JudgeSpec | None = None

    @property
    def num_nodes(self) -> int:
        """Machines the run trains on (1 unless ``[target] hosts`` names several)."""
        return 1 + len(self.nodes)

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
    return _ssh_target(str(section["ssh"]), section, base, _host_key(section.get("host_key")))


def _ssh_target(url: str, section: dict[str, Any], base: Path, host_key: str | None) -> SshTarget:
    """One machine of ``[target]``: its URL with the section's identity, python, workdir and key file."""
    user, host, port = parse_ssh_url(url)
    identity = _path(section["identity"], base, "[target] identity") if section.get("identity") else None
    workdir = str(section["workdir"]) if section.get("workdir") else None
    authorized = str(section["authorized_keys"]) if section.get("authorized_keys") else None
    python = str(section.get("python", "python3"))
    return SshTarget(user, host, port, identity, python, workdir, authorized, host_key)


def _hosts(section: dict[str, Any], base: Path) -> tuple[SshTarget, ...]:
    """``[target] hosts``: two or more machines, the head first; each must be a distinct ``ssh://`` URL.

    Raises:
        RunSpecError: Not a list of at least two distinct URLs, given beside ``ssh``, or with ``host_key``.
    """
    hosts = section.get("hosts")
    if hosts is None:
        return ()
    example = 'hosts = ["ssh://user@a:22", "ssh://user@b:22"]'
    if "ssh" in section:
        raise RunSpecError(f"[target] takes ssh (one machine) or hosts (several), not both; like {example}")
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, str) for h in hosts):
        raise RunSpecError(f"[target] hosts must list two or more machines, the head first, like {example}")
    if len(set(hosts)) != len(hosts):
        raise RunSpecError("[target] hosts names a machine twice: each node of the run is a machine of its own")
    if section.get("host_key"):
        raise RunSpecError("[target] host_key pins one machine; with hosts each one's key is pinned on first contact")
    return tuple(_ssh_target(url, section, base, None) for url in hosts)


def _head_port(section: dict[str, Any]) -> int:
    port = section.get("head_port", DEFAULT_HEAD_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise RunSpecError(f"[target] head_port = {port!r} must be a port number from 1024 to 65535")
    return port


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


def _check_judge(training: dict[str, Any], evaluation: Path | None) -> None:
    """Refuses ``[judge] on_machine`` where it cannot judge: no adapter, pairs or text instead of chats, no eval."""
    if training.get("method", JobSpec.method) not in ("qlora", "lora"):
        raise RunSpecError("[judge] on_machine compares base and adapter: it needs [training] method qlora or lora")
    objective = training.get("objective", JobSpec.objective)
    if objective in PREFERENCE_OBJECTIVES:
        raise RunSpecError(
            "[judge] on_machine asks chat rows held out from training: a preference run (objective "
            f'"{objective}") holds pairs out instead; remove [judge]'
        )
    if objective == "cpt":
        raise RunSpecError(
            "[judge] on_machine asks chat rows held out from training: continued pre-training holds out text, and "
            "says its perplexity before and after when it ends; remove [judge]"
        )
    if evaluation is None:
        raise RunSpecError(
            "[judge] on_machine judges the held-out rows: give [data] eval (rows set aside when the data is prepared)"
        )


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
    training = dict(_section(data, "training")) | tracking_from_dict(_section(data, "tracking"))
    clash = sorted(set(training) & _TRAINING_EXCLUDED)
    if clash:
        raise RunSpecError(f"[training] cannot set {', '.join(clash)} (they come from [model], [data] and the run)")
    by_target = sorted(set(training) & _NODE_KEYS)
    if by_target:
        raise RunSpecError(f"[training] cannot set {', '.join(by_target)}: [target] hosts names the machines")
    local_model = Path(model).expanduser()
    if not local_model.is_absolute() and (base_dir / local_model).exists():
        model = str((base_dir / local_model).resolve())
    _check_training_types(training)
    try:
        JobSpec.from_dict({"base_model": model, "train_file": "t", "output_dir": "o", **training})
    except (JobSpecError, TypeError) as exc:
        raise RunSpecError(f"[training]: {exc}") from exc
    target_section = _section(data, "target")
    hosts = _hosts(target_section, base_dir)
    target = hosts[0] if hosts else _target(target_section, base_dir)
    head_address = target_section.get("head_address")
    if head_address is not None and not (hosts and isinstance(head_address, str) and head_address.strip()):
        raise RunSpecError("[target] head_address is the head's address for the other hosts: give it with hosts")
    compute = compute_from_dict(data["compute"]) if "compute" in data else None
    if target is not None and compute is not None:
        raise RunSpecError("give either [target] (your own machine) or [compute] (a rented one), not both")
    budget, rate = _budget(_section(data, "budget"), rented=compute is not None)
    estimate = _estimate(_section(data, "estimate")) if "estimate" in data else None
    on_machine = export_on_machine(_section(data, "export"))
    if on_machine and training.get("method", JobSpec.method) not in ("qlora", "lora"):
        raise RunSpecError("[export] on_machine merges an adapter: it needs [training] method qlora or lora")
    serve = serve_from_dict(_section(data, "serve"))
    if serve is not None and training.get("method", JobSpec.method) not in ("qlora", "lora"):
        raise RunSpecError("[serve] serves the trained adapter: it needs [training] method qlora or lora")
    if serve is not None and (hosts[1:] or (compute is not None and compute.nodes > 1)):
        raise RunSpecError("[serve] serves from one machine: remove it, or train on one machine")
    judge = judge_from_dict(_section(data, "judge"))
    if judge is not None:
        _check_judge(training, evaluation)
    return RunSpec(
        model,
        train,
        evaluation,
        training,
        target,
        budget,
        rate,
        source,
        compute=compute,
        estimate=estimate,
        export_on_machine=on_machine,
        nodes=hosts[1:],
        head_address=(head_address or hosts[0].host).strip() if hosts else None,
        head_port=_head_port(target_section),
        serve=serve,
        judge=judge,
    )


#: ``[tracking]``'s keys and the job keys they set.
_TRACKING_KEYS = {"report_to": "report_to", "project": "tracking_project", "wandb_url": "wandb_url"}


def tracking_from_dict(section: dict[str, Any]) -> dict[str, Any]:
    """``[tracking]``: the training keys it sets ({} without the table).

    ``report_to`` lists the trackers (``tensorboard``, ``trackio``, ``wandb``); ``project`` names the trackio and W&B
    project (``rentune`` unless set); ``wandb_url`` is a W&B server of one's own (W&B's cloud unless set).

    Raises:
        RunSpecError: Another key, or a value that is not a list of trackers the payload knows.
    """
    unknown = sorted(set(section) - set(_TRACKING_KEYS))
    if unknown:
        raise RunSpecError(f"[tracking] does not know {', '.join(unknown)}; it takes {', '.join(_TRACKING_KEYS)}")
    asked = section.get("report_to", [])
    if not isinstance(asked, list) or not all(isinstance(item, str) for item in asked):
        raise RunSpecError(f'[tracking] report_to = {asked!r} must be a list, like report_to = ["tensorboard"]')
    others = [item for item in asked if item not in TRACKERS]
    if others:
        raise RunSpecError(f"[tracking] report_to {others[0]!r}: runs report to {', '.join(TRACKERS)}")
    keys: dict[str, Any] = {"report_to": list(dict.fromkeys(asked))} if "report_to" in section else {}
    for key in ("project", "wandb_url"):
        if key in section and not isinstance(section[key], str):
            raise RunSpecError(f"[tracking] {key} = {section[key]!r} must be a string")
        if key in section:
            keys[_TRACKING_KEYS[key]] = section[key]
    return keys


def export_on_machine(section: dict[str, Any]) -> tuple[str, ...]:
    """``[export] on_machine``: ``merged`` and ``gguf:TYPE`` (llama.cpp's converter's own types, and K-quants).

    Raises:
        RunSpecError: Another key, or an output the machine cannot make (the message names those it can).
    """
    unknown = sorted(set(section) - {"on_machine"})
    if unknown:
        raise RunSpecError(f"[export] does not know {', '.join(unknown)}; remove it")
    asked = section.get("on_machine", [])
    if not isinstance(asked, list):
        raise RunSpecError(f'[export] on_machine = {asked!r} must be a list, like on_machine = ["merged", "gguf:Q8_0"]')
    allowed = ["merged", *(f"gguf:{qtype}" for qtype in ON_MACHINE_GGUF_TYPES)]
    if any(item not in allowed for item in asked):
        raise RunSpecError(
            f"[export] on_machine = {asked!r}: the machine can make {', '.join(allowed)}; other types are made at "
            "home from the adapter, after training"
        )
    return tuple(dict.fromkeys(asked))


_ESTIMATE_NUMBERS = ("hours", "usd", "tokens_per_s", "peak_gb")


def _estimate(section: dict[str, Any]) -> dict[str, Any]:
    """``[estimate]``: hours (required), dollars, tokens/s and peak GB as numbers of 0 or more, gpu, GPU count."""
    for key in _ESTIMATE_NUMBERS:
        value = section.get(key)
        if value is None and key != "hours":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise RunSpecError(f"[estimate] {key} must be a number of 0 or more (it is {value!r})")
    if not isinstance(section.get("gpu", ""), str):
        raise RunSpecError("[estimate] gpu must be the GPU's name as text")
    count = section.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RunSpecError(f"[estimate] count must be a whole number of GPUs, 1 or more (it is {count!r})")
    unknown = sorted(set(section) - {*_ESTIMATE_NUMBERS, "gpu", "count"})
    if unknown:
        raise RunSpecError(f"[estimate] does not know {', '.join(unknown)}; remove it")
    return dict(section)


def _budget(section: dict[str, Any], *, rented: bool = False) -> tuple[float, float]:
    """``[budget] max_usd`` and ``hourly_rate_usd``; an own machine's budget needs a rate (a rented one has a price)."""
    budget, rate = _dollars(section, "max_usd"), _dollars(section, "hourly_rate_usd")
    if budget > 0 and rate <= 0 and not rented:
        raise RunSpecError(
            f"[budget] max_usd = {budget:g} needs [budget] hourly_rate_usd (what the machine costs per hour) to "
            "know when it is reached; set the rate, or remove max_usd"
        )
    return budget, rate


_COMPUTE_KEYS = {f.name for f in fields(ComputeSpec)}


def _compute_number(section: dict[str, Any], key: str, default: float, *, whole: bool = False) -> float:
    value = section.get(key, default)
    kind_ok = isinstance(value, int) if whole else isinstance(value, int | float)
    if isinstance(value, bool) or not kind_ok or not 0 < value < math.inf:
        example = "1" if whole else "2.5"
        raise RunSpecError(
            f"[compute] {key} = {value!r} must be a {'whole ' if whole else ''}number above 0, like {example}"
        )
    return float(value)


def _compute_text(section: dict[str, Any], key: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RunSpecError(f'[compute] {key} must be text, like {key} = "..." (or leave it out)')
    return value.strip()


def _provider(value: Any, key: str) -> str:
    name = str(value).strip().lower().removesuffix(".ai") if isinstance(value, str) else ""
    if name not in PROVIDER_NAMES:
        raise RunSpecError(f"[compute] {key} = {value!r}: use one of {', '.join(PROVIDER_NAMES)}")
    return name


def compute_from_dict(section: Any) -> ComputeSpec:
    """Validates ``[compute]``.

    Raises:
        RunSpecError: A key is unknown, missing or of the wrong kind; the message names it.
    """
    if not isinstance(section, dict):
        raise RunSpecError("[compute] must be a table")
    unknown = sorted(set(section) - _COMPUTE_KEYS)
    if unknown:
        raise RunSpecError(f"[compute] does not know {', '.join(unknown)}; it takes {', '.join(sorted(_COMPUTE_KEYS))}")
    if "provider" not in section:
        raise RunSpecError(f"[compute] provider is required: one of {', '.join(PROVIDER_NAMES)}")
    others = section.get("providers", [])
    if not isinstance(others, list):
        raise RunSpecError('[compute] providers must be a list, like providers = ["runpod", "vast"]')
    spot, send_key = _flag(section, "spot"), _flag(section, "send_api_key")
    price = section.get("max_price_per_hour")
    self_stop = _minutes(section, "self_stop_minutes", 0.0)
    provider = _provider(section["provider"], "provider")
    if provider == "lambda" and self_stop and not send_key:
        raise RunSpecError(
            "[compute] self_stop_minutes on Lambda needs send_api_key = true: Lambda has no per-machine keys, so the "
            "machine can stop itself only with your API key (kept in memory there, never on its disk). Add "
            "send_api_key = true to allow it, or remove self_stop_minutes"
        )
    nodes = int(_compute_number(section, "nodes", 1, whole=True))
    _check_cluster(nodes, provider, spot, bool(self_stop) and not send_key, others)
    return ComputeSpec(
        provider=provider,
        gpu=_compute_text(section, "gpu"),
        count=int(_compute_number(section, "count", 1, whole=True)),
        spot=spot,
        max_price_per_hour=None if price is None else float(_compute_number(section, "max_price_per_hour", 0)),
        offer=_compute_text(section, "offer"),
        image=_compute_text(section, "image"),
        python=_compute_text(section, "python") or "python3",
        disk_gb=int(_compute_number(section, "disk_gb", 50, whole=True)),
        ready_timeout_minutes=float(_compute_number(section, "ready_timeout_minutes", 10.0)),
        providers=tuple(_provider(p, "providers") for p in others),
        user=_compute_text(section, "user"),
        idle_minutes=_minutes(section, "idle_minutes", 20.0),
        self_stop_minutes=self_stop,
        send_api_key=send_key,
        nodes=nodes,
    )


#: Providers that rent several machines as one cluster through their API.
CLUSTER_PROVIDERS = ("runpod",)


def _check_cluster(nodes: int, provider: str, spot: bool, keyless_self_stop: bool, others: list[Any]) -> None:
    """Refuses what a cluster cannot be: at another provider, spot, stopping itself without a key, moving providers."""
    if nodes == 1:
        return
    if provider not in CLUSTER_PROVIDERS or any(_provider(p, "providers") != provider for p in others):
        raise RunSpecError(
            f"[compute] nodes = {nodes}: only RunPod rents several machines as one cluster (Instant Clusters); set "
            'provider = "runpod" without other providers, or train on your own machines with [target] hosts'
        )
    if not 2 <= nodes <= 250:
        raise RunSpecError(f"[compute] nodes = {nodes}: a RunPod cluster has 2 to 250 machines")
    if spot:
        raise RunSpecError("[compute] nodes: clusters are not sold as spot machines; remove spot = true")
    if keyless_self_stop:
        raise RunSpecError(
            "[compute] self_stop_minutes with nodes needs send_api_key = true: a cluster's machines cannot delete "
            "their cluster with their own keys, so its head can stop it only with your RunPod API key (kept in memory "
            "there, never on its disk). Add send_api_key = true to allow it, or remove self_stop_minutes"
        )


def _flag(section: dict[str, Any], key: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise RunSpecError(f"[compute] {key} = {value!r} must be true or false")
    return value


def _minutes(section: dict[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise RunSpecError(f"[compute] {key} = {value!r} must be a number of minutes (0: never)")
    return float(value)
