"""``python -m trainer_payload run job.json``: TRL SFT with PEFT (LoRA, QLoRA) or a full fine-tune.

Events go to ``events.jsonl``; checkpoints are sealed with checksums as they are written; a restart on the same
output directory resumes from the newest complete checkpoint; SIGTERM saves a checkpoint and stops cleanly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainer_payload.checkpoints import checkpoint_files, newest_complete, seal_checkpoint
from trainer_payload.dataset import load_messages
from trainer_payload.engines import choose_engine, load_unsloth
from trainer_payload.failures import classify, config_error, hint
from trainer_payload.fit import (
    Calibration,
    forget_failure,
    is_out_of_memory,
    memory_limit_for_tests,
    peak_memory,
    release_memory,
    smaller_setup,
)
from trainer_payload.hardware import cuda_available, gpu_readings, peak_memory_gb, use_bf16
from trainer_payload.labels import label_rows
from trainer_payload.loading import empty_model, join_process_group, load_options, sharded_with_fsdp, starts_empty
from trainer_payload.pause import PauseWatch, hold, say
from trainer_payload.preferences import load_pairs
from trainer_payload.protocol import (
    ADAPTER_DIR_NAME,
    EVENTS_FILE_NAME,
    PAUSE_FILE_NAME,
    PREFERENCE_OBJECTIVES,
    STOP_MARKER_NAME,
    TRAINER_EXIT_FILE_NAME,
    ErrorKind,
    EventKind,
    EventWriter,
    HoldOutcome,
    JobSpec,
    JobSpecError,
    JobState,
    StopCause,
    precomputes_reference,
    sharded_checkpoints,
)
from trainer_payload.texts import load_texts
from trainer_payload.trackers import (
    copy_tracker_logs,
    finish_wandb,
    point_trackers_at,
    restore_tracker_logs,
    start_wandb,
    take_wandb_key,
    tracking_arguments,
)

EXIT_DONE, EXIT_FAILED, EXIT_TERMINATED = 0, 1, 143
CHECKPOINT_DIR_NAME = "checkpoints"
#: How long the ranks of a distributed run may take to finish their step and save after SIGTERM before torch's
#: launcher kills them (a provider's own preemption deadline still applies).
STOP_GRACE_SECONDS = 600


class Stop:
    """Shared flags between the signal handler, the trainer callback and the watchdog."""

    def __init__(self) -> None:
        self.terminated = False
        self.last_activity = time.monotonic()
        #: Why the job stops when it is not SIGTERM (the ranks held for an answer that never came).
        self.why: str | None = None

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        """Asks the training loop to save and stop at the end of the current step."""
        self.terminated = True


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _is_node_main_process() -> bool:
    """The first rank on this machine: across several machines each one seals the checkpoints it wrote."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def _touch_stop_marker(output_dir: Path) -> None:
    (output_dir / STOP_MARKER_NAME).write_text(f"{time.time():.0f}\n", encoding="utf-8")


def _watchdog(spec: JobSpec, stop: Stop, finished: threading.Event) -> None:
    """Touches the stop marker when no training step happened for ``idle_stop_minutes``."""
    limit = spec.idle_stop_minutes * 60
    while not finished.wait(timeout=min(30.0, max(1.0, limit / 10))):
        if time.monotonic() - stop.last_activity > limit:
            _touch_stop_marker(Path(spec.output_dir))
            return


def _agreed(flags: tuple[bool, ...], device: Any) -> tuple[bool, ...]:
    """Each flag as every rank of a distributed run will act on it: set when any rank's is set.

    SIGTERM reaches the ranks a moment apart, and each rank's clock says when a timed save is due: a rank stopping
    or saving a step before the others leaves them waiting forever in their next collective (a gradient exchange, a
    sharded save). The ranks agree (the largest of their flags) after every step: one tiny all-reduce.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    tensor = torch.tensor([1 if flag else 0 for flag in flags], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tuple(bool(value) for value in tensor.tolist())


def _all_ranks_saved() -> None:
    """Waits until every rank has written its files of a checkpoint (its RNG state comes after the shared save)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


