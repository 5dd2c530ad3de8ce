"""The wizard's last step: the whole run on one page, then Launch (through the same SPEC.toml the CLI runs)."""

from __future__ import annotations

import asyncio
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget
from qasync import asyncSlot

from desktop.core.runs.draft import RunDraft, gpu_pick_training
from desktop.core.runs.spec import RunSpec, RunSpecError, run_spec_from_dict
from desktop.core.sizing.report import format_hours
from desktop.services.data.prepare import read_manifest
from desktop.services.models.sizing import Sizing, SizingError, option_label
from desktop.services.platform.files import atomic_copy
from desktop.services.platform.logs import get_logger
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import SecretStore
from desktop.services.runs.drafts import size_draft, write_spec_toml
from desktop.services.runs.engine import RunError
from desktop.ui.background import Operation, Running, off_ui_thread
from desktop.ui.context import AppContext
from desktop.ui.pages.wizard.sizing_words import fit_text
from desktop.ui.pages.wizard.step_base import WizardStep

SPEC_NAME = "SPEC.toml"
#: The review's sections: (step to edit, heading).
SECTIONS = (
    ("data", "Data"),
    ("model", "Model and method"),
    ("sizing", "Sizing"),
    ("target", "Target"),
)
_log = get_logger("ui.review")


class LaunchError(RuntimeError):
    """The run could not be launched; the message says what to fix."""


def launch_spec_path(now: datetime | None = None) -> Path:
    """A new ``launches/<UTC timestamp>/SPEC.toml`` path in the data folder (never one already used)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    root = app_paths().data_dir / "launches"
    folder, number = root / stamp, 1
    while folder.exists():
        number += 1
        folder = root / f"{stamp}-{number}"
    return folder / SPEC_NAME


def load_spec(path: Path) -> RunSpec:
    """Reads a SPEC.toml exactly as ``rentune run`` does.

    Raises:
        LaunchError: The file cannot be read or is not a valid run description.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return run_spec_from_dict(data, path.resolve().parent, path.resolve())
    except OSError as exc:
        raise LaunchError(f"{path} could not be read back ({exc}); check the disk and launch again") from exc
    except tomllib.TOMLDecodeError as exc:
        raise LaunchError(f"{path} is not valid TOML ({exc}); launch again") from exc
    except RunSpecError as exc:
        raise LaunchError(f"the run is not complete: {exc}; fix it with the matching Edit button") from exc


def write_launch_spec(draft: RunDraft) -> tuple[Path, RunSpec]:
    """Writes the draft as SPEC.toml under ``launches/`` and reads it back; blocking (call it off the UI thread)."""
    path = launch_spec_path()
    try:
        write_spec_toml(draft, path)
    except OSError as exc:
        raise LaunchError(f"SPEC.toml could not be written to {path.parent} ({exc}); check the disk") from exc
    return path, load_spec(path)


def missing_step(draft: RunDraft) -> str | None:
    """What the draft still lacks before a launch, naming the step that fills it; None when complete."""
    checks = (
        (draft.train_file, "Prepare the data first (Edit next to Data)."),
        (draft.base_model, "Choose a base model first (Edit next to Model and method)."),
        (draft.target.host and draft.target.user, "Set up the server first (Edit next to Target)."),
        (draft.target.host_key, "Test the connection on the Target step, so the server's host key is pinned."),
    )
    return next((message for value, message in checks if not value), None)


#: What the review shows besides the draft: the data's manifest, and the sizing or why there is none.
_Facts = tuple[dict[str, Any] | None, Sizing | None, str | None]


def read_facts(draft: RunDraft, secrets: SecretStore | None) -> _Facts:
    """Reads the draft's data manifest and sizes its job (blocking: files, maybe the network)."""
    manifest = read_manifest(draft.train_file)
    try:
        return manifest, size_draft(draft, secrets), None
    except SizingError as exc:
        return manifest, None, f"Cannot size the run: {exc}."


def data_text(draft: RunDraft, manifest: dict[str, Any] | None) -> str:
    """The Data section: files, rows and tokens."""
    lines = [f"Data file: {draft.data_file or '(none)'}", f"Training file: {draft.train_file or 'not prepared yet'}"]
    if draft.eval_file:
        lines.append(f"Eval file: {draft.eval_file}")
    if manifest:
        counts, tokens = manifest.get("counts", {}), manifest.get("tokens", {})
        lines.append(
            f"Rows: {counts.get('train', 0):,} training, {counts.get('eval', 0):,} eval "
            f"({counts.get('with_errors', 0):,} with errors and {counts.get('duplicates_removed', 0):,} duplicates "
            "left out)"
        )
        lines.append(f"Tokens per epoch: {tokens.get('trained_per_epoch', 0):,} ({tokens.get('method', 'counted')})")
    return "\n".join(lines)


