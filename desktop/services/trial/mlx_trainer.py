"""A trial trained by mlx-lm's own LoRA trainer in a child process, and its adapter turned into a PEFT one.

The child runs ``mlx_lm.lora`` (what ``python -m mlx_lm lora --config FILE`` runs) through a short script given
to ``python -c``: mlx-lm trains exactly as its command line does, and the script only adds a callback that prints
each training report as one JSON line (mlx-lm 0.32 prints its own report rounded, and without the peak memory).
Everything else the child prints is kept for the error message. mlx and mlx_lm are imported only in the child.

mlx-lm saves its adapter in its own layout (``adapters.safetensors`` with ``lora_a`` (in, r) and ``lora_b``
(r, out) per layer, and ``adapter_config.json`` with the scale); :func:`mlx_adapter_to_peft` writes the same adapter
as PEFT reads it, so Chat, compare and export use a trial's adapter like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop.core.runs.trial import TrialStep
from desktop.services.platform.secrets import without_secrets
from desktop.services.trial.errors import TrialError

if TYPE_CHECKING:
    import numpy.typing as npt

#: Folders a trial writes under its ``out_dir``: mlx-lm's adapter, and the same adapter for PEFT.
MLX_ADAPTER_DIR = "mlx-adapter"
PEFT_ADAPTER_DIR = "adapter"
#: mlx-lm's configuration for the child (JSON, which its YAML loader reads).
CONFIG_FILE = "mlx-lora.yaml"
#: Seconds a cancelled child gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 5.0
#: Output lines kept of a failed child, and how many of them (traceback frames left out) its error message shows.
TAIL_LINES = 40
SHOWN_LINES = 6

_STEP_MARK = "RENTUNE-TRIAL-STEP:"
_MLX_MISSING_MARK = "RENTUNE-MLX-MISSING"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_FRAME = re.compile(r'^\s+File "')
_DRAWING = re.compile("[\u2500-\u259f]+")  # box drawing and block elements: rich's panels and progress bars

# mlx_lm.lora imports its trainer by name and hands it the reporting callback; wrapping that one name adds ours to
# whatever mlx-lm reports to (wandb, swanlab) without changing how it trains.
_LORA = f"""
import json, sys
try:
    import mlx.core
    import mlx_lm.lora as lora
except (ImportError, OSError):
    print({_MLX_MISSING_MARK!r}, flush=True)
    sys.exit(3)
_train = lora.train

class Report:
    def __init__(self, inner):
        self.inner = inner

    def on_train_loss_report(self, info):
        step = {{"step": int(info["iteration"]), "loss": float(info["train_loss"]),
                "tokens_per_s": float(info["tokens_per_second"]), "peak_memory_gb": float(info["peak_memory"])}}
        print({_STEP_MARK!r} + json.dumps(step), flush=True)
        if self.inner is not None:
            self.inner.on_train_loss_report(info)

    def on_val_loss_report(self, info):
        if self.inner is not None:
            self.inner.on_val_loss_report(info)

def train(*args, training_callback=None, **kwargs):
    return _train(*args, training_callback=Report(training_callback), **kwargs)

