"""The main window drives real services: the environment check and the keyring through the settings page."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QAbstractButton, QAbstractScrollArea, QApplication, QLabel, QWidget
from pytestqt.qtbot import QtBot

from desktop.core.runs.states import RunState
from desktop.core.settings import Settings, Theme
from desktop.services.platform.secrets import SecretName, SecretStore
from desktop.services.platform.settings import load_settings
from desktop.ui.design.icons import IconTint
from desktop.ui.design.palette import DARK
from desktop.ui.main_window import MainWindow, UnknownPageError
from desktop.ui.pages.home_page import FLOW_STEPS
from desktop.ui.pages.settings_page import SettingsPage
from desktop.ui.status import IDLE_TEXT, running_summary
from desktop.ui.theme import apply_theme, current_palette
from desktop.ui.widgets.blocks import install_wheel_guard
from tests.fixtures.memory_keyring import MemoryKeyring
from tests.fixtures.qt_input import wheel

KEY = "rk_live_" + "Q1w2E3r4T5y6U7i8"


@pytest.fixture
def window(qtbot: QtBot, qloop: asyncio.AbstractEventLoop) -> MainWindow:
    win = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    qloop.run_until_complete(win.load_pages())
    return win


def test_window_opens_on_home_with_the_environment_report(window: MainWindow) -> None:
    home = window.page("home")
    assert window.stack.currentWidget() is home
    assert home.environment_table.rowCount() >= 5
    assert home.environment_summary.text().startswith("Ready")
    assert window.page_names() == [
        "home",
        "new",
        "runs",
        "models",
        "chat",
        "costs",
        "settings",
        "monitor",
        "data",
        "model",
        "sizing",
        "compute",
        "review",
    ]


def test_home_describes_only_what_the_app_does_today(window: MainWindow) -> None:
    """Every promise of the home page's flow is a page a new user can open."""
    text = " ".join(f"{step} {detail}" for step, detail in FLOW_STEPS)
    promises = {"RunPod": "compute", "own server": "compute", "GGUF": "models", "MLX": "models", "chat": "chat"}
    for words, page in promises.items():
        if words in text:
            assert page in window.page_names(), f"the home page promises {words}, but there is no {page} page"


def test_sidebar_switches_pages_with_the_keyboard(window: MainWindow, qtbot: QtBot) -> None:
    window.sidebar.setFocus()
    with qtbot.waitSignal(window.sig_page_changed) as changed:
        qtbot.keyClick(window.sidebar, Qt.Key.Key_Down)
    assert changed.args == ["new"]
    assert window.stack.currentWidget() is window.page("new")


def test_unknown_page_lists_the_real_ones(window: MainWindow) -> None:
    with pytest.raises(UnknownPageError, match="choose one of: home, new, runs, models, chat, costs, settings"):
        window.show_page("offers")


def test_settings_offer_the_cloud_keys_the_hub_token_and_the_wandb_key(window: MainWindow) -> None:
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    assert list(page.key_inputs) == [
        SecretName.RUNPOD,
        SecretName.VAST,
        SecretName.LAMBDA,
        SecretName.HUGGINGFACE,
        SecretName.WANDB,
        SecretName.BUCKET_KEY_ID,
        SecretName.BUCKET_SECRET,
    ]


def test_api_key_saved_from_the_settings_page_lands_in_the_keyring(
    window: MainWindow, qtbot: QtBot, wait_for: Callable[..., None], memory_keyring: MemoryKeyring
) -> None:
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    assert page.key_status[SecretName.HUGGINGFACE].text() == "Not set"
    qtbot.keyClicks(page.key_inputs[SecretName.HUGGINGFACE], KEY)
    page.on_store_key_clicked(SecretName.HUGGINGFACE)
    wait_for(lambda: page.key_status[SecretName.HUGGINGFACE].text() == "Stored in the keyring")
    assert memory_keyring.passwords[("rentune", "huggingface")] == KEY
    assert page.key_inputs[SecretName.HUGGINGFACE].text() == "", "the field is cleared once the key is stored"
    page.on_remove_key_clicked(SecretName.HUGGINGFACE)
    wait_for(lambda: page.key_status[SecretName.HUGGINGFACE].text() == "Not set")
    assert memory_keyring.passwords == {}


