"""One row per GPU cloud on the Compute step: how it answered, its key (masked), and an inline "Add key".

A key typed here is checked with the provider first, then kept in the keyring (never in the settings file); the
row then shows only its last characters, and ``sig_key_saved`` tells the page to ask for offers again.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from desktop.services.platform.secrets import SecretSource, SecretStore
from desktop.services.providers.base import ProviderName
from desktop.services.providers.key_entry import KeyEntryError, KeyState, add_key
from desktop.services.runs.offers_for_draft import ProviderAnswer, ProviderStatus
from desktop.ui.app_words import app_sentence
from desktop.ui.background import CoroutineOperation
from desktop.ui.widgets.blocks import Badge, Banner, caption, plain_button, primary_button

#: The badge of each answer: (words, severity).
_BADGES = {
    ProviderStatus.NO_KEY: ("No key", "info"),
    ProviderStatus.NO_KEYRING: ("No keyring", "warning"),
    ProviderStatus.REFUSED: ("Key refused", "danger"),
    ProviderStatus.FAILED: ("Not answering", "warning"),
}


def badge_of(answer: ProviderAnswer | None, asking: bool, key: KeyState | None = None) -> tuple[str, str]:
    """The badge words and severity for a provider's answer (or while it is being asked)."""
    if asking:
        return "Asking…", "info"
    if answer is None:
        return ("No key", "info") if key is not None and not key.present else ("Not asked yet", "info")
    if answer.status is ProviderStatus.ANSWERED:
        return (f"{answer.count:,} offers", "success") if answer.count else ("None in stock", "warning")
    return _BADGES[answer.status]