lora.train = train
sys.argv[0] = "mlx_lm.lora"
lora.main()
"""

# What a failed child's output says, and what to do about it (first match wins).
_HINTS: tuple[tuple[str, str], ...] = (
    ("Insufficient Memory", "it ran out of memory: try a shorter sequence length or a batch of 1, or rent for it"),
    ("bad_alloc", "it ran out of memory: try a shorter sequence length or a batch of 1, or rent for it"),
    ("out of memory", "it ran out of memory: try a shorter sequence length or a batch of 1, or rent for it"),
    ("must have at least batch_size", "the slice has fewer rows than one batch: try a smaller batch or more rows"),
    ("Unsupported data format", 'the data are not chat rows ({"messages": [...]} per line) mlx-lm can read'),
    ("not supported", "mlx-lm cannot train this model's architecture: try the trial on the CPU, or rent for it"),
)


@dataclass(frozen=True)
class MlxTraining:
    """What an MLX trial trained and measured.

    Attributes:
        steps: Every step mlx-lm reported, in order.
        seconds: Wall time of the trainer's process, loading the model and the data included.
        peak_memory_gb: The most memory MLX used (None: mlx-lm reported none).
        adapter: The adapter in PEFT's format.
    """

    steps: tuple[TrialStep, ...]
    seconds: float
    peak_memory_gb: float | None
    adapter: Path


@dataclass(frozen=True)
class _LoraRun:
    """The settings of one mlx-lm LoRA run, as written to its configuration file."""

    model_dir: Path
    data_dir: Path
    adapter_dir: Path
    steps: int
    seq_len: int
    rank: int
    learning_rate: float
    batch_size: int
    scale: float

    def config(self) -> dict[str, Any]:
        """mlx-lm's configuration: LoRA on every linear layer of every block, a report every step, no checkpoint."""
        return {
            "model": str(self.model_dir),
            "train": True,
            "data": str(self.data_dir),
            "fine_tune_type": "lora",
            "num_layers": -1,
            "batch_size": self.batch_size,
            "iters": self.steps,
            "learning_rate": self.learning_rate,
            "max_seq_length": self.seq_len,
            "mask_prompt": True,  # the loss on the answer only, as the real run's assistant-only loss
            "lora_parameters": {"rank": self.rank, "scale": self.scale, "dropout": 0.0},
            "steps_per_report": 1,
            # Validation runs on the first and the last step only, on one batch: a trial has no time for more.
            "steps_per_eval": self.steps + 1,
            "val_batches": 1,
            "save_every": self.steps + 1,
            "adapter_path": str(self.adapter_dir),
            "seed": 0,
        }


@dataclass
class _Reports:
    """Reads the child's output: its step reports, its peak memory, and its last other lines."""

    on_step: Callable[[TrialStep], None] | None
    steps: list[TrialStep] = field(default_factory=list)
    peak_memory_gb: float | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    mlx_missing: bool = False

    def read(self, line: str) -> None:
        """Takes one output line."""
        if line.startswith(_STEP_MARK):
            self._step(json.loads(line.removeprefix(_STEP_MARK)))
        elif line.strip() == _MLX_MISSING_MARK:
            self.mlx_missing = True
        elif (text := _ANSI.sub("", line).rstrip()).strip():
            self.tail.append(text)

    def last_lines(self) -> str:
        """The last lines, one after another, without a traceback's frames (its last line says what failed)."""
        lines: list[str] = []
        frame = False
        for line in self.tail:
            if _FRAME.match(line) or line.startswith("Traceback (most recent call last)"):
                frame = True
            elif frame and line.startswith("    "):  # the source line under a frame
                continue
            else:
                frame = False
                lines.append(" ".join(_DRAWING.sub(" ", line).split()))
        return " | ".join([line for line in lines if line][-SHOWN_LINES:])[-1200:] or "no output"

    def _step(self, report: Mapping[str, Any]) -> None:
        speed = float(report["tokens_per_s"])
        step = TrialStep(int(report["step"]), float(report["loss"]), speed if speed > 0 else None)
        peak = float(report["peak_memory_gb"])
        if peak > 0:
            self.peak_memory_gb = max(peak, self.peak_memory_gb or 0.0)
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)


