"""One rank of a distributed run, doing the payload's real load path and saying what it read.

Run under ``accelerate launch`` with the payload's own launch options (``python -m accelerate.commands.launch
OPTIONS -m tests.payload.fsdp_load_probe OUT JOB...``). For each job it prepares the run as the payload does
(tokenizer, data, process group, model) while every opening of a weights file in the model's folder is counted:
safetensors' ``safe_open`` wherever a module imported it, and Python's own ``open`` (an audit hook). It writes
``OUT/<job stem>-rank<N>.json``: the weights files opened, each parameter's device, dtype and shape, each buffer's
sum, and on rank 0 whether every parameter equals the file's tensor.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
            "device": p.device.type,
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

    stored = load_file(str(folder / "model.safetensors"))
    return all(
        name not in stored or torch.equal(stored[name].to(p.dtype), p.detach()) for name, p in model.named_parameters()
    )


def probe(job: Path, out: Path, opened: list[str]) -> None:
    """Prepares ``job`` as the payload does and writes what this rank read."""
    import torch.distributed as dist

    from trainer_payload.protocol import EventWriter, JobSpec
    from trainer_payload.train import PayloadRun, Stop

    spec = JobSpec.load(job)
    before = len(opened)
    run = PayloadRun(spec, EventWriter(out / f"{job.stem}-events.jsonl"), Stop())
    model, _tokenizer, _data = run._prepare("trl", bf16=False)
    rank = dist.get_rank()
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "opened": opened[before:],
        **describe(model, Path(spec.base_model)),
    }
    (out / f"{job.stem}-rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


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
