"""The new-run wizard's state: what the user has chosen so far, saved between sessions.

A draft turns into the same ``SPEC.toml`` structure the CLI reads (see :mod:`desktop.core.runs.spec`), so the GUI
and the CLI launch runs the same way.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainer_payload.protocol import job_default

DRAFT_SCHEMA_VERSION = 1

#: Training keys the wizard starts from: the payload's job keys and defaults (whole minutes and epochs for the
#: wizard's boxes).
DEFAULT_TRAINING: dict[str, Any] = {
    "lora_r": job_default("lora_r"),
    "lora_alpha": job_default("lora_alpha"),
    "seq_len": job_default("seq_len"),
    "micro_batch": job_default("micro_batch"),
    "grad_accum": job_default("grad_accum"),
    "epochs": int(job_default("epochs")),
    "learning_rate": job_default("learning_rate"),
    "checkpoint_minutes": int(job_default("checkpoint_minutes")),
    "keep_checkpoints": job_default("keep_checkpoints"),
}


_MULTI_GPU_PICK = re.compile(r"^(?P<count>\d+) x .+?(?: \((?P<strategy>\w+)\))?$")


def gpu_pick_label(gpu: str, count: int, strategy: str) -> str:
    """What the sizing step stores in ``gpu_name``: ``H100 SXM``, or ``2 x H100 SXM (fsdp)`` for several GPUs."""
    return gpu if count == 1 else f"{count} x {gpu} ({strategy})"


def gpu_pick_training(label: str) -> dict[str, Any]:
    """The training keys a sizing pick sets: ``num_gpus``, and ``strategy`` for several GPUs ({} for no pick)."""
    if not label:
        return {}
    found = _MULTI_GPU_PICK.match(label)
    if found is None:
        return {"num_gpus": 1}
    keys: dict[str, Any] = {"num_gpus": int(found["count"])}
    if found["strategy"]:  # drafts saved before the strategy was part of the label name only the count
        keys["strategy"] = found["strategy"]
    return keys


class TargetDraft(BaseModel):
    """The "own server" target as typed into the wizard.

    Attributes:
        host: Host name or address.
        port: SSH port.
        user: Login user.
        identity: Private key file ("" for the SSH agent or default keys).
        python: Interpreter on the host.
        workdir: Folder for run folders on the host ("" for ``~/.rentune/runs``).
        authorized_keys: The file the host's sshd reads client keys from ("" for ``~/.ssh/authorized_keys``).
        host_key: The host key pinned by Test connection (OpenSSH public key line), "" until tested.
        fingerprint: SHA-256 fingerprint of ``host_key``, shown to the user.
        gpu: What Test connection found (nvidia-smi summary, or "no GPU").
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    host: str = ""
    port: int = Field(default=22, ge=1, le=65535)
    user: str = ""
    identity: str = ""
    python: str = "python3"
    workdir: str = ""
    authorized_keys: str = ""
    host_key: str = ""
    fingerprint: str = ""
    gpu: str = ""

    @property
    def url(self) -> str:
        """The target as ``ssh://user@host:port``."""
        return f"ssh://{self.user}@{self.host}:{self.port}"


class RunDraft(BaseModel):
    """Everything the wizard collects, page by page.

    Attributes:
        schema_version: Version of this layout.
        data_file: The dataset the user picked (JSONL, CSV or Parquet).
        train_file: The prepared ``messages`` JSONL to upload ("" until prepared).
        eval_file: The prepared eval split ("" for none).
        data_columns: For a table (CSV, Parquet): role (``user``, ``assistant``, ``system``) → column; empty means
            guessed from the column names.
        leave_out_secrets: Leave rows with a suspected secret (API key, token) out of the prepared data.
        base_model: Hub id or local model folder.
        method: ``qlora``, ``lora``, ``full`` or ``full-8bit``.
        training: The payload's job keys (see :data:`DEFAULT_TRAINING`).
        gpu_name: The option picked on the sizing page (see :func:`gpu_pick_label`; "" for none yet); its GPU count
            (and strategy) go into the spec's training keys.
        target: Where to train.
        hourly_rate_usd: What the target costs per hour, as the user states it.
        budget_usd: Stop spending past this (0: no limit).
        step: The wizard page last shown, so a reopened wizard continues there.
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    schema_version: int = DRAFT_SCHEMA_VERSION
    data_file: str = ""
    train_file: str = ""
    eval_file: str = ""
    data_columns: dict[str, str] = Field(default_factory=dict)
    leave_out_secrets: bool = False
    base_model: str = ""
    method: str = "qlora"
    training: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_TRAINING))
    gpu_name: str = ""
    target: TargetDraft = Field(default_factory=TargetDraft)
    hourly_rate_usd: float = Field(default=0.0, ge=0.0)
    budget_usd: float = Field(default=0.0, ge=0.0)
    step: str = "data"

    def spec_dict(self) -> dict[str, Any]:
        """The draft as a ``SPEC.toml`` document (the structure :func:`run_spec_from_dict` reads)."""
        target: dict[str, Any] = {"ssh": self.target.url, "python": self.target.python or "python3"}
        optional = {
            "identity": self.target.identity,
            "workdir": self.target.workdir,
            "authorized_keys": self.target.authorized_keys,
            "host_key": self.target.host_key,
        }
        target.update({key: value for key, value in optional.items() if value})
        data = {"train": self.train_file}
        if self.eval_file:
            data["eval"] = self.eval_file
        return {
            "model": {"base": self.base_model},
            "data": data,
            "training": {"method": self.method, **self.training, **gpu_pick_training(self.gpu_name)},
            "target": target,
            "budget": {"hourly_rate_usd": self.hourly_rate_usd, "max_usd": self.budget_usd},
        }