class ProviderKeyRow(QFrame):
    """A provider's line: name, badge, what it said, and the key (masked) with Add key / Replace key."""

    sig_key_saved = Signal(object)  # the ProviderName whose key was stored

    def __init__(self, name: ProviderName, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.name, self.secrets = name, secrets
        self.answer: ProviderAnswer | None = None
        self.key: KeyState | None = None
        self.setAccessibleName(f"{name.label} account")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        layout.setSpacing(6)
        layout.addLayout(self._build_summary())
        self.editor = self._build_editor()
        layout.addWidget(self.editor)
        self.error = Banner("danger")
        self.error.setAccessibleName(f"Why the {name.label} key was not saved")
        layout.addWidget(self.error)
        self.editor.setVisible(False)
        self.show_answer(None, None, asking=False)

    def _build_summary(self) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        title = QLabel(self.name.label)
        font = title.font()
        font.setBold(True)
        title.setFont(font)
        title.setMinimumWidth(title.fontMetrics().horizontalAdvance("Vast.ai") + 16)
        self.badge = Badge()
        self.words = caption()
        self.words.setAccessibleName(f"What {self.name.label} said")
        self.words.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.key_button = plain_button("Add key", "key-round", f"Add a {self.name.label} API key")
        self.key_button.clicked.connect(self.on_key_button_clicked)
        grid.addWidget(title, 0, 0)
        grid.addWidget(self.badge, 0, 1)
        grid.addWidget(self.words, 0, 2)
        grid.addWidget(self.key_button, 0, 3, Qt.AlignmentFlag.AlignRight)
        grid.setColumnStretch(2, 1)
        return grid

    def _build_editor(self) -> QWidget:
        editor = QWidget()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText(f"Paste your {self.name.label} API key")
        self.key_edit.setAccessibleName(f"{self.name.label} API key")
        self.key_edit.returnPressed.connect(self.on_save_clicked)
        self.save_button = primary_button("Check and save", None, f"Check the {self.name.label} key and save it")
        self.save_button.clicked.connect(self.on_save_clicked)
        self.cancel_button = plain_button("Cancel", None, f"Do not add a {self.name.label} key")
        self.cancel_button.clicked.connect(self.on_cancel_clicked)
        row.addWidget(self.key_edit, 1)
        row.addWidget(self.save_button)
        row.addWidget(self.cancel_button)
        outer = QVBoxLayout()
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addLayout(row)
        outer.addWidget(caption(f"Checked with {self.name.label} first, then kept in your system's keyring."))
        editor.setLayout(outer)
        return editor

    # -- showing ----------------------------------------------------------------------------------------------------

    def show_answer(self, answer: ProviderAnswer | None, key: KeyState | None, *, asking: bool) -> None:
        """Shows what the provider said (or that it is being asked) and where its key comes from."""
        self.answer, self.key = answer, key or self.key
        words, severity = badge_of(answer, asking, self.key)
        self.badge.show_state(words, severity)
        parts = [self.key.words + "." if self.key is not None and self.key.present else ""]
        if answer is not None and not asking and not (answer.status is ProviderStatus.ANSWERED and answer.count):
            parts.append(answer.words)  # the badge already counts the offers
        self.words.setText(" ".join(part for part in parts if part))
        from_environment = self.key is not None and self.key.source is SecretSource.ENVIRONMENT
        self.key_button.setVisible(not from_environment)  # a variable wins over the keyring: replacing is moot
        has_key = self.key is not None and self.key.present
        self.key_button.setText("Replace key" if has_key else "Add key")
        self.key_button.setAccessibleName(f"{'Replace the' if has_key else 'Add a'} {self.name.label} API key")
        if answer is not None and answer.status is ProviderStatus.REFUSED and not self.editor.isVisible():
            self._open_editor(focus=False)  # a background answer never takes the focus from what the user does

    def _open_editor(self, *, focus: bool = True) -> None:
        self.editor.setVisible(True)
        self.error.show_message("danger", "")
        if focus:
            self.key_edit.setFocus()

    # -- adding a key ---------------------------------------------------------------------------------------------

    def on_key_button_clicked(self) -> None:
        """Shows the key field (or hides it when it is open)."""
        if self.editor.isVisible():
            self.on_cancel_clicked()
            return
        self._open_editor()

    def on_cancel_clicked(self) -> None:
        """Closes the key field without saving."""
        self.key_edit.clear()
        self.editor.setVisible(False)
        self.error.show_message("danger", "")

    def on_save_clicked(self) -> None:
        """Checks the key with the provider and stores it, in the background."""
        key, name, secrets = self.key_edit.text(), self.name, self.secrets
        self.save_button.setEnabled(False)
        self.key_edit.setEnabled(False)
        self.error.show_message("info", f"Checking the key with {name.label}…")
        CoroutineOperation(self, lambda _job: add_key(name, key, secrets), self._saved, group="key").failure(
            self._refused, KeyEntryError
        ).run()

    def _saved(self, state: KeyState) -> None:
        self.key = state
        self.key_edit.clear()
        self._editing_done()
        self.editor.setVisible(False)
        self.error.show_message("danger", "")
        self.show_answer(None, state, asking=True)
        self.sig_key_saved.emit(self.name)

    def _refused(self, exc: KeyEntryError) -> None:
        self._editing_done()
        self.error.show_message("danger", "The key was not saved", app_sentence(str(exc)))
        self.key_edit.setFocus()
        self.key_edit.selectAll()

    def _editing_done(self) -> None:
        self.save_button.setEnabled(True)
        self.key_edit.setEnabled(True)


class ProviderKeysPanel(QWidget):
    """The three providers, one :class:`ProviderKeyRow` each."""

    sig_key_saved = Signal(object)

    def __init__(self, secrets: SecretStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self.rows: dict[ProviderName, ProviderKeyRow] = {}
        for name in ProviderName:
            row = ProviderKeyRow(name, secrets)
            row.sig_key_saved.connect(self.sig_key_saved)
            layout.addWidget(row)
            self.rows[name] = row

    def show_asking(self, keys: dict[ProviderName, KeyState]) -> None:
        """Every provider with a key is being asked; the others say they have none."""
        for name, row in self.rows.items():
            key = keys.get(name)
            row.show_answer(None, key, asking=key is not None and key.present)

    def show_answer(self, answer: ProviderAnswer) -> None:
        """Shows one provider's answer as it arrives."""
        self.rows[answer.provider].show_answer(answer, None, asking=False)