#: What the loss is computed on, by objective (the ``training`` state says it).
LOSS_ON = {
    "sft": "every assistant turn",
    "dpo": "the chosen against the rejected answer, beside the reference model",
    "orpo": "the chosen answer, and its odds against the rejected one",
    "cpt": "every token of the text, packed into sequences",
}
#: TRL's logged preference metrics and the step event's names for them.
REWARD_FIELDS = {
    "rewards/chosen": "reward_chosen",
    "rewards/rejected": "reward_rejected",
    "rewards/margins": "reward_margin",
    "rewards/accuracies": "reward_accuracy",
}


def _rewards(logs: dict[str, Any], prefix: str, wanted: tuple[str, ...]) -> dict[str, float]:
    """The preference metrics among TRL's ``logs`` (``prefix`` ``eval_`` for the held-out pairs), as event fields."""
    found = {name: logs.get(prefix + key) for key, name in REWARD_FIELDS.items() if name in wanted}
    return {name: float(value) for name, value in found.items() if isinstance(value, int | float)}


def _events_callback(spec: JobSpec, events: EventWriter, stop: Stop, calibration: Calibration) -> Any:
    from transformers import TrainerCallback

    output_dir = Path(spec.output_dir)
    pause = PauseWatch(output_dir / PAUSE_FILE_NAME if _is_main_process() else None)

    class EventsCallback(TrainerCallback):  # type: ignore[misc]
        """Reports steps, evals and sealed checkpoints; saves on a timer and on SIGTERM; holds when asked."""

        def __init__(self) -> None:
            self.last_save = time.monotonic()
            self.last_log: tuple[float, float] | None = None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            logs = logs or {}
            if "eval_loss" in logs:
                rewards = _rewards(logs, "eval_", ("reward_margin", "reward_accuracy"))
                events.emit(EventKind.EVAL, step=state.global_step, eval_loss=logs["eval_loss"], **rewards)
            if "loss" not in logs:
                return
            now, tokens = time.monotonic(), float(logs.get("num_tokens", 0.0))
            rate = None
            # ORPO's trainer counts no tokens: no rate then, rather than a rate of 0 tokens/s.
            if self.last_log and now > self.last_log[0] and "num_tokens" in logs:
                rate = round((tokens - self.last_log[1]) / (now - self.last_log[0]), 1)
            self.last_log = (now, tokens)
            events.emit(
                EventKind.STEP,
                step=state.global_step,
                total_steps=state.max_steps,
                epoch=round(state.epoch or 0.0, 4),
                loss=logs["loss"],
                lr=logs.get("learning_rate"),
                tokens_per_s=rate,
                tokens=tokens,
                **_rewards(logs, "", tuple(REWARD_FIELDS.values())),
                **gpu_readings(),
            )
            measured = calibration.on_log(state.global_step, tokens)
            if measured is not None:
                events.emit(
                    EventKind.CALIBRATION,
                    step=state.global_step,
                    micro_batch=spec.micro_batch,
                    grad_accum=spec.grad_accum,
                    seq_len=spec.seq_len,
                    gradient_checkpointing=spec.gradient_checkpointing,
                    **measured,
                )

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            stop.last_activity = time.monotonic()
            minutes = spec.checkpoint_minutes
            due = bool(minutes) and time.monotonic() - self.last_save >= minutes * 60
            stop_now, save_now, hold_now = _agreed((stop.terminated, due, pause.asked()), args.device)
            if hold_now and not stop_now:
                stop_now = self._held_then_stopping(args.device, state.global_step)
            if save_now or stop_now:
                control.should_save = True
            if stop_now:
                control.should_training_stop = True

        def _held_then_stopping(self, device: Any, step: int) -> bool:
            """Holds every rank at the end of ``step`` while the user decides; True when they all save and stop."""
            rank = os.environ.get("RANK", "0")
            events.emit(EventKind.HOLD, step=step, held=True)
            say(rank, f"holding at step {step} while the user decides")
            ended = hold(pause, lambda flags: _agreed(flags, device), stop)
            say(rank, f"hold ended at step {step} after {ended.seconds:.1f} s: {ended.outcome.value}")
            seconds = round(ended.seconds, 1)
            events.emit(EventKind.HOLD, step=step, held=False, outcome=ended.outcome.value, seconds=seconds)
            self.last_log = None  # the hold is no training: the next rate is measured afresh
            if ended.outcome is HoldOutcome.CONTINUE:
                return False
            stop.terminated = True
            if ended.outcome is HoldOutcome.NO_ANSWER:
                stop.why = f"stopped: nobody answered in {seconds:.0f} s held for the user's decision"
                if _is_main_process():  # the desktop may be gone: the machine's self-stop may end it
                    _touch_stop_marker(output_dir)
            return True

        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.last_save = time.monotonic()
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            _all_ranks_saved()  # a seal lists every rank's files whole, not one still being written
            if not folder.is_dir() or not _is_node_main_process():
                return  # each machine's first rank seals; the others only write their shards
            copy_tracker_logs(output_dir, folder)
            marker = seal_checkpoint(folder, state.global_step)
            if not _is_main_process():
                return  # rank 0 alone reports
            size = sum(info["bytes"] for info in marker["files"].values())
            events.emit(
                EventKind.CHECKPOINT,
                step=state.global_step,
                path=str(folder.relative_to(output_dir)),
                bytes=size,
                sha256={name: info["sha256"] for name, info in marker["files"].items()},
            )

    return EventsCallback()