def model_text(draft: RunDraft) -> str:
    """The Model section: base model, method and the settings that matter most."""
    training = {"method": draft.method, **draft.training}
    method = str(training["method"])
    settings = [f"seq_len {training.get('seq_len', 2048)}", f"micro_batch {training.get('micro_batch', 2)}"]
    settings.append(f"grad_accum {training.get('grad_accum', 4)}")
    if method in {"qlora", "lora"}:
        settings[:0] = [f"LoRA r {training.get('lora_r', 16)}", f"alpha {training.get('lora_alpha', 32)}"]
    steps = int(training.get("max_steps", -1) or -1)
    settings.append(f"{steps:,} steps" if steps > 0 else f"{training.get('epochs', 3)} epochs")
    settings.append(f"learning rate {training.get('learning_rate', 2e-4):g}")
    return f"Base model: {draft.base_model or '(none)'}\nMethod: {method}; " + ", ".join(settings)


def sizing_text(draft: RunDraft, sizing: Sizing | None, problem: str | None) -> str:
    """The Sizing section: the pick with its hours and dollars (and at the server's own rate)."""
    if problem:
        return problem
    if sizing is None:
        return "Sizing…"
    lines = [f"Peak memory per GPU: {sizing.plan.memory.per_gpu_total:.1f} GB"]
    option = sizing.option(draft.gpu_name) if draft.gpu_name else None
    kind = "Pick"
    if option is None:
        option, kind = sizing.recommended, "Recommended"
    if option is None:
        lines.append("No GPU option fits (Edit to change the method or settings).")
        return "\n".join(lines)
    lines.append(
        f"{kind}: {option_label(option)}, {fit_text(option)}; about {format_hours(option.hours)}, "
        f"${option.cost_usd:,.2f} at list price"
    )
    if draft.hourly_rate_usd > 0:
        own = option.hours * draft.hourly_rate_usd
        lines.append(f"At your server's ${draft.hourly_rate_usd:,.2f} per hour: about ${own:,.2f}")
    lines.append(gpus_text(draft))
    return "\n".join(lines)


def gpus_text(draft: RunDraft) -> str:
    """How many GPUs the launched run trains on (the Sizing pick; one when nothing was picked)."""
    keys = {"num_gpus": 1, **draft.training, **gpu_pick_training(draft.gpu_name)}
    count = int(keys["num_gpus"])
    return "Trains on 1 GPU" if count == 1 else f"Trains on {count} GPUs ({keys.get('strategy', 'ddp')})"


def target_text(draft: RunDraft) -> str:
    """The Target section: where, the pinned key, the GPU, the interpreter and the money."""
    target = draft.target
    if not target.host:
        return "No server set up yet."
    lines = [
        f"Server: {target.url}" + (f" with key {target.identity}" if target.identity else ""),
        f"Host key: {target.fingerprint} (pinned)" if target.host_key else "Host key: not tested yet",
        f"GPU: {target.gpu or 'unknown (test the connection)'}",
        f"Python: {target.python}; work folder: {target.workdir or '~/.rentune/runs'}",
        f"Hourly rate: ${draft.hourly_rate_usd:,.2f}"
        if draft.hourly_rate_usd
        else "Hourly rate: not set (cost not metered)",
    ]
    if draft.budget_usd:
        lines.append(f"Budget: stop past ${draft.budget_usd:,.2f}")
    return "\n".join(lines)