def test_the_settings_page_shows_a_key_stored_elsewhere_when_it_shows_again(
    window: MainWindow, wait_for: Callable[..., None], memory_keyring: MemoryKeyring
) -> None:
    """A key added on the Compute step appears on Settings the next time it shows; Remove only for keyring keys."""
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    wait_for(lambda: page.key_status[SecretName.RUNPOD].text() == "Not set")
    assert not page.remove_buttons[SecretName.RUNPOD].isEnabled()
    window.show_page("home")
    SecretStore().set(SecretName.RUNPOD, KEY)  # as the Compute step's inline "Add key" does
    window.show_page("settings")
    wait_for(lambda: page.key_status[SecretName.RUNPOD].text() == "Stored in the keyring")
    assert page.remove_buttons[SecretName.RUNPOD].isEnabled()


def test_a_malformed_key_in_the_environment_shows_as_unusable_with_the_fix(
    window: MainWindow, wait_for: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", "vast key")
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    badge = page.key_status[SecretName.VAST]
    wait_for(lambda: badge.text() == "VAST_API_KEY cannot be used")
    assert "with a space inside; set it to the key alone" in badge.toolTip()


def test_a_cloud_key_is_checked_with_its_provider_before_it_is_stored(
    window: MainWindow,
    qtbot: QtBot,
    wait_for: Callable[..., None],
    memory_keyring: MemoryKeyring,
    fake_vast: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RENTUNE_VAST_URL", fake_vast.serve() + "/api/v0")
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    qtbot.keyClicks(page.key_inputs[SecretName.VAST], "a-wrong-key")
    page.on_store_key_clicked(SecretName.VAST)
    wait_for(lambda: page.keys_message.text().startswith("Not saved"))
    assert "refused" in page.keys_message.text() and memory_keyring.passwords == {}
    page.key_inputs[SecretName.VAST].clear()
    qtbot.keyClicks(page.key_inputs[SecretName.VAST], fake_vast.valid_key)
    page.on_store_key_clicked(SecretName.VAST)
    wait_for(lambda: page.key_status[SecretName.VAST].text() == "Stored in the keyring")
    assert memory_keyring.passwords == {("rentune", "vast"): fake_vast.valid_key}
    assert page.keys_message.text() == "Vast.ai API key saved in the keyring (checked with Vast.ai)."


def _key_answer(page: SettingsPage, qtbot: QtBot, wait_for: Callable[..., None], key: str) -> str:
    """Types ``key`` for Vast.ai, saves it, and returns what the page says once the check ended."""
    page.key_inputs[SecretName.VAST].clear()
    qtbot.keyClicks(page.key_inputs[SecretName.VAST], key)
    page.on_store_key_clicked(SecretName.VAST)
    wait_for(lambda: page.keys_message.text().startswith("Not saved"), timeout=30)
    return page.keys_message.text()


def test_a_refused_key_in_settings_says_who_refused_it_and_what_to_do_there(
    window: MainWindow,
    qtbot: QtBot,
    wait_for: Callable[..., None],
    memory_keyring: MemoryKeyring,
    fake_vast: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said to "store a valid one in the app's Settings" to a user in Settings, and quoted a terminal command."""
    monkeypatch.setenv("RENTUNE_VAST_URL", fake_vast.serve() + "/api/v0")
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    said = _key_answer(page, qtbot, wait_for, "a-wrong-key")
    assert "Vast.ai refused this key" in said and "https://cloud.vast.ai/account/" in said, said
    assert "Settings" not in said and "rentune keys" not in said, f"no page the user is on, no command: {said}"
    assert memory_keyring.passwords == {}


def test_a_key_check_that_goes_wrong_says_what_in_words_without_an_http_path(
    window: MainWindow,
    qtbot: QtBot,
    wait_for: Callable[..., None],
    memory_keyring: MemoryKeyring,
    fake_vast: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said "could not read the account: GET /api/v0/users/current/" when the address led elsewhere."""
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    root = fake_vast.serve()
    monkeypatch.setenv("RENTUNE_VAST_URL", root)  # the fake's root, not its API under /api/v0: every route is 404
    said = _key_answer(page, qtbot, wait_for, fake_vast.valid_key)
    for raw in ("/users/current", "GET ", "no route", "HTTP"):
        assert raw not in said, f"no raw request in the message ({raw!r}): {said}"
    assert "Vast.ai" in said and "did not recognise" in said, f"who and what went wrong: {said}"
    assert f"RENTUNE_VAST_URL ({root})" in said, f"the fix: the address the user set: {said}"
    monkeypatch.setenv("RENTUNE_VAST_URL", "http://127.0.0.1:9/api/v0")  # nothing listens there
    said = _key_answer(page, qtbot, wait_for, fake_vast.valid_key)
    assert said.startswith("Not saved: Rentune could not reach Vast.ai to check the key."), said
    assert "RENTUNE_VAST_URL (http://127.0.0.1:9/api/v0)" in said and "internet connection" in said, said
    assert memory_keyring.passwords == {}


def test_saving_preferences_writes_the_settings_file(window: MainWindow, wait_for: Callable[..., None]) -> None:
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    page.theme_combo.setCurrentIndex(page.theme_combo.findData(Theme.DARK))
    followed = window.context.manager.engine("a-run-followed-now")
    page.keep_spin.setValue(7)
    page.save_button.click()
    wait_for(lambda: page.preferences_status.text().startswith("Saved"))
    assert load_settings().theme is Theme.DARK
    assert load_settings().keep_local_checkpoints == 7
    assert followed.options.keep_local_checkpoints == 7, "runs followed now keep that many checkpoints"
    assert window.context.manager.engine("a-later-run").options.keep_local_checkpoints == 7


def test_choosing_a_theme_applies_and_keeps_it_at_once_without_saving_other_edits(
    window: MainWindow, qtbot: QtBot, wait_for: Callable[..., None]
) -> None:
    """The theme changed only on Save preferences; other settings pages apply a theme when it is chosen."""
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    window.show_page("settings")
    apply_theme(Theme.LIGHT)
    try:
        page.keep_spin.setValue(9)  # edited, not saved: choosing a theme must not save it along
        page.theme_combo.setFocus()
        for _ in range(page.theme_combo.count()):  # System, Light, Dark: as a user steps through the choices
            if page.theme_combo.currentData() != Theme.DARK:
                qtbot.keyClick(page.theme_combo, Qt.Key.Key_Down)
        assert page.theme_combo.currentData() == Theme.DARK
        assert current_palette().is_dark, "the theme applies on the choice, before any Save"
        # the file is written on a worker and the words follow on the UI thread: wait for the words, then read the file
        wait_for(lambda: page.preferences_status.text() == "Dark theme applied and kept.")
        assert load_settings().theme is Theme.DARK
        assert load_settings().keep_local_checkpoints == Settings().keep_local_checkpoints, "only the theme is kept"
        qtbot.keyClick(page.theme_combo, Qt.Key.Key_Up)
        assert not current_palette().is_dark
        wait_for(lambda: load_settings().theme is Theme.LIGHT)
    finally:
        apply_theme(Theme.LIGHT)


def test_empty_key_shows_a_readable_message(window: MainWindow, wait_for: Callable[..., None]) -> None:
    page = window.page("settings")
    assert isinstance(page, SettingsPage)
    page.on_store_key_clicked(SecretName.HUGGINGFACE)
    wait_for(lambda: "empty" in page.keys_message.text())


def test_the_monitor_and_the_status_bar_show_the_same_dollars_at_the_same_moment(
    window: MainWindow, qloop: asyncio.AbstractEventLoop
) -> None:
    store = window.context.store
    record = store.create({"hourly_rate_usd": 3600.0}, "ssh://me@box:22")  # $1 per second: cents move fast
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.TRAINING)
    window.on_run_opened(record.id)
    monitor = window.monitor
    for _ in range(3):
        qloop.run_until_complete(monitor.refresh())
        qloop.run_until_complete(window.cost_tracker.meter.refresh(again=True).wait())
        time.sleep(0.3)  # both move on: the run's own reading is newer than the meter's now
        qloop.run_until_complete(monitor.refresh())
        reading = window.cost_tracker.meter.latest
        assert reading is not None
        said = window.status_label.text().rsplit(" · ", 1)[1].removesuffix(" so far")
        assert monitor.machine["cost"].text() == said, "the monitor's dollars are the status bar's, cent for cent"


def test_status_bar_says_what_is_running_and_what_it_costs(window: MainWindow, wait_for: Callable[..., None]) -> None:
    assert running_summary(window.context) == IDLE_TEXT
    store = window.context.store
    record = store.create({"hourly_rate_usd": 3600.0}, "ssh://me@box:22")  # $1 per second: visible at once
    store.transition(record.id, RunState.CONNECTING)
    store.transition(record.id, RunState.TRAINING)
    time.sleep(0.05)
    line = running_summary(window.context)
    said = "Running: training on your server ssh://me@box:22 at $3,600.00/h · $"
    assert line.startswith(said) and line.endswith(" so far")
    window.cost_tracker.meter.refresh(again=True)  # the line follows the cost meter's reading, off the UI thread
    wait_for(lambda: window.status_label.text().startswith(said))


def test_a_long_status_line_is_shortened_at_1024_px_not_widening_the_window(window: MainWindow, qtbot: QtBot) -> None:
    window.resize(1024, 700)
    long_line = "Reattached to 3 live run(s); their checkpoints keep coming home. " * 4
    window.status_label.setText(long_line)
    qtbot.waitUntil(lambda: window.status_label.toolTip() == long_line)  # set when painted shortened
    assert window.width() == 1024 and window.status_label.is_elided()
    assert window.status_label.text() == long_line, "only the painting is shortened"
    window.status_label.setText("Ready.")
    qtbot.waitUntil(lambda: window.status_label.toolTip() == "")
    assert not window.status_label.is_elided()


def test_the_app_follows_runs_with_the_checkpoints_kept_setting(qtbot: QtBot) -> None:
    win = MainWindow(Settings(keep_local_checkpoints=2), SecretStore())
    qtbot.addWidget(win)
    assert win.context.manager.engine("a-run").options.keep_local_checkpoints == 2


def test_the_settings_page_offers_no_option_that_nothing_uses(window: MainWindow) -> None:
    page = window.page("settings")
    names = [widget.accessibleName() for widget in page.findChildren(QWidget)]
    assert not [name for name in names if "rented machines" in name], "cloud API keys never go to a machine yet"


def test_the_page_catalog_matches_the_pages_built(window: MainWindow) -> None:
    """The sidebar and --page names come from the catalog without importing the pages: it must say what they are."""
    import sys

    from desktop.ui.pages.catalog import PAGES, WIZARD_STEPS

    assert [step.step_name for step in window.wizard.steps] == list(WIZARD_STEPS)
    for entry in PAGES:
        page = window.page(entry.name)
        assert page.page_name == entry.name
        assert entry.module in sys.modules
    sidebar = [window.sidebar.item(row).text() for row in range(window.sidebar.count())]
    assert sidebar == [entry.label for entry in PAGES if entry.in_sidebar]


def test_only_the_home_page_is_built_before_the_window_first_shows(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    win = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(win)
    assert [win.stack.widget(index).page_name for index in range(win.stack.count())] == ["home"]  # type: ignore[attr-defined]
    qloop.run_until_complete(win.load_pages(follow_runs=False))
    assert win.stack.count() == len(win.page_names()) - len(win.wizard.steps)


def test_sidebar_rows_are_tall_enough_for_their_padding(qtbot: QtBot) -> None:
    """Rows measured before the stylesheet would overlap: each must be taller than its text with the padding."""
    apply_theme(Theme.LIGHT)  # as the app does before it builds the window
    win = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    text = win.sidebar.fontMetrics().height()
    heights = [win.sidebar.visualItemRect(win.sidebar.item(row)).height() for row in range(win.sidebar.count())]
    assert min(heights) >= text + 16


def test_with_the_update_check_on_a_newer_release_is_said_in_the_status_bar(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None], tmp_path: Any, monkeypatch: Any
) -> None:
    from tests.fakes.releases import FakeReleases

    releases = FakeReleases(tmp_path / "releases", latest="v99.0.0")
    monkeypatch.setenv("RENTUNE_RELEASES_URL", releases.serve() + "/repos/rentune/rentune/releases/latest")
    try:
        quiet = MainWindow(Settings(), SecretStore())  # off by default: nobody is asked
        qtbot.addWidget(quiet)
        qloop.run_until_complete(quiet.load_pages())
        assert releases.requests == []
        win = MainWindow(Settings(check_for_updates=True), SecretStore())
        qtbot.addWidget(win)
        qloop.run_until_complete(win.load_pages())
        wait_for(lambda: win.status_label.text().startswith("Rentune 99.0.0 is available (you have "), 15)
        assert len(releases.requests) == 1
    finally:
        releases.close()


def test_install_local_tools_from_the_chat_runs_on_the_models_page(
    window: MainWindow, wait_for: Callable[..., None], monkeypatch: Any, tmp_path: Any
) -> None:
    from PySide6.QtWidgets import QPushButton

    from desktop.services.local import tools
    from desktop.services.local.toolenv import PYTHON_ENV
    from tests.fixtures.exported_models import write_gguf

    monkeypatch.setattr(tools, "importable", lambda module: module != "llama_cpp")
    monkeypatch.setenv(PYTHON_ENV, "/no/such/python3")  # the install starts, and stops at once here
    window.show_page("chat")
    chat = window.page("chat")
    chat.open_model(str(write_gguf(tmp_path / "model-Q4_K_M.gguf")))  # type: ignore[attr-defined]
    assert chat.needs_card.isVisibleTo(chat), "chat needs llama.cpp: the install is offered"  # type: ignore[attr-defined]
    buttons = chat.needs_panel.findChildren(QPushButton)  # type: ignore[attr-defined]
    next(b for b in buttons if b.text() == "&Install local tools").click()
    models = window.page("models")
    assert window.stack.currentWidget() is models
    wait_for(lambda: models.banner.headline_label.text() == "Installing the local tools did not finish.", 60)  # type: ignore[attr-defined]


def test_the_wheel_scrolls_every_page_list_and_table_that_overflows(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    app = QApplication.instance()
    assert app is not None
    guard = install_wheel_guard(app)  # as the app does at start
    try:
        win = MainWindow(Settings(), SecretStore())
        qtbot.addWidget(win)
        win.resize(1024, 700)
        win.show()
        qtbot.waitExposed(win)
        qloop.run_until_complete(win.load_pages())
        scrolled = []
        for name in win.page_names():
            win.show_page(name)
            QApplication.processEvents()
            for area in win.page(name).findChildren(QAbstractScrollArea):
                bar = area.verticalScrollBar()
                if not area.isVisible() or bar.maximum() == 0:
                    continue
                bar.setValue(0)
                wheel(area.viewport(), -2)
                assert bar.value() > 0, f"the wheel scrolls {type(area).__name__} on {name}"
                scrolled.append(f"{name}: {type(area).__name__}")
        assert len(scrolled) >= 3, scrolled
    finally:
        app.removeEventFilter(guard)


def _ink(image: QImage) -> QColor:
    """The mean colour of an icon's drawn (opaque) pixels."""
    drawn = [image.pixelColor(x, y) for x in range(image.width()) for y in range(image.height())]
    drawn = [c for c in drawn if c.alpha() > 200]
    assert drawn, "the icon draws something"
    return QColor(*(round(sum(getattr(c, part)() for c in drawn) / len(drawn)) for part in ("red", "green", "blue")))


def _contrast(one: QColor, other: QColor) -> float:
    def luminance(c: QColor) -> float:
        parts = [v / 255 for v in (c.red(), c.green(), c.blue())]
        linear = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in parts]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(one), luminance(other)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_dark_chosen_in_settings_redraws_every_icon_for_the_dark_window(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, wait_for: Callable[..., None]
) -> None:
    apply_theme(Theme.LIGHT)  # as the app starts for a user whose saved theme is light
    win = MainWindow(Settings(), SecretStore())
    qtbot.addWidget(win)
    win.show()
    qtbot.waitExposed(win)
    qloop.run_until_complete(win.load_pages())
    page = win.page("settings")
    assert isinstance(page, SettingsPage)
    page.theme_combo.setCurrentIndex(page.theme_combo.findData(Theme.DARK))
    try:
        page.save_button.click()
        wait_for(lambda: current_palette() is DARK)
        rows = [win.sidebar.item(row) for row in range(win.sidebar.count())]
        drawn = {f"sidebar {item.text()}": item.icon() for item in rows}
        on_accent = {}  # primary buttons: the icon sits on the accent colour
        for button in win.findChildren(QAbstractButton):
            if not button.icon().isNull():
                name = f"button {button.text() or button.accessibleName()}"
                (on_accent if button.property("role") == "primary" else drawn)[name] = button.icon()
        images = {name: icon_.pixmap(18, 18).toImage() for name, icon_ in drawn.items()}
        for label in win.findChildren(QLabel):
            if label.findChild(IconTint) is not None:
                images[f"picture beside {label.parentWidget().accessibleName() or label.parentWidget()}"] = (
                    label.pixmap().toImage()
                )
        ratios = {name: _contrast(_ink(image), QColor(DARK.window)) for name, image in images.items()}
        accent = QColor(DARK.accent)
        ratios |= {name: _contrast(_ink(i.pixmap(18, 18).toImage()), accent) for name, i in on_accent.items()}
        faint = {name: round(ratio, 1) for name, ratio in ratios.items() if ratio < 3}
        assert len(images) > 20 and on_accent and not faint, f"icons hard to see in the dark: {faint}"
    finally:
        apply_theme(Theme.LIGHT)


def test_a_run_over_its_estimate_is_asked_about_in_the_app_and_stop_is_the_safe_answer(
    window: MainWindow, qtbot: QtBot, qloop: asyncio.AbstractEventLoop
) -> None:
    from tests.runs.test_overrun import twice_as_slow

    slower = twice_as_slow()
    words = f"measured in the first steps: {slower.words()}"
    assert window.context.manager.ask_overrun == window.ask_overrun  # every run the app follows asks here

    def answer(button: str) -> None:
        dialog = window.overrun_dialog
        assert dialog is not None and dialog.isVisible()
        assert "+120 % against the estimate of $2.50" in " ".join(label.text() for label in dialog.findChildren(QLabel))
        getattr(dialog, button).click()

    QTimer.singleShot(100, lambda: answer("action_button"))
    assert qloop.run_until_complete(window.ask_overrun("20261205-020000-abcd", words)) is True
    assert window.cost_tracker.said[-1][0] == "A run is over its estimate"
    QTimer.singleShot(100, lambda: qtbot.keyClick(window.overrun_dialog, Qt.Key.Key_Return))  # Enter: the safe answer
    assert qloop.run_until_complete(window.ask_overrun("20261205-020000-abcd", words)) is False