async def train_with_mlx(
    python: str,
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
    *,
    steps: int,
    seq_len: int,
    rank: int,
    learning_rate: float,
    batch_size: int,
    lora_alpha: float = 32.0,
    on_step: Callable[[TrialStep], None] | None = None,
) -> MlxTraining:
    """Trains a LoRA adapter with mlx-lm in a child process and converts it for PEFT.

    Args:
        python: The Python with mlx and mlx-lm (the local tools' environment).
        model_dir: The base model, a Hugging Face folder.
        data_dir: Holds ``train.jsonl`` and ``valid.jsonl``, chat rows (``{"messages": [...]}`` per line).
        out_dir: Gets mlx-lm's configuration and adapter, and the PEFT adapter (created).
        steps: Optimizer steps.
        seq_len: Longest sequence in tokens (longer rows are cut).
        rank: The LoRA rank.
        learning_rate: Adam's learning rate (constant).
        batch_size: Rows per step.
        lora_alpha: LoRA's alpha: the update is scaled by ``lora_alpha / rank``, as in the real run.
        on_step: Called with each step as mlx-lm reports it.

    Returns:
        The steps, the time, the peak memory and the PEFT adapter.

    Raises:
        TrialError: The model or the data are missing, MLX is not installed, or mlx-lm failed (the message has its
            last lines and what to do).
        asyncio.CancelledError: The trial was cancelled; the child is stopped first.
    """
    run = _LoraRun(
        model_dir=model_dir,
        data_dir=data_dir,
        adapter_dir=out_dir / MLX_ADAPTER_DIR,
        steps=steps,
        seq_len=seq_len,
        rank=rank,
        learning_rate=learning_rate,
        batch_size=batch_size,
        scale=lora_alpha / rank,
    )
    config = _write_config(run, out_dir)
    reports = _Reports(on_step)
    started = time.monotonic()
    code = await _run_child([python, "-c", _LORA, "--config", str(config)], reports)
    seconds = time.monotonic() - started
    _check_finished(code, reports, python)
    adapter = await asyncio.to_thread(mlx_adapter_to_peft, run.adapter_dir, out_dir / PEFT_ADAPTER_DIR, str(model_dir))
    return MlxTraining(tuple(reports.steps), seconds, reports.peak_memory_gb, adapter)


def _write_config(run: _LoraRun, out_dir: Path) -> Path:
    """Checks the model and the data are there and writes mlx-lm's configuration into ``out_dir``."""
    if not (run.model_dir / "config.json").is_file():
        raise TrialError(f"no model in {run.model_dir} (it has no config.json): download the base model first")
    if not (run.data_dir / "train.jsonl").is_file():
        raise TrialError(f"no training data in {run.data_dir} (it has no train.jsonl): prepare the dataset first")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = out_dir / CONFIG_FILE
    config.write_text(json.dumps(run.config(), indent=2), encoding="utf-8")
    return config