def _load_model(spec: JobSpec, bf16: bool) -> Any:
    """The base model: read from its folder, or built empty on a rank FSDP fills from rank 0 (:mod:`.loading`)."""
    import torch

    dtype = torch.bfloat16 if bf16 else torch.float32
    if starts_empty(spec):
        return empty_model(spec.base_model, dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(spec.base_model, **load_options(spec, dtype))


def _peft_config(spec: JobSpec) -> Any:
    if spec.method not in {"qlora", "lora"}:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=spec.target_modules,
        task_type="CAUSAL_LM",
    )


#: With rows held out and no interval set, the held-out loss is measured after each tenth of the run (transformers
#: reads an ``eval_steps`` below 1 as that share of all steps).
DEFAULT_EVAL_RATIO = 0.1


def _common_args(spec: JobSpec, bf16: bool, has_eval: bool) -> dict[str, Any]:
    """The training arguments every objective shares (transformers' ``TrainingArguments``)."""
    return {
        "output_dir": str(Path(spec.output_dir) / CHECKPOINT_DIR_NAME),
        "per_device_train_batch_size": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "num_train_epochs": spec.epochs,
        "max_steps": spec.max_steps if spec.max_steps > 0 else -1,
        "learning_rate": spec.learning_rate,
        "lr_scheduler_type": spec.lr_scheduler,
        "warmup_steps": spec.warmup_ratio,  # below 1: a fraction of the steps (transformers 5)
        "seed": spec.seed,
        "data_seed": spec.seed,
        "logging_steps": 1,
        "logging_first_step": True,
        "save_strategy": "steps" if spec.checkpoint_steps else "no",
        "save_steps": spec.checkpoint_steps or 500,
        "save_total_limit": spec.keep_checkpoints,
        "bf16": bf16,
        "use_cpu": not cuda_available(),
        **tracking_arguments(spec),
        "gradient_checkpointing": spec.gradient_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "eval_strategy": "steps" if has_eval else "no",
        "eval_steps": spec.eval_steps or DEFAULT_EVAL_RATIO,
        # 8-bit AdamW for full-8bit; otherwise the fused AdamW transformers defaults to (faster than adamw_torch).
        "optim": "adamw_bnb_8bit" if spec.method == "full-8bit" else "adamw_torch_fused",
        # FSDP reduce-scatters every micro-batch: accumulating under no_sync would hold whole, unsharded gradients
        # on every GPU (138 GB of a 70 B model's 230 GB per GPU at accumulation 4); the sizing counts them sharded.
        "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": spec.strategy == "fsdp"}},
        # Every machine keeps whole checkpoints, so any of them can resume (each rank reads its own disk).
        "save_on_each_node": spec.num_nodes > 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "log_level": "warning",
    }


