"""Plans: for a model and a setup, every GPU configuration with its fit, hours and dollars, ranked.

Cost per option = price per GPU-hour x GPUs x (setup + training + teardown). Setup is the trainer install plus the
model download at a stated bandwidth; teardown is the final save and adapter pull before the machine stops.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum

from desktop.core.sizing.architecture import Architecture
from desktop.core.sizing.calibration import MemoryCorrection
from desktop.core.sizing.gpus import GpuSpec
from desktop.core.sizing.memory import MemoryEstimate, estimate_memory, trainable_params
from desktop.core.sizing.setup import Method, Strategy, TrainingSetup
from desktop.core.sizing.throughput import tokens_per_s

GPU_COUNTS = (1, 2, 4, 8)
#: Machines a multi-node option may have, each with the most GPUs one machine has (``GPU_COUNTS[-1]``).
NODE_COUNTS = (2, 4, 8)
WORKING_DAY_HOURS = 8.0


class Fit(StrEnum):
    """Whether a configuration fits in GPU memory."""

    FITS = "fits"
    TIGHT = "tight"
    NO = "does not fit"


@dataclass(frozen=True)
class Workload:
    """How much training, and the fixed costs around it.

    Attributes:
        tokens: Training tokens per epoch.
        epochs: Passes over the data.
        download_mb_per_s: Model download speed on the rented machine.
        install_minutes: Installing the trainer on a stock PyTorch image.
        teardown_minutes: Final save, adapter pull and stop.
        checkpoint_minutes: Checkpoint interval (bounds the work a lost spot machine costs).
        spot_interruptions_per_hour: Expected interruptions per hour on spot/interruptible offers.
    """

    tokens: int = 15_000_000
    epochs: float = 3.0
    download_mb_per_s: float = 250.0
    install_minutes: float = 4.0
    teardown_minutes: float = 5.0
    checkpoint_minutes: float = 30.0
    spot_interruptions_per_hour: float = 0.05

    @property
    def training_tokens(self) -> float:
        """Tokens processed over all epochs."""
        return self.tokens * self.epochs


@dataclass(frozen=True)
class GpuOption:
    """One GPU configuration for a plan.

    Attributes:
        gpu: The GPU type.
        count: GPUs.
        strategy: DDP or FSDP.
        memory: The per-GPU memory estimate.
        fit: Fits, tight, or does not fit.
        headroom_gb: Usable memory left at the peak (negative when it does not fit).
        tokens_per_s: Training throughput of the whole configuration.
        setup_hours: Install and model download.
        training_hours: Training proper.
        hours: Billed hours (setup + training + teardown).
        cost_usd: Billed cost at the GPU's list price.
        spot_rework_hours: Expected training hours redone after spot interruptions.
        memory_measured_by: The runs whose measured peak corrected ``memory`` (empty: the memory model alone).
        nodes: Machines, each with ``count`` GPUs (FSDP across them when more than one).
    """

    gpu: GpuSpec
    count: int
    strategy: Strategy
    memory: MemoryEstimate
    fit: Fit
    headroom_gb: float
    tokens_per_s: float
    setup_hours: float
    training_hours: float
    hours: float
    cost_usd: float
    spot_rework_hours: float
    memory_measured_by: tuple[str, ...] = ()
    nodes: int = 1

    @property
    def total_gpus(self) -> int:
        """GPUs over all machines."""
        return self.count * self.nodes

    @property
    def fits(self) -> bool:
        """Whether the peak fits in usable memory (tight counts)."""
        return self.fit is not Fit.NO

    @property
    def usd_per_training_hour(self) -> float:
        """What one effective training hour costs, setup and teardown included."""
        return self.cost_usd / self.training_hours if self.training_hours else 0.0


def classify_fit(total_gb: float, gpu: GpuSpec) -> tuple[Fit, float]:
    """Says whether ``total_gb`` fits a GPU, with the headroom; under 8 % (at least 1.5 GB) left is tight."""
    headroom = gpu.usable_gb - total_gb
    if headroom < 0:
        return Fit.NO, headroom
    return (Fit.TIGHT if headroom < max(1.5, 0.08 * gpu.usable_gb) else Fit.FITS), headroom


def download_gb(arch: Architecture) -> float:
    """Size of the bf16 safetensors the machine downloads."""
    return arch.total_params * 2 / 1e9


#: Corrections of the memory model measured on the user's runs, per GPU type id ("*": every type).
MemoryCorrections = Mapping[str, MemoryCorrection]


def corrected_memory(memory: MemoryEstimate, correction: MemoryCorrection | None) -> MemoryEstimate:
    """``memory`` with a measured correction as its own item (``measured``): the model's terms scaled by its ratio.

    The CUDA context is outside the framework's counters (what a run measures), so it is not scaled.
    """
    if correction is None:
        return memory
    delta = round(memory.counted_gb * (correction.ratio - 1), 2)
    return MemoryEstimate({**memory.items, "measured": delta}, round(memory.per_gpu_total + delta, 2))


def evaluate(
    arch: Architecture,
    setup: TrainingSetup,
    gpu: GpuSpec,
    workload: Workload,
    measured: MemoryCorrections | None = None,
) -> GpuOption:
    """Computes memory, fit, speed, hours and cost of one configuration (memory corrected by ``measured``)."""
    correction = (measured or {}).get(gpu.id) or (measured or {}).get("*")
    memory = corrected_memory(estimate_memory(arch, setup), correction)
    fit, headroom = classify_fit(memory.per_gpu_total, gpu)
    speed = tokens_per_s(arch, setup, gpu)
    setup_hours = workload.install_minutes / 60 + download_gb(arch) * 1000 / workload.download_mb_per_s / 3600
    training_hours = workload.training_tokens / speed / 3600
    hours = setup_hours + training_hours + workload.teardown_minutes / 60
    rework = workload.spot_interruptions_per_hour * training_hours * (workload.checkpoint_minutes / 2 + 5) / 60
    return GpuOption(
        gpu,
        setup.num_gpus,
        setup.strategy,
        memory,
        fit,
        round(headroom, 2),
        round(speed, 1),
        round(setup_hours, 3),
        round(training_hours, 3),
        round(hours, 3),
        round(hours * gpu.list_price_usd_per_h * setup.world_size, 2),
        round(rework, 3),
        correction.run_ids if correction else (),
        setup.num_nodes,
    )


def _configurations(counts: tuple[int, ...], strategy: Strategy | None) -> list[tuple[int, Strategy]]:
    configs: list[tuple[int, Strategy]] = []
    for count in counts:
        strategies = [Strategy.DDP] if count == 1 else ([strategy] if strategy else [Strategy.DDP, Strategy.FSDP])
        configs.extend((count, s) for s in strategies)
    return configs


def all_options(
    arch: Architecture,
    setup: TrainingSetup,
    gpus: list[GpuSpec],
    workload: Workload,
    *,
    counts: tuple[int, ...] = GPU_COUNTS,
    strategy: Strategy | None = None,
    measured: MemoryCorrections | None = None,
) -> list[GpuOption]:
    """Evaluates every GPU type on every count and strategy asked for."""
    return [
        evaluate(arch, setup.with_gpus(count, chosen), gpu, workload, measured)
        for gpu in gpus
        for count, chosen in _configurations(counts, strategy)
    ]


def rank_options(options: list[GpuOption]) -> list[GpuOption]:
    """Orders options for a user: what fits first, cheapest first.

    Per GPU type, several cards are only offered when one card does not fit or would take more than a working
    day (the seed articles' rule), and per count the cheaper of DDP and FSDP is kept.
    """
    single = {o.gpu.id: o for o in options if o.total_gpus == 1}
    best: dict[tuple[str, int, int], GpuOption] = {}
    for option in options:
        one = single.get(option.gpu.id)
        if option.count > 1 and one and one.fits and one.training_hours <= WORKING_DAY_HOURS:
            continue
        key = (option.gpu.id, option.count, option.nodes)
        current = best.get(key)
        if current is None or _sort_key(option) < _sort_key(current):
            best[key] = option
    return sorted(best.values(), key=_sort_key)


def _sort_key(option: GpuOption) -> tuple[int, float, float]:
    order = {Fit.FITS: 0, Fit.TIGHT: 1, Fit.NO: 2}[option.fit]
    return (order, option.cost_usd if option.fits else -option.headroom_gb, option.hours)


def _needs_machines(one_node: list[GpuOption]) -> bool:
    """Whether one machine is not enough: nothing fits on one, or everything that fits takes over a working day."""
    fitting = [option.training_hours for option in one_node if option.fits]
    return not fitting or min(fitting) > WORKING_DAY_HOURS


def multi_node_options(
    arch: Architecture,
    setup: TrainingSetup,
    gpus: list[GpuSpec],
    workload: Workload,
    *,
    max_nodes: int,
    measured: MemoryCorrections | None = None,
) -> list[GpuOption]:
    """Per GPU type, the fewest machines of ``GPU_COUNTS[-1]`` GPUs (FSDP across all) on which the job fits.

    Only for types where one full machine does not fit or would take more than a working day; an option that
    fits on no count up to ``max_nodes`` is left out (the one-machine row already says it does not fit).
    """
    per_node = GPU_COUNTS[-1]
    found: list[GpuOption] = []
    for gpu in gpus:
        one = evaluate(arch, setup.with_gpus(per_node, Strategy.FSDP), gpu, workload, measured)
        if one.fits and one.training_hours <= WORKING_DAY_HOURS:
            continue
        for nodes in (n for n in NODE_COUNTS if n <= max_nodes):
            option = evaluate(arch, setup.with_gpus(per_node, Strategy.FSDP, nodes), gpu, workload, measured)
            if option.fits:
                found.append(option)
                break
    return found


@dataclass(frozen=True)
class SettingChange:
    """One setting changed so that a job fits: which (a :class:`TrainingSetup` field), from what, to what, and why.

    Front ends word it: the CLI as its flags, the app as its labels.
    """

    setting: str
    before: object
    after: object
    why: str


@dataclass(frozen=True)
class Suggestion:
    """Changes that make the job fit somewhere, the setup they give, and the cheapest option it has."""

    changes: tuple[SettingChange, ...]
    setup: TrainingSetup
    option: GpuOption


@dataclass(frozen=True)
class _Fix:
    """A remedy worth trying: why it helps and how it changes a setup."""

    why: str
    apply: Callable[[TrainingSetup], TrainingSetup]


def _fixes(setup: TrainingSetup) -> list[_Fix]:
    """The fixes worth trying for this setup, cheapest in quality first."""
    fixes: list[_Fix] = []
    if not setup.grad_ckpt:
        fixes.append(_Fix("recompute activations instead of keeping them", lambda s: replace(s, grad_ckpt=True)))
    if setup.micro_batch > 1:
        same_batch = min(4096, setup.grad_accum * setup.micro_batch)
        fixes.append(
            _Fix(
                "the same examples per step, one at a time in memory",
                lambda s: replace(s, micro_batch=1, grad_accum=same_batch),
            )
        )
    if setup.grad_accum > 1 and not setup.method.is_peft and not setup.sync_each_batch:
        fixes.append(
            _Fix("accumulating under FSDP keeps whole gradients on every GPU", lambda s: replace(s, grad_accum=1))
        )
    if setup.seq_len > 512:
        fixes.append(
            _Fix(
                "shorter sequences need less activation memory, but longer examples are cut",
                lambda s: replace(s, seq_len=max(16, s.seq_len // 2)),
            )
        )
    if setup.method is Method.FULL:
        fixes.append(_Fix("8-bit AdamW keeps its states in a quarter of the memory", _method(Method.FULL_8BIT)))
    if setup.method is not Method.QLORA:
        fixes.append(_Fix("a 4-bit base model takes a quarter of the memory", _method(Method.QLORA)))
    fixes.append(_Fix("FSDP shards weights, gradients and optimizer states", lambda s: s.with_gpus(8, Strategy.FSDP)))
    return fixes


def _method(method: Method) -> Callable[[TrainingSetup], TrainingSetup]:
    return lambda setup: replace(setup, method=method)


def setting_changes(before: TrainingSetup, after: TrainingSetup, why: str) -> tuple[SettingChange, ...]:
    """The settings that differ between two setups, each with ``why``."""
    return tuple(
        SettingChange(field.name, getattr(before, field.name), getattr(after, field.name), why)
        for field in fields(TrainingSetup)
        if getattr(before, field.name) != getattr(after, field.name)
    )


def _cheapest_fit(
    arch: Architecture,
    setup: TrainingSetup,
    gpus: list[GpuSpec],
    workload: Workload,
    measured: MemoryCorrections | None = None,
) -> GpuOption | None:
    options = all_options(
        arch, setup, gpus, workload, counts=(setup.num_gpus,), strategy=setup.strategy, measured=measured
    )
    fitting = [o for o in options if o.fits]
    return min(fitting, key=lambda o: o.cost_usd) if fitting else None


def suggest_fixes(
    arch: Architecture,
    setup: TrainingSetup,
    gpus: list[GpuSpec],
    workload: Workload,
    *,
    limit: int = 4,
    measured: MemoryCorrections | None = None,
) -> list[Suggestion]:
    """Finds the smallest sets of changes that make a job fit (single changes first), memory corrected by ``measured``.

    Returns:
        Up to ``limit`` suggestions, each with the cheapest option it yields; empty when nothing helps.
    """
    fixes = _fixes(setup)
    for size in range(1, len(fixes) + 1):
        suggestions = []
        for combo in itertools.combinations(fixes, size):
            changes, changed = _combined(setup, combo)
            if changes is None:
                continue  # two fixes set the same setting
            option = _cheapest_fit(arch, changed, gpus, workload, measured)
            if option is not None:
                suggestions.append(Suggestion(changes, changed, option))
        if suggestions:
            return sorted(suggestions, key=lambda s: s.option.cost_usd)[:limit]
    return []


def _combined(setup: TrainingSetup, combo: tuple[_Fix, ...]) -> tuple[tuple[SettingChange, ...] | None, TrainingSetup]:
    """The changes of several fixes applied in turn, and the setup they give (None when two touch one setting)."""
    changes: list[SettingChange] = []
    changed = setup
    for fix in combo:
        after = fix.apply(changed)
        made = setting_changes(changed, after, fix.why)
        if not made:  # already so: the smaller combination covers it
            return None, changed
        changes += made
        changed = after
    settings = [change.setting for change in changes]
    return (tuple(changes) if len(settings) == len(set(settings)) else None), changed


@dataclass(frozen=True)
class Plan:
    """The answer to "what do I rent, for how long, for how much".

    Attributes:
        arch: The model.
        setup: The setup as asked (on one GPU unless a count was given).
        workload: Tokens, epochs and fixed costs.
        memory: Per-GPU memory of the setup as asked.
        trainable_params: Parameters the optimizer updates.
        options: Ranked GPU options.
        suggestions: Changes that make it fit, when no option fits.
        measured: The memory corrections measured on the user's runs that the options use.
    """

    arch: Architecture
    setup: TrainingSetup
    workload: Workload
    memory: MemoryEstimate
    trainable_params: int
    options: list[GpuOption]
    suggestions: list[Suggestion]
    measured: MemoryCorrections | None = None


def make_plan(
    arch: Architecture,
    setup: TrainingSetup,
    gpus: list[GpuSpec],
    workload: Workload,
    *,
    counts: tuple[int, ...] = GPU_COUNTS,
    strategy: Strategy | None = None,
    measured: MemoryCorrections | None = None,
    max_nodes: int = 1,
) -> Plan:
    """Builds a ranked plan; ``counts``/``strategy`` restrict the configurations (``--gpus``, ``--strategy``).

    ``measured``: peak memory measured on the user's runs of this job, per GPU type, corrects the memory model.
    ``max_nodes`` above 1 adds, when no one machine can train the job (or none within a working day), per GPU type
    the fewest machines that can.
    """
    one_node = all_options(arch, setup, gpus, workload, counts=counts, strategy=strategy, measured=measured)
    several = []
    if max_nodes > 1 and strategy in {None, Strategy.FSDP} and GPU_COUNTS[-1] in counts and _needs_machines(one_node):
        several = multi_node_options(arch, setup, gpus, workload, max_nodes=max_nodes, measured=measured)
    options = rank_options(one_node + several)
    fits_one_node = any(o.fits for o in options if o.nodes == 1)
    suggestions = [] if fits_one_node else suggest_fixes(arch, setup, gpus, workload, measured=measured)
    return Plan(
        arch,
        setup,
        workload,
        estimate_memory(arch, setup),
        trainable_params(arch, setup),
        options,
        suggestions,
        measured,
    )