async def _run_child(command: Sequence[str], reports: _Reports) -> int:
    """Runs the trainer, handing each output line to ``reports`` as it comes; returns its exit code."""
    # Offline, since the model is a local folder. The reports need no unbuffered output: the script flushes each
    # one, and so does mlx-lm's console.
    env = without_secrets() | {"HF_HUB_OFFLINE": "1"}
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            limit=1 << 20,  # a progress bar redrawn with carriage returns is one long line
        )
    except OSError as exc:
        raise TrialError(f"the MLX trial could not start {command[0]} ({exc.strerror or exc})") from exc
    try:
        assert process.stdout is not None
        async for raw in process.stdout:
            reports.read(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        return await process.wait()
    except BaseException:
        await _stop(process)
        raise


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Terminates the child, and kills it if it is still there after :data:`STOP_GRACE_S`."""
    try:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    finally:
        if process.returncode is None:  # cancelled again while waiting: never leave it training
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def _check_finished(code: int, reports: _Reports, python: str) -> None:
    if reports.mlx_missing:
        raise TrialError(
            f"MLX is not installed for {python}: a trial with MLX needs Apple Silicon and the local tools (Models "
            "page, or rentune tools install)"
        )
    tail = reports.last_lines()
    if code != 0:
        hint = _hint(" ".join(reports.tail))
        raise TrialError(f"mlx-lm's LoRA training failed (exit {code}): {hint}; its last lines: {tail}")
    if not reports.steps:
        raise TrialError(
            "mlx-lm trained without reporting a step: the local tools' mlx-lm is not the version Rentune knows; "
            f"reinstall the local tools; its last lines: {tail}"
        )


def _hint(output: str) -> str:
    for needle, hint in _HINTS:
        if needle.lower() in output.lower():
            return hint
    return "check that the model is one mlx-lm can load and the data are chat rows"


def mlx_adapter_to_peft(mlx_dir: Path, peft_dir: Path, base_model: str) -> Path:
    """Writes mlx-lm's LoRA adapter in ``mlx_dir`` as a PEFT LoRA adapter in ``peft_dir`` (created).

    mlx-lm's ``LoRALinear`` computes ``y = linear(x) + scale * (x @ lora_a) @ lora_b`` with ``lora_a`` (in, r) and
    ``lora_b`` (r, out); PEFT computes ``y = linear(x) + lora_alpha / r * lora_B(lora_A(x))`` with weights (r, in)
    and (out, r). So ``lora_A = lora_a.T``, ``lora_B = lora_b.T`` and ``lora_alpha = scale * r``: the same function.

    Args:
        mlx_dir: Holds ``adapters.safetensors`` and ``adapter_config.json`` as mlx-lm saves them.
        peft_dir: Gets ``adapter_model.safetensors`` and ``adapter_config.json``.
        base_model: The base model's name or folder, recorded in the PEFT config.

    Returns:
        ``peft_dir``.

    Raises:
        TrialError: The folder is not an mlx-lm LoRA adapter of linear layers (DoRA, a full fine-tune, or an
            adapter of mixture-of-experts layers cannot be converted).
    """
    from safetensors.numpy import load_file, save_file

    config = _read_mlx_config(mlx_dir)
    try:
        weights = load_file(str(mlx_dir / "adapters.safetensors"))
    except (OSError, TypeError, ValueError) as exc:
        raise TrialError(f"mlx-lm's adapter in {mlx_dir} cannot be read ({exc})") from exc
    tensors, modules = _peft_tensors(weights, mlx_dir)
    rank = int(config["lora_parameters"]["rank"])
    if any(t.shape[0] != rank for name, t in tensors.items() if name.endswith("lora_A.weight")):
        raise TrialError(f"mlx-lm's adapter in {mlx_dir} does not have the rank {rank} its config says")
    peft_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(peft_dir / "adapter_model.safetensors"))
    peft_config = _peft_config(config, modules, base_model)
    (peft_dir / "adapter_config.json").write_text(json.dumps(peft_config, indent=2), encoding="utf-8")
    return peft_dir


def _read_mlx_config(mlx_dir: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((mlx_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrialError(f"mlx-lm's adapter config in {mlx_dir} cannot be read ({exc})") from exc
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora" or not isinstance(config.get("lora_parameters"), dict):
        raise TrialError(f"the adapter in {mlx_dir} is mlx-lm's {kind!r}, not LoRA: only LoRA converts to PEFT")
    return config


def _peft_tensors(
    weights: Mapping[str, npt.NDArray[Any]], mlx_dir: Path
) -> tuple[dict[str, npt.NDArray[Any]], list[str]]:
    """PEFT's tensors for mlx-lm's ``<module>.lora_a`` / ``.lora_b`` pairs, and the adapted modules' names."""
    import numpy as np

    tensors: dict[str, npt.NDArray[Any]] = {}
    modules: list[str] = []
    for name, value in sorted(weights.items()):
        module, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b") or value.ndim != 2:
            raise TrialError(f"mlx-lm's adapter in {mlx_dir} has {name} {value.shape}, which PEFT has no place for")
        peft_leaf = "lora_A" if leaf == "lora_a" else "lora_B"
        tensors[f"base_model.model.{module}.{peft_leaf}.weight"] = np.ascontiguousarray(value.T)
        if leaf == "lora_a":
            modules.append(module)
    if not modules or len(tensors) != 2 * len(modules):
        raise TrialError(f"mlx-lm's adapter in {mlx_dir} has no complete lora_a/lora_b pairs")
    return tensors, modules


def _peft_config(config: Mapping[str, Any], modules: Sequence[str], base_model: str) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for an adapter of ``modules`` trained with mlx-lm's ``config``."""
    lora = config["lora_parameters"]
    rank = int(lora["rank"])
    alpha = float(lora["scale"]) * rank
    layers = sorted({int(m.group(1)) for module in modules if (m := _LAYER.search(f".{module}."))})
    peft: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
        "lora_dropout": float(lora.get("dropout", 0.0)),
        "target_modules": sorted({module.rpartition(".")[2] for module in modules}),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
    }
    if int(config.get("num_layers", -1)) >= 0 and layers:  # mlx-lm adapted only the last num_layers blocks
        peft["layers_to_transform"] = layers
    return peft