def _sft_config(spec: JobSpec, bf16: bool, has_eval: bool) -> Any:
    from trl import SFTConfig

    return SFTConfig(
        **_common_args(spec, bf16, has_eval),
        max_length=spec.seq_len,
        # The datasets come tokenised with their labels (trainer_payload.labels): TRL trains on them as they are.
        assistant_only_loss=False,
        completion_only_loss=False,
    )


def _preference_config(spec: JobSpec, bf16: bool, has_eval: bool) -> Any:
    """DPO's or ORPO's arguments: ``beta``, DPO's loss, and pairs cut to ``seq_len`` tokens (prompt and answer).

    A full fine-tune's DPO computes the reference log-probabilities before training when it trains every epoch
    (:func:`~trainer_payload.protocol.precomputes_reference`): TRL then keeps no frozen copy of the model. On a
    resume the model is the base until the checkpoint is loaded in ``train``, so the reference stays the base.
    """
    if spec.objective == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**_common_args(spec, bf16, has_eval), beta=spec.beta, max_length=spec.seq_len)
    from trl import DPOConfig

    return DPOConfig(
        **_common_args(spec, bf16, has_eval),
        beta=spec.beta,
        loss_type=[spec.loss_type],
        max_length=spec.seq_len,
        precompute_ref_log_probs=precomputes_reference(spec.objective, spec.method, spec.max_steps),
    )


def _cpt_config(spec: JobSpec, bf16: bool, has_eval: bool) -> Any:
    """Continued pre-training: the documents concatenated and cut into sequences of ``seq_len`` tokens.

    The loss is on every token; held-out text is measured once before the first step too (the base's perplexity).
    """
    from trl import SFTConfig

    return SFTConfig(
        **_common_args(spec, bf16, has_eval),
        max_length=spec.seq_len,
        packing=True,
        packing_strategy="wrapped",
        dataset_text_field="text",
        eval_on_start=has_eval,
    )


def training_config(spec: JobSpec, bf16: bool, has_eval: bool) -> Any:
    """The trainer's arguments for the job's objective."""
    if spec.objective in PREFERENCE_OBJECTIVES:
        return _preference_config(spec, bf16, has_eval)
    if spec.objective == "cpt":
        return _cpt_config(spec, bf16, has_eval)
    return _sft_config(spec, bf16, has_eval)


def trainer_class(objective: str) -> Any:
    """TRL's trainer for ``objective``: SFT, DPO or ORPO.

    DPO's reference model is the base with the adapter switched off (no second copy), or for a full fine-tune a copy
    of the base TRL loads; ORPO has none.
    """
    if objective == "dpo":
        from trl import DPOTrainer

        return DPOTrainer
    if objective == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        return ORPOTrainer
    from trl import SFTTrainer

    return SFTTrainer


def _labelled(path: str, tokenizer: Any, seq_len: int) -> tuple[Any, int]:
    from datasets import Dataset

    file = Path(path)
    examples, dropped = label_rows(tokenizer, load_messages(file), seq_len, file.name)
    return Dataset.from_list(examples), dropped


def _pairs(path: str) -> Any:
    from datasets import Dataset

    return Dataset.from_list(load_pairs(Path(path)))


def _texts(path: str) -> Any:
    from datasets import Dataset

    return Dataset.from_list(load_texts(Path(path)))


def _datasets(spec: JobSpec, tokenizer: Any) -> tuple[Any, Any, int]:
    """Train and eval datasets labelled on every assistant turn, and how many training rows had nothing to train on.

    Preference pairs go to TRL as read (:mod:`.preferences`): its trainers tokenise prompt and answers themselves.
    """
    if spec.objective in PREFERENCE_OBJECTIVES:
        return _pairs(spec.train_file), _pairs(spec.eval_file) if spec.eval_file else None, 0
    if spec.objective == "cpt":
        return _texts(spec.train_file), _texts(spec.eval_file) if spec.eval_file else None, 0
    train, dropped = _labelled(spec.train_file, tokenizer, spec.seq_len)
    evaluation = _labelled(spec.eval_file, tokenizer, spec.seq_len)[0] if spec.eval_file else None
    return train, evaluation, dropped