class ReviewStep(WizardStep):
    """Shows the run on one page with Edit links, and launches it."""

    step_name = "review"
    title = "Review and launch"
    purpose = (
        "Everything about the run on one page. Launch writes it as a SPEC.toml (run it again headless with "
        "rentune run) and starts it; you can close the app while it trains."
    )

    #: Emitted with a step name when the user wants to change that part.
    sig_edit = Signal(str)
    #: Emitted with the run id once the run is launched.
    sig_launched = Signal(str)

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.sizing: Sizing | None = None
        self.sizing_problem: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.launched_spec: Path | None = None
        self._shown = ""  # the draft (as JSON) the sections were last refreshed for
        self._launched = ""  # the draft (as JSON) last launched: Launch stays off until something changes
        self._task: asyncio.Future[None] | None = None
        self._launch_task: asyncio.Future[None] | None = None
        self.section_labels: dict[str, QLabel] = {}
        self.edit_buttons: dict[str, QPushButton] = {}
        for name, heading in SECTIONS:
            self.body.addWidget(self._build_section(name, heading))
        self.body.addStretch(1)
        self.body.addLayout(self._build_launch())

    def _build_section(self, name: str, heading: str) -> QGroupBox:
        box = QGroupBox(heading)
        row = QHBoxLayout(box)
        label = QLabel()
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        label.setAccessibleName(f"{heading} of the run")
        edit = QPushButton("Edit")
        edit.setAccessibleName(f"Edit the {heading.lower()}")
        edit.clicked.connect(lambda _checked=False, step=name: self.sig_edit.emit(step))
        column = QVBoxLayout()
        column.addWidget(edit)
        column.addStretch(1)
        row.addWidget(label, 1)
        row.addLayout(column)
        self.section_labels[name], self.edit_buttons[name] = label, edit
        return box

    def _build_launch(self) -> QHBoxLayout:
        self.launch_status = QLabel()
        self.launch_status.setObjectName("launch_status")
        self.launch_status.setWordWrap(True)
        self.launch_status.setAccessibleName("Launch result")
        self.launch_button = QPushButton("&Launch")
        self.launch_button.setAccessibleName("Launch the run")
        self.launch_button.clicked.connect(self.on_launch_clicked)
        row = QHBoxLayout()
        row.addWidget(self.launch_status, 1)
        row.addWidget(self.launch_button)
        return row

    # -- the wizard's hooks ---------------------------------------------------------------------------------------

    def show_draft(self) -> None:
        """Shows the draft; when it changed, reads the data manifest and sizes the pick again in the background."""
        self._show_sections()
        launched = self.draft.model_dump_json() == self._launched
        self.launch_button.setEnabled(not launched)
        if self.draft.model_dump_json() != self._shown:
            self._task = self._start_refresh().task

    async def load(self) -> None:
        """Reads the manifest and sizes the saved draft once when the window opens."""
        await self.refresh()

    def _show_sections(self) -> None:
        draft = self.draft
        self.section_labels["data"].setText(data_text(draft, self.manifest))
        self.section_labels["model"].setText(model_text(draft))
        self.section_labels["sizing"].setText(sizing_text(draft, self.sizing, self.sizing_problem))
        self.section_labels["target"].setText(target_text(draft))

    async def refresh(self) -> None:
        """Reads the manifest and makes the plan off the UI thread, then shows them (a newer refresh wins)."""
        await self._start_refresh().wait()

    def _start_refresh(self) -> Running[_Facts]:
        snapshot, secrets = self.draft.model_copy(deep=True), self.context.secrets
        self._shown = snapshot.model_dump_json()
        return Operation(self, lambda _job: read_facts(snapshot, secrets), self._show_facts, group="facts").run()

    def _show_facts(self, facts: _Facts) -> None:
        self.manifest, self.sizing, self.sizing_problem = facts
        self._show_sections()

    # -- launching --------------------------------------------------------------------------------------------------

    def on_launch_clicked(self) -> None:
        """Starts launching; the button stays disabled until the run is recorded or refused."""
        self.launch_button.setEnabled(False)
        self.launch_status.setText("Launching…")
        self._launch_task = self._run_launch()

    @asyncSlot()
    async def _run_launch(self) -> None:
        await self.launch()

    async def launch(self) -> str | None:
        """Writes SPEC.toml, reads it back as the CLI does, starts the run and copies the spec into its folder.

        Returns:
            The new run's id, or None when it could not be launched (the reason is shown).
        """
        self.launch_button.setEnabled(False)
        self.launch_status.setText("Launching…")
        try:
            run_id = await self._launch()
        except LaunchError as exc:
            self.launch_status.setText(f"Not launched: {exc}")
            self.launch_button.setEnabled(True)
            return None
        except Exception:
            self.launch_button.setEnabled(True)
            raise
        # Launch stays off for this exact draft: a second click would rent the same run twice.
        self._launched = self.draft.model_dump_json()
        self.launch_status.setText(
            f"Run {run_id} launched. It trains in the background; follow it on the Runs page. "
            "Change something (Edit) to launch another run."
        )
        self.sig_launched.emit(run_id)
        return run_id

    async def _launch(self) -> str:
        missing = missing_step(self.draft)
        if missing:
            raise LaunchError(missing)
        manager = self.context.manager
        if manager is None:
            raise LaunchError("the run manager is not available; restart Rentune")
        path, spec = await off_ui_thread(self, write_launch_spec, self.draft.model_copy(deep=True))
        try:
            record = await manager.launch_in_background(spec)
        except RunError as exc:
            raise LaunchError(f"{exc}. Fix it with the matching Edit button and launch again") from exc
        self.launched_spec = path
        folder = manager.engine(record.id).folder(record.id)
        try:
            await off_ui_thread(self, atomic_copy, path, folder / SPEC_NAME)
        except OSError as exc:  # the run is launched; only the copy beside it is missing
            _log.warning("could not copy %s into the run folder %s: %s", path, folder, exc)
        _log.info("launched run %s from %s", record.id, path)
        return record.id
