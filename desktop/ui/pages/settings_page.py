"""Preferences and API keys. Keys go to the OS keyring, never into the settings file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import ValidationError
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
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
from desktop.services.platform.settings import save_settings
from desktop.services.providers.base import ProviderError
from desktop.services.providers.registry import check_api_key, provider_of_secret
from desktop.ui.background import Operation, Running
from desktop.ui.pages.base import BasePage

_SOURCE_TEXT = {
    SecretSource.KEYRING: "Stored in the keyring",
    SecretSource.MISSING: "Not set",
    SecretSource.NO_KEYRING: "No keyring available",
}


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
        super().__init__(parent)
        self.body.addWidget(self._build_preferences())
        self.body.addWidget(self._build_keys())
        paths = app_paths()
        where = QLabel(f"Data: {paths.data_dir}\nLog file: {paths.log_dir / LOG_FILE_NAME}")
        where.setAccessibleName("Where Rentune keeps its files")
        self.body.addWidget(where)
        self.body.addStretch(1)

    # -- preferences ----------------------------------------------------------------------------------------------

    def _build_preferences(self) -> QGroupBox:
        box = QGroupBox("Preferences")
        form = QFormLayout(box)
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
        form.addRow("Theme", self.theme_combo)
        form.addRow("Checkpoints kept per run", self.keep_spin)
        form.addRow("Log level", self.log_combo)
        self.login_check = QCheckBox("Start Rentune when I log in, in the menu bar or tray (the window stays closed)")
        self.login_check.setAccessibleName("Start Rentune at login")
        self.notify_check = QCheckBox("Notify me of budgets, idle or orphaned machines, and finished or failed runs")
        self.notify_check.setAccessibleName("Notifications")
        form.addRow("At login", self.login_check)
        form.addRow("Notifications", self.notify_check)
        row = QHBoxLayout()
        self.preferences_status = QLabel("")
        self.save_button = QPushButton("Save preferences")
        self.save_button.setAccessibleName("Save preferences")
        self.save_button.clicked.connect(self.on_save_clicked)
        row.addWidget(self.preferences_status, 1)
        row.addWidget(self.save_button)
        form.addRow(row)
        self._show_settings(self.settings)
        return box

    def _show_settings(self, settings: Settings) -> None:
        self.theme_combo.setCurrentIndex(self.theme_combo.findData(settings.theme))
        self.keep_spin.setValue(settings.keep_local_checkpoints)
        self.log_combo.setCurrentText(settings.log_level)
        self.login_check.setChecked(settings.start_at_login)
        self.notify_check.setChecked(settings.notifications)

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
            if edited.start_at_login or was_at_login:
                set_autostart(edited.start_at_login)  # first, so a refused login entry leaves the settings as they were
            return save_settings(edited)

        Operation(self, save, lambda path: self._saved(edited, path)).failure(
            self._not_saved, OSError, SettingsError, ValidationError
        ).run()

    def _saved(self, edited: Settings, path: Path) -> None:
        self.settings = edited
        self.preferences_status.setText(f"Saved to {path}")
        self.sig_settings_changed.emit(edited)

    def _not_saved(self, exc: Exception) -> None:
        self.preferences_status.setText(f"Not saved: {exc}")

    # -- API keys -------------------------------------------------------------------------------------------------

    def _build_keys(self) -> QGroupBox:
        box = QGroupBox("API keys and tokens")
        grid = QGridLayout(box)
        self.key_status: dict[SecretName, QLabel] = {}
        self.key_inputs: dict[SecretName, QLineEdit] = {}
        for row, name in enumerate(SECRETS_IN_USE):
            status = QLabel("…")
            entry = QLineEdit()
            entry.setEchoMode(QLineEdit.EchoMode.Password)
            entry.setPlaceholderText(f"Paste it here, or set {name.env_var}")
            entry.setAccessibleName(name.label)
            store = QPushButton("Save")
            store.setAccessibleName(f"Save the {name.label}")
            store.clicked.connect(lambda _=False, n=name: self.on_store_key_clicked(n))
            remove = QPushButton("Remove")
            remove.setAccessibleName(f"Remove the {name.label}")
            remove.clicked.connect(lambda _=False, n=name: self.on_remove_key_clicked(n))
            grid.addWidget(QLabel(name.label), row, 0)
            grid.addWidget(entry, row, 1)
            grid.addWidget(store, row, 2)
            grid.addWidget(remove, row, 3)
            grid.addWidget(status, row, 4)
            self.key_status[name], self.key_inputs[name] = status, entry
        self.keys_message = QLabel("")
        self.keys_message.setWordWrap(True)
        self.keys_message.setAccessibleName("API key messages")
        grid.addWidget(self.keys_message, len(SECRETS_IN_USE), 0, 1, 5)
        grid.setColumnStretch(1, 1)
        return box

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
            text = _SOURCE_TEXT.get(status.source, f"From {status.name.env_var}")
            self.key_status[status.name].setText(text)

    def on_store_key_clicked(self, name: SecretName) -> None:
        """Checks a cloud key with its provider, then stores it in the keyring (off the UI thread); clears the field."""
        value, secrets = self.key_inputs[name].text().strip(), self.secrets
        provider = provider_of_secret(name)

        def check_and_store(_job: object) -> None:
            if provider is not None and value:
                asyncio.run(check_api_key(provider, value))  # a worker thread: its own short event loop
            secrets.set(name, value)

        if provider is not None and value:
            self.keys_message.setText(f"Checking the {name.label} with {provider.label}…")
        Operation(self, check_and_store, lambda _none: self._key_stored(name)).failure(
            self._key_refused, SecretStoreError, ProviderError
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

    def _key_refused(self, exc: SecretStoreError | ProviderError) -> None:
        if isinstance(exc, ProviderError):
            self.keys_message.setText(f"Not saved: {exc}")
            return
        self.keys_message.setText(str(exc))
