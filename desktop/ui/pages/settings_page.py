"""Preferences and API keys. Keys go to the OS keyring, never into the settings file."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from pydantic import ValidationError
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.core.settings import Settings, SettingsError, Theme
from desktop.services.platform.autostart import set_autostart
from desktop.services.platform.logs import LOG_FILE_NAME
from desktop.services.platform.paths import app_paths
from desktop.services.platform.secrets import (
    SECRETS_IN_USE,
    SecretName,
    SecretSource,
    SecretStatus,
    SecretStore,
    SecretStoreError,
)
from desktop.services.platform.settings import update_settings
from desktop.services.providers.key_entry import KeyEntryError, add_key
from desktop.services.providers.registry import provider_of_secret
from desktop.ui.background import Operation, Running
from desktop.ui.pages.base import BasePage
from desktop.ui.theme import apply_theme
from desktop.ui.widgets.blocks import Badge, Card, caption, plain_button, primary_button
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.storage_card import StorageCard

#: How each key source reads on its badge: (words, severity).
_SOURCE_BADGES = {
    SecretSource.KEYRING: ("Stored in the keyring", "success"),
    SecretSource.MISSING: ("Not set", "info"),
    SecretSource.NO_KEYRING: ("No keyring available", "warning"),
}
#: The widest a preference's field grows: a choice or a number needs no more.
_FIELD_WIDTH = 260
#: The settings this page edits (the others belong to other pages or to the installation).
PREFERENCES = frozenset(
    {"theme", "keep_local_checkpoints", "log_level", "start_at_login", "notifications", "check_for_updates"}
)


class SettingsPage(BasePage):
    """Edits the preferences and the API keys."""

    page_name = "settings"
    title = "Settings"
    icon_name = "settings"
    purpose = "Preferences are saved in your config folder. API keys and tokens are kept in your system's keyring only."
    sig_settings_changed = Signal(object)

    def __init__(self, settings: Settings, secrets: SecretStore, parent: QWidget | None = None) -> None:
        self.settings = settings
        self.secrets = secrets
        self._writing = threading.Lock()  # one settings write at a time: a later choice is never overwritten
        super().__init__(parent)
        self.body.addWidget(self._build_preferences())
        self.body.addWidget(self._build_keys())
        self.storage_card = StorageCard(settings.storage, secrets)
        self.storage_card.sig_saved.connect(self.on_storage_saved)
        self.body.addWidget(self.storage_card)
        self.body.addWidget(self._build_files())
        self.body.addStretch(1)

    def showEvent(self, event: QShowEvent) -> None:
        """Reads the key states again each time the page shows: a key added on the Compute step appears here."""
        super().showEvent(event)
        self._read_key_statuses()

    def on_storage_saved(self, storage: object) -> None:
        """Keeps the saved bucket in this page's settings and announces it."""
        self.settings = self.settings.model_copy(update={"storage": storage})
        self.sig_settings_changed.emit(self.settings)

    def _build_files(self) -> Card:
        card = Card("Files", "Everything Rentune keeps on this computer, besides the keys in your keyring.")
        paths = app_paths()
        where = QLabel(f"Data: {paths.data_dir}\nLog file: {paths.log_dir / LOG_FILE_NAME}")
        where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        where.setAccessibleName("Where Rentune keeps its files")
        card.body.addWidget(where)
        return card

    # -- preferences ----------------------------------------------------------------------------------------------

    def _build_preferences(self) -> Card:
        card = Card("Preferences")
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        card.body.addLayout(form)
        self.theme_combo = QComboBox()
        self.theme_combo.setAccessibleName("Theme")
        for theme in Theme:
            self.theme_combo.addItem(theme.value.capitalize(), theme)
        self.keep_spin = QSpinBox()
        self.keep_spin.setRange(1, 100)
        self.keep_spin.setAccessibleName("Checkpoints kept on this computer per run")
        self.log_combo = QComboBox()
        self.log_combo.addItems(["DEBUG", "INFO", "WARNING", "ERROR"])
        self.log_combo.setAccessibleName("Log level")
        for field in (self.theme_combo, self.keep_spin, self.log_combo):
            field.setMinimumWidth(_FIELD_WIDTH)
        form.addRow("Theme", self.theme_combo)
        form.addRow("Checkpoints kept per run", self.keep_spin)
        self.keep_note = CorrectionNote()
        self.keep_note.watch(self.keep_spin, "Checkpoints kept per run")
        form.addRow("", self.keep_note)
        form.addRow("Log level", self.log_combo)
        self.login_check = QCheckBox("Start Rentune when I log in, in the menu bar or tray (the window stays closed)")
        self.login_check.setAccessibleName("Start Rentune at login")
        self.notify_check = QCheckBox("Notify me of budgets, idle or orphaned machines, and finished or failed runs")
        self.notify_check.setAccessibleName("Notifications")
        self.updates_check = QCheckBox("At start, check whether a newer Rentune is released (it only tells you)")
        self.updates_check.setAccessibleName("Check for updates")
        form.addRow("At login", self.login_check)
        form.addRow("Notifications", self.notify_check)
        form.addRow("Updates", self.updates_check)
        row = QHBoxLayout()
        self.preferences_status = caption()
        self.preferences_status.setWordWrap(True)
        self.save_button = primary_button("Save preferences", "circle-check", "Save preferences")
        self.save_button.clicked.connect(self.on_save_clicked)
        row.addWidget(self.save_button)
        row.addWidget(self.preferences_status, 1)
        card.body.addLayout(row)
        self._show_settings(self.settings)
        self.theme_combo.currentIndexChanged.connect(self.on_theme_chosen)
        return card

    def _show_settings(self, settings: Settings) -> None:
        self.theme_combo.setCurrentIndex(self.theme_combo.findData(settings.theme))
        self.keep_spin.setValue(settings.keep_local_checkpoints)
        self.log_combo.setCurrentText(settings.log_level)
        self.login_check.setChecked(settings.start_at_login)
        self.notify_check.setChecked(settings.notifications)
        self.updates_check.setChecked(settings.check_for_updates)

    def _edited_settings(self) -> Settings:
        # model_validate (not model_copy) so the edited values are validated and coerced like a loaded file.
        return Settings.model_validate(
            self.settings.model_dump()
            | {
                "theme": self.theme_combo.currentData(),
                "keep_local_checkpoints": self.keep_spin.value(),
                "log_level": self.log_combo.currentText(),
                "start_at_login": self.login_check.isChecked(),
                "notifications": self.notify_check.isChecked(),
                "check_for_updates": self.updates_check.isChecked(),
            }
        )

    def on_save_clicked(self) -> None:
        """Saves the edited preferences (off the UI thread) and announces them."""
        try:
            edited = self._edited_settings()
        except (SettingsError, ValidationError) as exc:
            self._not_saved(exc)
            return
        was_at_login = self.settings.start_at_login

        def save(_job: object) -> Path:
            with self._writing:
                if edited.start_at_login or was_at_login:
                    # first, so that a refused login entry leaves the settings as they were
                    set_autostart(edited.start_at_login)
                # only this page's preferences: what other pages keep there (rent or buy on Costs) stays
                return update_settings(edited.model_dump(include=set(PREFERENCES)))

        Operation(self, save, lambda path: self._saved(edited, path)).failure(
            self._not_saved, OSError, SettingsError, ValidationError
        ).run()

    def on_theme_chosen(self) -> None:
        """Applies the theme chosen at once and keeps it; other edits still wait for Save preferences."""
        theme = Theme(self.theme_combo.currentData())
        apply_theme(theme)
        self.settings = self.settings.model_copy(update={"theme": theme})

        def keep(_job: object) -> Path:
            with self._writing:
                return update_settings({"theme": theme})  # the newest choice, whichever write runs last

        Operation(self, keep, lambda _path: self._theme_kept(theme), group="theme").failure(
            self._not_saved, OSError, SettingsError
        ).run()

    def _theme_kept(self, theme: Theme) -> None:
        self.preferences_status.setText(f"{theme.value.capitalize()} theme applied and kept.")
        self.sig_settings_changed.emit(self.settings)

    def _saved(self, edited: Settings, path: Path) -> None:
        self.settings = edited
        self.preferences_status.setText(f"Saved to {path}")
        self.sig_settings_changed.emit(edited)

    def _not_saved(self, exc: Exception) -> None:
        self.preferences_status.setText(f"Not saved: {exc}")

    # -- API keys -------------------------------------------------------------------------------------------------

    def _build_keys(self) -> Card:
        card = Card(
            "API keys and tokens",
            "A cloud key is checked with its provider before it is stored. Keys never leave this computer unless a "
            "run asks for one (a gated model's Hugging Face token, the W&B key of a run reporting to W&B).",
        )
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(12)
        card.body.addLayout(grid)
        self.key_status: dict[SecretName, Badge] = {}
        self.key_inputs: dict[SecretName, QLineEdit] = {}
        self.remove_buttons: dict[SecretName, QWidget] = {}
        for row, name in enumerate(SECRETS_IN_USE):
            self._add_key_row(grid, row, name)
        self.keys_message = caption()
        self.keys_message.setWordWrap(True)
        self.keys_message.setAccessibleName("API key messages")
        card.body.addWidget(self.keys_message)
        grid.setColumnStretch(1, 1)
        return card

    def _add_key_row(self, grid: QGridLayout, row: int, name: SecretName) -> None:
        status = Badge("Reading…", "info")
        entry = QLineEdit()
        entry.setEchoMode(QLineEdit.EchoMode.Password)
        entry.setPlaceholderText(f"Paste it here, or set {name.env_var}")
        entry.setAccessibleName(name.label)
        entry.setMinimumWidth(180)
        entry.returnPressed.connect(lambda n=name: self.on_store_key_clicked(n))
        store = plain_button("Save", "key-round", f"Save the {name.label}")
        store.clicked.connect(lambda _=False, n=name: self.on_store_key_clicked(n))
        remove = plain_button("Remove", "trash-2", f"Remove the {name.label}")
        remove.clicked.connect(lambda _=False, n=name: self.on_remove_key_clicked(n))
        named = QVBoxLayout()  # the state under the name: the row stays narrow enough for a small window
        named.setSpacing(2)
        named.addWidget(QLabel(name.label))
        named.addWidget(status, 0, Qt.AlignmentFlag.AlignLeft)
        grid.addLayout(named, row, 0)
        grid.addWidget(entry, row, 1)
        grid.addWidget(store, row, 2)
        grid.addWidget(remove, row, 3)
        self.key_status[name], self.key_inputs[name], self.remove_buttons[name] = status, entry, remove

    async def load(self) -> None:
        """Reads which keys are set (asking the keyring may block, so it runs off the UI thread)."""
        await self._read_key_statuses().wait()

    def _read_key_statuses(self) -> Running[list[SecretStatus]]:
        secrets = self.secrets
        statuses = Operation(
            self, lambda _job: [secrets.status(name) for name in SECRETS_IN_USE], self._show_key_statuses, group="keys"
        )
        return statuses.run()

    def _show_key_statuses(self, statuses: list[SecretStatus]) -> None:
        for status in statuses:
            words, severity = _SOURCE_BADGES.get(status.source, (f"From {status.name.env_var}", "success"))
            if status.problem:  # a space or line break inside the variable: the key cannot be used as it is
                words, severity = f"{status.name.env_var} cannot be used", "danger"
            self.key_status[status.name].show_state(words, severity)
            self.key_status[status.name].setToolTip(status.problem)
            self.remove_buttons[status.name].setEnabled(status.source is SecretSource.KEYRING)

    def on_store_key_clicked(self, name: SecretName) -> None:
        """Checks a cloud key with its provider, then stores it in the keyring (off the UI thread); clears the field."""
        value, secrets = self.key_inputs[name].text().strip(), self.secrets
        provider = provider_of_secret(name)

        def check_and_store(_job: object) -> None:
            if provider is not None and value:
                asyncio.run(add_key(provider, value, secrets))  # a worker thread: its own short event loop
            else:
                secrets.set(name, value)

        if provider is not None and value:
            self.keys_message.setText(f"Checking the {name.label} with {provider.label}…")
        Operation(self, check_and_store, lambda _none: self._key_stored(name)).failure(
            self._key_refused, SecretStoreError, KeyEntryError
        ).run()

    def _key_stored(self, name: SecretName) -> None:
        self.key_inputs[name].clear()
        provider = provider_of_secret(name)
        checked = f" (checked with {provider.label})" if provider else ""
        self.keys_message.setText(f"{name.label} saved in the keyring{checked}.")
        self._read_key_statuses()

    def on_remove_key_clicked(self, name: SecretName) -> None:
        """Removes a key from the keyring (off the UI thread)."""
        secrets = self.secrets
        Operation(self, lambda _job: secrets.delete(name), lambda _none: self._key_removed(name)).failure(
            self._key_refused, SecretStoreError
        ).run()

    def _key_removed(self, name: SecretName) -> None:
        self.keys_message.setText(f"{name.label} removed from the keyring.")
        self._read_key_statuses()

    def _key_refused(self, exc: SecretStoreError | KeyEntryError) -> None:
        # a key the provider refused or could not check: its words name the provider, what went wrong and the fix
        self.keys_message.setText(f"Not saved: {exc}" if isinstance(exc, KeyEntryError) else str(exc))
