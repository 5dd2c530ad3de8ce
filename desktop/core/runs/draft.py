"""The new-run wizard's state: what the user has chosen so far, saved between sessions.

A draft turns into the same ``SPEC.toml`` structure the CLI reads (see :mod:`desktop.core.runs.spec`), so the GUI
and the CLI launch runs the same way.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from desktop.core.data.formats import DataFormat, objective_data_problem, objective_for
from trainer_payload.protocol import job_default

DRAFT_SCHEMA_VERSION = 1
#: A rented machine's price may rise this much between the pick and the rental before the rental is refused.
PRICE_MARGIN = 1.10

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
    "eval_steps": job_default("eval_steps"),
    "max_steps": job_default("max_steps"),  # 0: every epoch (a quick trial sets a number)
}


_MULTI_GPU_PICK = re.compile(r"^(?:(?P<nodes>\d+) machines x )?(?P<count>\d+) x .+?(?: \((?P<strategy>\w+)\))?$")


def gpu_pick_label(gpu: str, count: int, strategy: str, nodes: int = 1) -> str:
    """What the sizing step stores in ``gpu_name`` for its pick of GPUs and machines.

    ``H100 SXM``, ``2 x H100 SXM (fsdp)`` for several GPUs, or ``2 machines x 8 x H100 SXM (fsdp)`` for several
    machines.
    """
    if nodes > 1:
        return f"{nodes} machines x {count} x {gpu} ({strategy})"
    return gpu if count == 1 else f"{count} x {gpu} ({strategy})"


def gpu_pick_nodes(label: str) -> int:
    """The machines a sizing pick asks for (1 unless it picked several machines as one cluster)."""
    found = _MULTI_GPU_PICK.match(label) if label else None
    return int(found["nodes"]) if found is not None and found["nodes"] else 1


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


class ComputeDraft(BaseModel):
    """A machine to rent, as picked on the Compute step (the offer as the provider listed it).

    Attributes:
        provider: ``runpod``, ``vast`` or ``lambda`` ("" until an offer is picked).
        offer_id: The provider's id of the picked offer (the first machine rents exactly this offer).
        gpu: The GPU's display name ("RTX 4090").
        gpu_id: The provider's own GPU or type id.
        count: GPUs in the machine.
        vram_gb: Memory per GPU, GB.
        price_per_hour: The whole machine's price when it was picked (dollars per hour).
        spot: Interruptible (cheaper; a machine taken away is replaced and the run resumes).
        reliability: The provider's score from 0 to 1 (None where it publishes none).
        location: Region or data centre.
        nodes: Machines rented together as one cluster (1: a single machine); ``count`` GPUs each, and
            ``price_per_hour`` is all of them together.
        strategy: How several GPUs share the job (``ddp`` or ``fsdp``), as the sizing judged best for the machine.
        max_price_per_hour: The most the machine may cost per hour when it is rented (0: the pick's price plus
            :data:`PRICE_MARGIN`).
        python: The interpreter on the machine ("" for ``python3``).
        user: The SSH login user ("" for the provider's usual one).
        image: The container image ("" for a PyTorch image the provider is known to run).
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    provider: str = ""
    offer_id: str = ""
    gpu: str = ""
    gpu_id: str = ""
    count: int = Field(default=1, ge=1)
    vram_gb: float = Field(default=0.0, ge=0.0)
    price_per_hour: float = Field(default=0.0, ge=0.0)
    spot: bool = False
    reliability: float | None = None
    location: str = ""
    nodes: int = Field(default=1, ge=1)
    strategy: str = "ddp"
    max_price_per_hour: float = Field(default=0.0, ge=0.0)
    python: str = ""
    user: str = ""
    image: str = ""

    @property
    def picked(self) -> bool:
        """Whether an offer was picked."""
        return bool(self.provider and self.offer_id)

    @property
    def price_cap(self) -> float:
        """The most the rental may cost per hour: the stated maximum, else the pick's price plus the margin."""
        if self.max_price_per_hour > 0:
            return self.max_price_per_hour
        return math.ceil(self.price_per_hour * PRICE_MARGIN * 100 - 1e-9) / 100

    def spec_section(self) -> dict[str, Any]:
        """The pick as ``SPEC.toml``'s ``[compute]`` table (see :func:`desktop.core.runs.spec.compute_from_dict`)."""
        section: dict[str, Any] = {
            "provider": self.provider,
            "gpu": self.gpu,
            "count": self.count,
            "spot": self.spot,
            "offer": self.offer_id,
        }
        if self.nodes > 1:
            section["nodes"] = self.nodes
        if self.price_cap > 0:
            section["max_price_per_hour"] = self.price_cap
        optional = {"python": self.python, "user": self.user, "image": self.image}
        section.update({key: value for key, value in optional.items() if value})
        return section

    def training_keys(self) -> dict[str, Any]:
        """The training keys the machine sets: its GPU count, and the strategy for several GPUs."""
        if self.count * self.nodes == 1:
            return {"num_gpus": 1}
        return {"num_gpus": self.count, "strategy": self.strategy}


class RunDraft(BaseModel):
    """Everything the wizard collects, page by page.

    Attributes:
        schema_version: Version of this layout.
        data_file: The dataset the user picked (JSONL, CSV or Parquet).
        train_file: The prepared ``messages`` JSONL to upload ("" until prepared).
        eval_file: The prepared eval split ("" for none).
        data_format: The layout the data step found (a ``DataFormat`` value: ``pairs`` for preference pairs, ``text``
            for raw text), "" until checked: it decides which objectives the Model step offers.
        data_columns: For a table (CSV, Parquet): role (``user``, ``assistant``, ``system``) → column; empty means
            guessed from the column names.
        leave_out_secrets: Leave rows with a suspected secret (API key, token) out of the prepared data.
        base_model: Hub id or local model folder.
        method: ``qlora``, ``lora``, ``full`` or ``full-8bit``.
        training: The payload's job keys (see :data:`DEFAULT_TRAINING`).
        gpu_name: The option picked on the sizing page (see :func:`gpu_pick_label`; "" for none yet); its GPU count
            (and strategy) go into the spec's training keys.
        renting: Rent a machine (``compute``) rather than train on the own server (``target``). A draft that names
            no choice (one saved before renting came to the wizard) rents unless it names a server.
        compute: The machine to rent, as picked on the Compute step.
        target: The own server.
        hourly_rate_usd: What the target costs per hour, as the user states it.
        budget_usd: Stop spending past this (0: no limit).
        step: The wizard page last shown, so a reopened wizard continues there.
        export_on_machine: What the machine makes after training (``merged``, ``gguf:Q8_0``); empty: everything at
            home; None: not chosen (the review proposes the machine when the merge does not fit this computer).
        serve_after_training: Keep the machine after training and serve the tuned model from it (``[serve]``).
        judge_on_machine: Judge base against tuned on the held-out rows on the machine before it goes (``[judge]``;
            written only with an eval file).
        serve_idle_minutes: Serving ends, and the machine with it, after this long without a request.
        launched_run: The run last launched from this draft ("" for none).
        launched_digest: :meth:`content_digest` when it was launched: the draft is "launched" only while its
            choices are still those (an edit makes it a new draft, which may be launched again).
    """

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    schema_version: int = DRAFT_SCHEMA_VERSION
    data_file: str = ""
    train_file: str = ""
    eval_file: str = ""
    data_format: str = ""
    data_columns: dict[str, str] = Field(default_factory=dict)
    leave_out_secrets: bool = False
    base_model: str = ""
    method: str = "qlora"
    training: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_TRAINING))
    gpu_name: str = ""
    renting: bool = True
    compute: ComputeDraft = Field(default_factory=ComputeDraft)
    target: TargetDraft = Field(default_factory=TargetDraft)
    hourly_rate_usd: float = Field(default=0.0, ge=0.0)
    budget_usd: float = Field(default=0.0, ge=0.0)
    step: str = "data"
    export_on_machine: list[str] | None = None
    serve_after_training: bool = False
    judge_on_machine: bool = False
    serve_idle_minutes: float = Field(default=30.0, ge=1.0, le=1440.0)
    launched_run: str = ""
    launched_digest: str = ""

    @model_validator(mode="before")
    @classmethod
    def _choose_renting(cls, data: Any) -> Any:
        """A draft without ``renting`` rents, unless it names an own server (drafts from before renting did)."""
        if isinstance(data, dict) and "renting" not in data:
            target = data.get("target")
            host = target.get("host") if isinstance(target, dict) else getattr(target, "host", "")
            return {**data, "renting": not host}
        return data

    @property
    def objective(self) -> str:
        """What the training optimises: ``sft`` unless ``training`` names another (``dpo``, ``orpo``)."""
        return str(self.training.get("objective", "sft"))

    @property
    def can_judge_on_machine(self) -> bool:
        """Whether the machine can judge base against tuned: held-out chats (pairs and raw text are measured else)."""
        return bool(self.eval_file) and self.objective == "sft"

    def fit_objective_to_data(self) -> None:
        """Keeps the objective one the data can train: DPO for pairs (unless ORPO is chosen), CPT for text, else SFT.

        A preference objective's ``beta`` goes with it when the data is no longer pairs.
        """
        known = {fmt.value for fmt in DataFormat}
        fmt = DataFormat(self.data_format) if self.data_format in known else DataFormat.MESSAGES
        if not objective_data_problem(self.objective, fmt):
            return
        wanted = objective_for(fmt)
        for key in ("objective", "beta", "loss_type"):
            self.training.pop(key, None)
        if wanted != "sft":
            self.training["objective"] = wanted

    def content_digest(self) -> str:
        """A fingerprint of the choices (not the page shown nor the launch record): equal drafts launch equal runs."""
        choices = self.model_dump_json(exclude={"step", "launched_run", "launched_digest"})
        return hashlib.sha256(choices.encode()).hexdigest()

    def mark_launched(self, run_id: str) -> None:
        """Records that ``run_id`` was launched from the draft as it is now."""
        self.launched_digest = self.content_digest()
        self.launched_run = run_id

    @property
    def launched(self) -> bool:
        """Whether the draft, exactly as it is, was launched (Launch stays off: it would rent the same run twice)."""
        return bool(self.launched_run) and self.launched_digest == self.content_digest()

    def spec_dict(self) -> dict[str, Any]:
        """The draft as a ``SPEC.toml`` document (the structure :func:`run_spec_from_dict` reads).

        A renting draft writes ``[compute]`` (once an offer is picked), with the machine's GPU count in
        ``[training]``; an own-server draft writes ``[target]`` and the Sizing step's GPU count.
        """
        data = {"train": self.train_file}
        if self.eval_file:
            data["eval"] = self.eval_file
        spec: dict[str, Any] = {"model": {"base": self.base_model}, "data": data}
        if self.export_on_machine:
            spec["export"] = {"on_machine": list(self.export_on_machine)}
        if self.serve_after_training:
            spec["serve"] = {"after_training": True, "idle_minutes": self.serve_idle_minutes}
        if self.judge_on_machine and self.can_judge_on_machine:
            spec["judge"] = {"on_machine": True}
        return spec | (self._rented_sections() if self.renting else self._own_sections())

    def _rented_sections(self) -> dict[str, Any]:
        picked = self.compute.picked
        machine = self.compute.training_keys() if picked else {}
        sections: dict[str, Any] = {"training": {"method": self.method, **self.training, **machine}}
        if picked:
            sections["compute"] = self.compute.spec_section()
        sections["budget"] = {"max_usd": self.budget_usd}  # a rented machine's price is known: no rate
        return sections

    def _own_sections(self) -> dict[str, Any]:
        return {
            "training": {"method": self.method, **self.training, **gpu_pick_training(self.gpu_name)},
            "target": self._target_section(),
            "budget": {"hourly_rate_usd": self.hourly_rate_usd, "max_usd": self.budget_usd},
        }

    def _target_section(self) -> dict[str, Any]:
        target: dict[str, Any] = {"ssh": self.target.url, "python": self.target.python or "python3"}
        optional = {
            "identity": self.target.identity,
            "workdir": self.target.workdir,
            "authorized_keys": self.target.authorized_keys,
            "host_key": self.target.host_key,
        }
        target.update({key: value for key, value in optional.items() if value})
        return target
