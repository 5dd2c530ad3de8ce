"""The start page: what Rentune does, what a first fine-tune needs (and what is ready), and this computer's tools.

On a first run it is the one screen that explains the app and leads into the wizard; later it says where the user
left off.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from qasync import asyncSlot

from desktop.core.runs.draft import RunDraft
from desktop.services.platform.environment import EnvironmentCheck, check_environment
from desktop.services.platform.secrets import SecretName, SecretStore, StoreState, probe_secret_store
from desktop.services.runs.store import RunRecord, RunStore
from desktop.ui.background import Operation, off_ui_thread
from desktop.ui.design.icons import tint
from desktop.ui.pages.base import BasePage
from desktop.ui.run_words import state_badge
from desktop.ui.widgets.blocks import Badge, Card, caption, heading, plain_button, primary_button

FLOW_STEPS = [
    ("Check the data", "on this computer, before any GPU bills"),
    ("Size the job", "memory per GPU, GPU count, hours and dollars"),
    ("Pick a GPU", "a live offer from RunPod, Vast.ai or Lambda, or your own server"),
    ("Train", "detached on the machine; checkpoints come home as they are written"),
    ("Stop paying", "the machine is terminated the moment the adapter is safe here"),
    ("Use it", "export to GGUF or MLX and chat with it on this computer"),
]
CLOUD_KEYS = (SecretName.RUNPOD, SecretName.VAST, SecretName.LAMBDA)
#: The wizard step each saved draft step continues at, in the words of the Continue button.
STEP_WORDS = {
    "data": "Data",
    "model": "Model and method",
    "sizing": "Sizing",
    "compute": "Compute",
    "target": "Compute",
    "review": "Review and launch",
}


@dataclass(frozen=True)
class Readiness:
    """What a first fine-tune needs and whether each is there.

    Attributes:
        dataset: The prepared dataset's file name, or "" when none is prepared.
        keys: Labels of the cloud API keys that are set (keyring or environment) and usable.
        own_server: The pinned own server's address, or "".
        keyring_missing: No keyring exists here (keys can then only come from the environment).
        store_problem: Why the keyring blocks renting (it loses or refuses secrets), in one line; "" when it does not.
        last_run: The run started last (live or ended), or None when there is none.
    """

    dataset: str
    keys: tuple[str, ...]
    own_server: str
    keyring_missing: bool
    store_problem: str = ""
    last_run: RunRecord | None = None


def read_readiness(draft: RunDraft, secrets: SecretStore, store: RunStore | None = None) -> Readiness:
    """Looks at the draft, the keyring and the runs (blocking: the keyring can take a moment).

    Call it off the UI thread.
    """
    runs = store.all() if store is not None else []
    probe = probe_secret_store()
    keys = tuple(status.name.label for status in (secrets.status(name) for name in CLOUD_KEYS) if status.usable)
    dataset = draft.data_file.rsplit("/", 1)[-1] if draft.train_file else ""
    server = draft.target.url.removeprefix("ssh://") if draft.target.host_key else ""
    return Readiness(
        dataset=dataset,
        keys=keys,
        own_server=server,
        keyring_missing=probe.state is StoreState.NO_KEYRING,
        store_problem=probe.problem if probe.blocks_renting else "",
        last_run=max(runs, key=lambda record: record.started) if runs else None,
    )


class NeedTile(QWidget):
    """One thing a fine-tune needs: an icon, a title, a Ready/Needed badge and a line saying what to do."""

    def __init__(self, icon_name: str, title: str) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        picture = QLabel()
        tint(picture, icon_name, size=22)
        top.addWidget(picture)
        top.addWidget(heading(title), 1)
        self.badge = Badge("Checking", "info")
        top.addWidget(self.badge)
        layout.addLayout(top)
        self.text = caption()
        layout.addWidget(self.text)
        layout.addStretch(1)
        self.setAccessibleName(title)

    def show_state(self, ready: bool, text: str, *, optional: bool = False) -> None:
        """Shows whether the need is met and what it is (or what to do)."""
        if ready:
            self.badge.show_state("Ready", "success")
        else:
            self.badge.show_state("Optional" if optional else "Needed", "info" if optional else "warning")
        self.text.setText(text)
        self.setAccessibleDescription(text)


class HomePage(BasePage):
    """Welcomes the user, says what a first fine-tune needs and what is ready, and reports the local tools."""

    page_name = "home"
    title = "Welcome to Rentune"
    icon_name = "house"
    purpose = (
        "Fine-tune an open LLM on a rented GPU and pay only for the training: your data is checked and the job "
        "sized here, before any machine bills, and the machine stops the moment your model is safe."
    )
    sig_environment_checked = Signal(list)
    #: Emitted with a wizard step name when the user starts or continues a fine-tune.
    sig_start_wizard = Signal(str)
    #: Emitted with a page name (``settings``) when the user wants to add a key there.
    sig_open_page = Signal(str)
    #: Emitted when the user starts a new fine-tune after the draft was launched (the draft starts over).
    sig_start_over = Signal()
    #: Emitted with a run id when the user opens the last run.
    sig_open_run = Signal(str)

    def __init__(
        self,
        parent: QWidget | None = None,
        banner: QWidget | None = None,
        draft: RunDraft | None = None,
        secrets: SecretStore | None = None,
        store: RunStore | None = None,
    ) -> None:
        super().__init__(parent)
        self.draft, self.secrets, self.store = draft or RunDraft(), secrets or SecretStore(), store
        self.last_run: RunRecord | None = None
        self._loaded = False  # readiness is read in the background once the page is loaded, then on every show
        if banner is not None:
            self.body.addWidget(banner)  # orphaned machines: the first thing to see when something bills for nothing
        self.body.addWidget(self._build_start())
        self.body.addWidget(self._build_flow())
        self.body.addWidget(self._build_environment())
        self.body.addStretch(1)

    # -- building ------------------------------------------------------------------------------------------------

    def _build_start(self) -> Card:
        card = Card("What a fine-tune needs", "Three things, each checked here before anything is rented.")
        grid = QGridLayout()
        grid.setHorizontalSpacing(24)
        self.dataset_tile = NeedTile("file-text", "A chat dataset")
        self.gpu_tile = NeedTile("cpu", "A GPU")
        self.tools_tile = NeedTile("hard-drive", "This computer")
        for column, tile in enumerate((self.dataset_tile, self.gpu_tile, self.tools_tile)):
            grid.addWidget(tile, 0, column)
            grid.setColumnStretch(column, 1)
        card.body.addLayout(grid)
        row = QHBoxLayout()
        self.start_button = primary_button("&Start a fine-tune", "wand-sparkles", "Start a fine-tune")
        self.start_button.clicked.connect(self.on_start_clicked)
        self.keys_button = plain_button("Add a cloud &key…", "key-round", "Add a cloud API key in Settings")
        self.keys_button.clicked.connect(lambda: self.sig_open_page.emit("settings"))
        self.run_button = plain_button("&Open the last run", "activity", "Open the last run in the monitor")
        self.run_button.clicked.connect(self.on_run_clicked)
        self.run_button.hide()
        row.addWidget(self.start_button)
        row.addWidget(self.run_button)
        row.addWidget(self.keys_button)
        row.addStretch(1)
        card.body.addLayout(row)
        self._show_readiness(None)
        return card

    def _build_flow(self) -> Card:
        card = Card("How a fine-tune goes")
        grid = QGridLayout()
        grid.setHorizontalSpacing(24)
        grid.setVerticalSpacing(6)
        half = (len(FLOW_STEPS) + 1) // 2
        for number, (step, detail) in enumerate(FLOW_STEPS, start=1):
            label = QLabel(f"<b>{number}. {step}</b><br>{detail}")
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)
            grid.addWidget(label, (number - 1) % half, (number - 1) // half, Qt.AlignmentFlag.AlignTop)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 1)
        card.body.addLayout(grid)
        return card

    def _build_environment(self) -> Card:
        card = Card("This computer", "What Rentune found here. Optional tools unlock features; none is needed to rent.")
        self.environment_table = QTableWidget(0, 3)
        self.environment_table.setAccessibleName("Environment checks")
        self.environment_table.setHorizontalHeaderLabels(["Component", "Found", "To fix"])
        self.environment_table.verticalHeader().setVisible(False)
        self.environment_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.environment_table.setWordWrap(True)
        header = self.environment_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        card.body.addWidget(self.environment_table)
        row = QHBoxLayout()
        self.environment_summary = caption("Checking…")
        self.recheck_button = plain_button("Check &again", "refresh-cw", "Check this computer again")
        self.recheck_button.clicked.connect(self.on_recheck_clicked)
        row.addWidget(self.environment_summary, 1)
        row.addWidget(self.recheck_button)
        card.body.addLayout(row)
        return card

    # -- loading -------------------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Runs the environment and readiness checks off the UI thread (the keyring can block) and shows them."""
        self._loaded = True
        self.refresh_readiness()
        self.recheck_button.setEnabled(False)
        self.environment_summary.setText("Checking…")
        try:
            checks = await off_ui_thread(self, check_environment)
        finally:
            self.recheck_button.setEnabled(True)
        self._show_checks(checks)
        self.sig_environment_checked.emit(checks)

    def refresh_readiness(self) -> None:
        """Reads the draft, the keys and the runs again (in the background) and shows what is ready."""
        draft, secrets, store = self.draft.model_copy(deep=True), self.secrets, self.store
        Operation(self, lambda _job: read_readiness(draft, secrets, store), self._show_readiness, group="ready").run()

    def showEvent(self, event: QShowEvent) -> None:
        """Shows the latest readiness each time the page comes back (a key added, a dataset prepared)."""
        super().showEvent(event)
        if self._loaded:
            self.refresh_readiness()

    @asyncSlot()
    async def on_recheck_clicked(self) -> None:
        """Re-runs the environment check."""
        await self.load()

    def on_start_clicked(self) -> None:
        """Opens the wizard where the saved draft left off (its first step for a new user).

        After the draft was launched, starts a new fine-tune instead (Continue would only lead to a launched draft).
        """
        if self.draft.launched:
            self.sig_start_over.emit()
        else:
            self.sig_start_wizard.emit(self.draft.step or "data")

    def on_run_clicked(self) -> None:
        """Opens the last run in the monitor."""
        if self.last_run is not None:
            self.sig_open_run.emit(self.last_run.id)

    # -- showing -------------------------------------------------------------------------------------------------

    def _show_readiness(self, readiness: Readiness | None) -> None:
        if readiness is None:
            for tile in (self.dataset_tile, self.gpu_tile):
                tile.show_state(False, "Checking…")
            self.tools_tile.show_state(False, "Checking…", optional=True)
            return
        self._show_dataset(readiness)
        self._show_gpu(readiness)
        self._show_last_run(readiness.last_run)
        step = self.draft.step or "data"
        started = step != "data" or bool(readiness.dataset)
        if self.draft.launched:
            text = "Start a &new fine-tune"
        else:
            text = f"&Continue: {STEP_WORDS.get(step, 'Data')}" if started else "&Start a fine-tune"
        self.start_button.setText(text)
        self.start_button.setAccessibleName(text.replace("&", ""))
        self.keys_button.setVisible(not readiness.keys)

    def _show_last_run(self, record: RunRecord | None) -> None:
        self.last_run = record
        self.run_button.setVisible(record is not None)
        if record is not None:
            words, _severity = state_badge(record)
            text = f"&Open the last run ({words.lower()})"
            self.run_button.setText(text)
            self.run_button.setAccessibleName(f"Open the last run, {record.id} ({words.lower()})")
            self.run_button.setToolTip(f"Run {record.id}: {words.lower()}")

    def _show_dataset(self, readiness: Readiness) -> None:
        if readiness.dataset:
            self.dataset_tile.show_state(True, f"{readiness.dataset} is checked and prepared.")
        else:
            self.dataset_tile.show_state(
                False, "A JSONL, CSV or Parquet file of conversations. It is checked on this computer first."
            )

    def _show_gpu(self, readiness: Readiness) -> None:
        if readiness.own_server and (readiness.store_problem or not readiness.keys):
            self.gpu_tile.show_state(True, f"Your own server {readiness.own_server} (host key pinned).")
        elif readiness.store_problem:
            self.gpu_tile.show_state(False, f"Renting is blocked: {readiness.store_problem}.")
        elif readiness.keys:
            self.gpu_tile.show_state(True, f"{', '.join(readiness.keys)} set: live offers are shown when you size.")
        elif readiness.keyring_missing:
            self.gpu_tile.show_state(
                False,
                "No keyring works here: set RUNPOD_API_KEY, VAST_API_KEY or LAMBDA_API_KEY, or use your own server.",
            )
        else:
            self.gpu_tile.show_state(
                False, "An API key for RunPod, Vast.ai or Lambda (kept in your keyring), or your own server over SSH."
            )

    def _show_checks(self, checks: list[EnvironmentCheck]) -> None:
        table = self.environment_table
        table.setRowCount(len(checks))
        for row, check in enumerate(checks):
            mark = "✔" if check.ok else ("✖" if check.required else "·")
            table.setItem(row, 0, QTableWidgetItem(f"{mark}  {check.name}"))
            table.setItem(row, 1, QTableWidgetItem(check.detail))
            table.setItem(row, 2, QTableWidgetItem(check.fix))
        table.resizeRowsToContents()
        table.setFixedHeight(_table_height(table))
        missing_required = [c.name for c in checks if c.required and not c.ok]
        optional = sum(1 for c in checks if c.is_tool and c.ok)
        total = sum(1 for c in checks if c.is_tool)
        if missing_required:
            self.environment_summary.setText("Needs attention: " + ", ".join(missing_required))
            self.tools_tile.show_state(False, f"Fix first: {', '.join(missing_required)} (see below).")
        else:
            self.environment_summary.setText(f"Ready. Optional tools installed: {optional} of {total}.")
            self.tools_tile.show_state(True, f"Ready to rent and train. Optional tools: {optional} of {total}.")


def _table_height(table: QTableWidget) -> int:
    """The height that shows every row without a scroll bar."""
    rows = sum(table.rowHeight(row) for row in range(table.rowCount()))
    return rows + table.horizontalHeader().height() + 2 * table.frameWidth() + 2