#: Methods that use bitsandbytes: QLoRA's 4-bit weights and the full fine-tune's 8-bit optimizer.
BITSANDBYTES_METHODS = frozenset({"qlora", "full-8bit"})


def leave_out_unused_quantisation(spec: JobSpec) -> bool:
    """Keeps bitsandbytes from being imported by a job that does not quantise; returns whether it was left out.

    PEFT imports bitsandbytes whenever it is installed, and bitsandbytes imports torch's compiler: about 1.5 s of
    every trainer start (each relaunch, each rank) paid on the rented machine for a library the job never calls.
    ``None`` in ``sys.modules`` is Python's way of saying a module is absent: ``importlib.util.find_spec`` answers
    None, so PEFT and transformers skip their bitsandbytes layers.
    """
    if spec.method in BITSANDBYTES_METHODS or "bitsandbytes" in sys.modules:
        return False
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]
    return True


class PayloadRun:
    """One execution of a job, from loading to the final adapter."""

    def __init__(self, spec: JobSpec, events: EventWriter, stop: Stop, wandb_key: str = "") -> None:
        self.spec, self.events, self.stop = spec, events, stop
        self.wandb_key = wandb_key
        self.output_dir = Path(spec.output_dir)
        self.started = time.monotonic()
        self.calibration = Calibration(spec.calibration_steps, spec.calibration_minutes)

    def state(self, state: JobState, **detail: Any) -> None:
        """Reports a phase."""
        self.events.emit(EventKind.STATE, state=state.value, **detail)

    def _start_wandb(self) -> str | None:
        """Opens the W&B run on rank 0 (a run reporting to W&B); why it could not, after which the run goes without."""
        if "wandb" not in self.spec.report_to or not _is_main_process():
            return None
        problem = start_wandb(self.spec, self.wandb_key, self.output_dir)
        if problem is not None:
            self.spec = dataclasses.replace(self.spec, report_to=[t for t in self.spec.report_to if t != "wandb"])
        return problem

    def execute(self) -> int:
        """Runs the job; returns the process exit code."""
        engine, engine_note = choose_engine(self.spec)  # before transformers: Unsloth patches it on import
        if engine == "trl":
            leave_out_unused_quantisation(self.spec)
        trainer_type = trainer_class(self.spec.objective)

        self.state(
            JobState.PREPARING, detail=f"loading {self.spec.base_model} for {self.spec.method}", engine=engine_note
        )
        bf16 = use_bf16()
        model, tokenizer, (train, evaluation, dropped) = self._prepare(engine, bf16)
        if self.stop.terminated:
            return self._terminated(step=None)
        resume = newest_complete(self.output_dir / CHECKPOINT_DIR_NAME)
        if resume is not None:
            restore_tracker_logs(resume, self.output_dir)
        tracking = self._start_wandb()
        self.state(
            JobState.TRAINING,
            resume_from=resume.name if resume else None,
            **({"tracking": tracking} if tracking else {}),
            loss_on=LOSS_ON.get(self.spec.objective, LOSS_ON["sft"]),
            examples=len(train),
            dropped_examples=dropped,
            bf16=bf16,
        )
        train_started = time.monotonic()
        for attempt in itertools.count(1):
            trainer = self._trainer(trainer_type, engine, model, tokenizer, (train, evaluation), bf16)
            try:
                resume = newest_complete(self.output_dir / CHECKPOINT_DIR_NAME)
                result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
                break
            except Exception as exc:
                if not is_out_of_memory(exc) or self.calibration.done:
                    raise  # an out-of-memory after the first steps is a failure, said as one
                self._fit_smaller(exc, attempt)
                forget_failure(exc)
            # Past the except block the error is gone: nothing of the failed attempt may stay while the next one loads.
            trainer = model = None
            release_memory()
            model = self._load_again(engine, bf16)
        if self.stop.terminated:
            return self._terminated(step=trainer.state.global_step)
        return self._finish(trainer, result.metrics, time.monotonic() - train_started)

    def _trainer(  # noqa: PLR0917 - the trainer's parts
        self, trainer_class: Any, engine: str, model: Any, tokenizer: Any, data: tuple[Any, Any], bf16: bool
    ) -> Any:
        """The objective's trainer for the job as it is now (its micro-batch may have been made smaller to fit)."""
        train, evaluation = data
        config = training_config(self.spec, bf16, evaluation is not None)
        point_trackers_at(self.output_dir)
        if engine == "unsloth":
            config.gradient_checkpointing = False  # Unsloth wraps the model with its own offloaded checkpointing
        callbacks = [_events_callback(self.spec, self.events, self.stop, self.calibration)]
        limit = memory_limit_for_tests(self.spec, getattr(model, "config", None))
        return trainer_class(
            model=model,
            args=config,
            train_dataset=train,
            eval_dataset=evaluation,
            processing_class=tokenizer,
            peft_config=None if engine == "unsloth" else _peft_config(self.spec),
            callbacks=[*callbacks, *([limit] if limit is not None else [])],
        )

    def _fit_smaller(self, exc: Exception, attempt: int) -> None:
        """Makes the job take less memory per step after ``exc`` (an out-of-memory in the first steps).

        Raises:
            RuntimeError: Nothing smaller is left (micro-batch 1, checkpointing on): the measured peak is said.
        """
        peak = peak_memory()["peak_allocated_gb"]
        smaller = smaller_setup(self.spec)
        if smaller is None:
            measured = f"; the peak measured was {peak:.1f} GB" if peak else ""
            raise RuntimeError(
                f"out of memory at micro-batch 1 with activation checkpointing on{measured}: this job does not fit "
                f"this GPU at sequence length {self.spec.seq_len} ({exc})"
            ) from exc
        self.spec = smaller
        self.events.emit(
            EventKind.FIT,
            micro_batch=smaller.micro_batch,
            grad_accum=smaller.grad_accum,
            gradient_checkpointing=smaller.gradient_checkpointing,
            reason=f"out of memory in the first steps ({str(exc)[:300]})",
            peak_allocated_gb=peak,
            attempt=attempt + 1,
        )

    def _load_again(self, engine: str, bf16: bool) -> Any:
        """A fresh copy of the model for the next attempt (the failed one holds the adapter's layers)."""
        if engine == "unsloth":
            model, _tokenizer = load_unsloth(self.spec)
            return model
        return _load_model(self.spec, bf16)

    def _prepare(self, engine: str, bf16: bool) -> tuple[Any, Any, tuple[Any, Any, int]]:
        """Model, tokenizer and datasets; with TRL the data is read first, so bad rows fail before a long load."""
        if engine == "unsloth":
            model, tokenizer = load_unsloth(self.spec)
            return model, tokenizer, _datasets(self.spec, tokenizer)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.spec.base_model)
        data = _datasets(self.spec, tokenizer)
        join_process_group(training_config(self.spec, bf16, has_eval=data[1] is not None))  # ranks told apart first
        return _load_model(self.spec, bf16), tokenizer, data

    def _terminated(self, step: int | None) -> int:
        where = f"checkpoint saved at step {step}" if step else "before training started"
        self.state(
            JobState.FAILED,
            reason=f"{self.stop.why or 'stopped by SIGTERM'} ({where}); start the job again to resume",
            stopped_by=StopCause.SIGNAL.value,
            checkpoint_step=step or None,
        )
        return EXIT_TERMINATED

    def _finish(self, trainer: Any, metrics: dict[str, Any], train_seconds: float) -> int:
        self.state(JobState.SAVING)
        target = self.output_dir / (ADAPTER_DIR_NAME if self.spec.method in {"qlora", "lora"} else "model")
        gather_whole_weights(trainer, self.spec)
        trainer.save_model(str(target))
        if not _is_main_process():
            return EXIT_DONE
        copy_tracker_logs(self.output_dir, target)
        marker = seal_checkpoint(target, trainer.state.global_step)
        last_loss = next((h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h), None)
        self.events.emit(
            EventKind.DONE,
            adapter_path=str(target.relative_to(self.output_dir)),
            files={name: info["sha256"] for name, info in marker["files"].items()},
            bytes=sum(p.stat().st_size for p in checkpoint_files(target)),
            metrics={
                **metrics,
                **held_out_perplexity(trainer.state.log_history),
                "final_loss": last_loss,
                "steps": trainer.state.global_step,
                "peak_gpu_gb": peak_memory_gb(),
            },
            wall_seconds=round(time.monotonic() - self.started, 2),
            train_seconds=round(train_seconds, 2),
        )
        self.state(JobState.DONE)
        return EXIT_DONE


