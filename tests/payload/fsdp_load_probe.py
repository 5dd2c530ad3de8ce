"""One rank of a distributed run, doing the payload's real load path and saying what it read.

Run under ``accelerate launch`` with the payload's own launch options (``python -m accelerate.commands.launch
OPTIONS -m tests.payload.fsdp_load_probe OUT JOB...``). For each job it prepares the run as the payload does
(tokenizer, data, process group, model) while every opening of a weights file in the model's folder is counted:
safetensors' ``safe_open`` wherever a module imported it, and Python's own ``open`` (an audit hook). It writes
``OUT/<job stem>-rank<N>.json``: the weights files opened, each parameter's device, dtype and shape, each buffer's
sum, and whether every parameter equals the file's tensor. On GPUs it then builds the payload's trainer and lets
accelerate shard the model as training does, and gathers it whole again: every rank must hold rank 0's weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def spy_on_opens(folder: Path) -> list[str]:
    """Records every opening of a weights file under ``folder`` from now on; returns the list it fills."""
    import safetensors

    opened: list[str] = []
    inside = str(folder.resolve())

    def is_weights(path: Any) -> bool:
        return str(Path(path).resolve()).startswith(inside) and str(path).endswith(WEIGHTS_SUFFIXES)

    original = safetensors.safe_open

    def counted_safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        if is_weights(filename):
            opened.append(f"safe_open {Path(filename).name}")
        return original(filename, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "safe_open", None) is original:
            setattr(module, "safe_open", counted_safe_open)  # noqa: B010 - any module, typed or not

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(args[0], str | Path) and is_weights(args[0]):
            opened.append(f"open {Path(args[0]).name}")

    sys.addaudithook(audit)
    return opened


def describe(model: Any, folder: Path) -> dict[str, Any]:
    """Each parameter's class, device, dtype and shape, each buffer's sum; whether the weights are the file's."""
    params = {
        name: {
            "kind": type(p).__name__,
            "device": str(p.device),
            "dtype": str(p.dtype).removeprefix("torch."),
            "shape": list(p.shape),
        }
        for name, p in model.named_parameters()
    }
    buffers = {name: float(b.float().sum()) for name, b in model.named_buffers() if b.device.type != "meta"}
    report: dict[str, Any] = {"params": params, "buffers": buffers}
    if getattr(model, "hf_quantizer", None) is None and all(p["device"] != "meta" for p in params.values()):
        report["equal_to_file"] = equal_to_file(model, folder)
    return report


def equal_to_file(model: Any, folder: Path) -> bool:
    """Whether every parameter stored in the model's weights file holds exactly the file's values."""
    import torch
    from safetensors.torch import load_file

    stored = {name: t for file in sorted(folder.glob("*.safetensors")) for name, t in load_file(str(file)).items()}
    return all(
        name not in stored or torch.equal(stored[name].to(p.dtype), p.detach()) for name, p in model.named_parameters()
    )


def probe(job: Path, out: Path, opened: list[str]) -> None:
    """Prepares ``job`` as the payload does and writes what this rank read (on GPUs: and what FSDP made of it)."""
    import torch
    import torch.distributed as dist

    from trainer_payload.hardware import use_bf16
    from trainer_payload.protocol import EventWriter, JobSpec
    from trainer_payload.train import PayloadRun, Stop

    spec = JobSpec.load(job)
    before = len(opened)
    run = PayloadRun(spec, EventWriter(out / f"{job.stem}-events.jsonl"), Stop())
    model, tokenizer, data = run._prepare("trl", bf16=use_bf16())
    rank = dist.get_rank()
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "opened": opened[before:],
        **describe(model, Path(spec.base_model)),
    }
    if torch.cuda.is_available():  # accelerate wraps a model in FSDP only where there are GPUs
        report["sharded"] = shard(run, model, tokenizer, data)
    (out / f"{job.stem}-rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


def byte_sums(parameters: Any) -> dict[str, int]:
    """Each parameter's bytes summed (exact, and blind to NaN bit patterns in packed 4-bit weights)."""
    import torch

    return {
        name: int(p.detach().contiguous().view(torch.uint8).sum(dtype=torch.int64))
        for name, p in parameters
        if p.device.type != "meta"
    }


def shard(run: Any, model: Any, tokenizer: Any, data: tuple[Any, Any, int]) -> dict[str, Any]:
    """Builds the payload's trainer and lets accelerate shard its model as training would; then gathers it whole.

    Returns each parameter's byte sum before sharding (rank 0: the weights it read; the other ranks: nothing, they
    start empty) and after gathering the shards (every rank: the whole model, which must be rank 0's).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    from transformers.integrations.fsdp import update_fsdp_plugin_peft
    from trl import SFTTrainer

    from trainer_payload.hardware import use_bf16

    trainer = run._trainer(SFTTrainer, "trl", model, tokenizer, (data[0], data[1]), use_bf16())
    before = byte_sums(trainer.model.named_parameters())
    update_fsdp_plugin_peft(trainer.model, trainer.accelerator)  # as Trainer.train does for an adapter under FSDP
    wrapped = trainer.accelerator.prepare(trainer.model)
    with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False):
        after = byte_sums(wrapped.named_parameters())
    prefix = "_fsdp_wrapped_module."
    return {"before": before, "after": {name.replace(prefix, ""): value for name, value in after.items()}}


def write_fsdp_job(folder: Path, name: str, model: Path, num_gpus: int = 2, **keys: Any) -> Path:
    """``folder/name.json``: an FSDP job for ``model`` on ``num_gpus`` GPUs, reading ``folder/train.jsonl``."""
    job = {
        "base_model": str(model),
        "train_file": "train.jsonl",
        "output_dir": f"out-{name}",
        "num_gpus": num_gpus,
        "strategy": "fsdp",
        "seq_len": 64,
        **keys,
    }
    (folder / f"{name}.json").write_text(json.dumps(job), encoding="utf-8")
    return folder / f"{name}.json"


def launch(jobs: list[Path], out: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs this probe on the ranks ``accelerate launch`` starts with the payload's launch options for ``jobs[0]``."""
    from trainer_payload.protocol import JobSpec
    from trainer_payload.train import launch_options

    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launch_options(JobSpec.load(jobs[0])),
        "-m",
        "tests.payload.fsdp_load_probe",
        str(out),
        *map(str, jobs),
    ]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def rank_reports(out: Path, job: Path, world_size: int = 2) -> list[dict[str, Any]]:
    """What each rank said about ``job``, rank 0 first."""
    return [json.loads((out / f"{job.stem}-rank{rank}.json").read_text(encoding="utf-8")) for rank in range(world_size)]


def main(argv: list[str]) -> int:
    """``OUT JOB...``: probes each job in turn, in this rank."""
    out, jobs = Path(argv[0]), [Path(arg) for arg in argv[1:]]
    import peft  # noqa: F401 - imported before the spy, so that every module holding safe_open is seen
    import trl  # noqa: F401

    import trainer_payload.train  # noqa: F401
    from trainer_payload.protocol import JobSpec

    opened = spy_on_opens(Path(JobSpec.load(jobs[0]).base_model))
    for job in jobs:
        probe(job, out, opened)
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