def held_out_perplexity(history: list[dict[str, Any]]) -> dict[str, float]:
    """The held-out text's perplexity before training (an eval at step 0) and after, when both were measured."""
    losses = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h and "step" in h]
    if len(losses) < 2 or losses[0][0] != 0:
        return {}
    return {"base_perplexity": round(math.exp(losses[0][1]), 3), "perplexity": round(math.exp(losses[-1][1]), 3)}


def gather_whole_weights(trainer: Any, spec: JobSpec) -> None:
    """Makes the final save under FSDP write whole weights, gathered on rank 0 (accelerate's documented use).

    A full fine-tune's checkpoints stay sharded (fast, and each rank resumes from its own shard), but with a sharded
    state dict ``Trainer.save_model`` writes nothing at all: the model that comes home must be whole.
    """
    if sharded_with_fsdp(spec):
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")


def _launch_distributed(spec: JobSpec, job_path: Path) -> int:
    """Re-runs this job under ``accelerate launch``: ``num_gpus`` processes on each of ``num_nodes`` machines."""
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launch_options(spec),
        "-m",
        "trainer_payload",
        "run",
        str(job_path),
    ]
    # Own process group, so a SIGTERM for this process (spot preemption, user stop) reaches every rank: each
    # one saves its part of the checkpoint and exits instead of dying mid-write. torch's launcher would SIGKILL the
    # ranks 30 s after forwarding the signal, before a slow step and save end (seen on a loaded machine): it waits
    # as long as a stop may take instead (torch versions that read this variable; older ones keep their 30 s).
    env = os.environ | {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(STOP_GRACE_SECONDS)}
    launcher = subprocess.Popen(command, start_new_session=True, env=env)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    return launcher.wait()


def _leave_process_group() -> None:
    """Closes the rank's process group before the interpreter exits.

    Left open, gloo's threads are torn down with the process and a rank can abort on its way out ("terminate called
    without an active exception", seen on a loaded machine) after all its work is done: the launcher then reports a
    failed run, and a node of a run across machines would read as lost.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):  # a peer already gone: nothing left to close cleanly
            dist.destroy_process_group()


def launch_options(spec: JobSpec) -> list[str]:
    """``accelerate launch`` options for the job: processes, machines and DDP or FSDP.

    Under FSDP rank 0 alone reads the weights and FSDP copies them to the other ranks, which start empty
    (``cpu_ram_efficient_loading`` needs ``sync_module_states``; :mod:`trainer_payload.loading`): one copy of the
    model in host memory, not one per rank. An adapter's
    checkpoints are whole (:func:`checkpoint_state_dict`); a full fine-tune's are sharded on one machine.
    """
    options = ["--num_processes", str(spec.num_gpus * spec.num_nodes), "--num_machines", str(spec.num_nodes)]
    if spec.num_nodes > 1:
        options += ["--machine_rank", str(spec.node_rank), "--main_process_ip", spec.head_address]
        options += ["--main_process_port", str(spec.head_port)]
    else:  # a free port of this machine's: two runs on one server (or two tests) never meet on 29500
        options += ["--main_process_port", "0"]
    options += ["--mixed_precision", "bf16" if use_bf16() else "no"]
    if spec.strategy != "fsdp":
        return [*options, "--multi_gpu"]
    return [
        *options,
        "--use_fsdp",
        "--fsdp_sharding_strategy",
        "FULL_SHARD",
        "--fsdp_auto_wrap_policy",
        "TRANSFORMER_BASED_WRAP",
        "--fsdp_state_dict_type",
        checkpoint_state_dict(spec),
        "--fsdp_cpu_ram_efficient_loading",
        "true",
        "--fsdp_sync_module_states",
        "true",
    ]


def checkpoint_state_dict(spec: JobSpec) -> str:
    """How FSDP writes checkpoints: sharded, or whole on rank 0 (as `protocol.sharded_checkpoints` says)."""
    return "SHARDED_STATE_DICT" if sharded_checkpoints(spec.method, spec.strategy) else "FULL_STATE_DICT"


def run_job(job_path: Path) -> int:
    """Runs a job file to completion, reporting through ``events.jsonl``; returns the exit code."""
    stop = Stop()
    signal.signal(signal.SIGTERM, stop.on_sigterm)
    try:
        spec = JobSpec.load(job_path)
    except JobSpecError as exc:
        return config_error(job_path, str(exc))
    output_dir = Path(spec.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if "LOCAL_RANK" in os.environ:  # a rank started by accelerate launch
        writer: EventWriter = EventWriter(output_dir / EVENTS_FILE_NAME) if _is_main_process() else _SilentEvents()
        try:
            return _run_reporting(spec, writer, stop)
        finally:
            _leave_process_group()
    (output_dir / TRAINER_EXIT_FILE_NAME).unlink(missing_ok=True)
    (output_dir / PAUSE_FILE_NAME).unlink(missing_ok=True)  # a hold asked of an earlier trainer is no longer asked
    if spec.num_gpus * spec.num_nodes > 1:
        if spec.strategy == "fsdp" and not cuda_available():
            code = config_error(job_path, "strategy 'fsdp' needs NVIDIA GPUs and this machine has none")
        else:
            code = _launch_distributed(spec, job_path)
    else:
        code = _run_reporting(spec, EventWriter(output_dir / EVENTS_FILE_NAME), stop)
    (output_dir / TRAINER_EXIT_FILE_NAME).write_text(f"{code}\n", encoding="utf-8")
    return code


def _run_reporting(spec: JobSpec, events: EventWriter, stop: Stop) -> int:
    finished = threading.Event()
    if spec.idle_stop_minutes > 0:
        threading.Thread(target=_watchdog, args=(spec, stop, finished), daemon=True).start()
    try:
        code = PayloadRun(spec, events, stop, wandb_key=take_wandb_key()).execute()
    except Exception as exc:  # noqa: BLE001 - every failure must become an error event, never a silent crash
        kind = classify(exc)
        detail = {"peak_gpu_gb": peak_memory_gb()} if kind is ErrorKind.OOM else {}
        events.emit(
            EventKind.ERROR, kind=kind.value, message=f"{type(exc).__name__}: {exc}"[:2000], hint=hint(kind), **detail
        )
        events.emit(EventKind.STATE, state=JobState.FAILED.value, reason=kind.value)
        code = EXIT_FAILED
    finally:
        finished.set()
    finish_wandb(code)
    if _is_main_process() and code != EXIT_TERMINATED:
        _touch_stop_marker(Path(spec.output_dir))
    return code


class _SilentEvents(EventWriter):
    """Event sink of non-main ranks: only rank 0 reports; their errors still reach the log (stderr)."""

    def __init__(self) -> None:
        """Writes to no events file."""

    def emit(self, kind: EventKind, /, **fields_: Any) -> dict[str, Any]:
        """Drops the event, printing errors to stderr (``payload.log``) with the rank."""
        if kind is EventKind.ERROR:
            print(f"rank {os.environ.get('RANK')}: {fields_}", file=sys.stderr, flush=True)
        return {}
