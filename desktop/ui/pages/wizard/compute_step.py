"""The wizard's Compute step: rent a GPU from the live offers of every provider with a key, or use your own server.

Offers are asked in the background (the page never waits on the network) and judged against the run's own sizing,
so "fits", the time and the total are those of this run. The cheapest offer that fits is picked unless the user
picks another; the pick goes into the draft as ``[compute]``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.core.runs.draft import ComputeDraft, RunDraft
from desktop.core.sizing.plan import Fit
from desktop.services.providers.base import ProviderName
from desktop.services.providers.key_entry import KeyState, key_state
from desktop.services.runs.offers_for_draft import (
    DraftOffer,
    JudgedOffers,
    Market,
    OfferFilter,
    ProviderAnswer,
    ask_market,
    cheapest_fitting,
    judge_offers,
    offer_counts,
    offer_nodes,
    pick_of,
)
from desktop.ui.background import CoroutineOperation, Job, Operation, Running
from desktop.ui.context import AppContext
from desktop.ui.design.palette import METRICS
from desktop.ui.pages.wizard.compute_words import (
    NONE_FITS_NEXT,
    budget_words,
    compute_pick_words,
    none_fits_words,
    pick_words,
    remembered_pick_note,
)
from desktop.ui.pages.wizard.step_base import StepProblem, WizardStep
from desktop.ui.widgets.blocks import Banner, Card, caption, heading, plain_button, set_role
from desktop.ui.widgets.number_fields import CorrectionNote
from desktop.ui.widgets.offers_table import KIND_COLUMN, MAX_ROWS, OffersTable
from desktop.ui.widgets.own_server_form import OwnServerForm
from desktop.ui.widgets.provider_keys import ProviderKeysPanel

#: The headline when offers were judged and none fits the run.
NONE_FITS = "No machine offered fits this run"
#: Offers older than this are asked again when the step is entered.
MARKET_MAX_AGE_S = 300.0
_KINDS = (("On-demand", False), ("Spot", True), ("On-demand and spot", None))

_Fetched = tuple[dict[ProviderName, KeyState], Market, JudgedOffers, str]


def sizing_key(draft: RunDraft) -> str:
    """What judging the offers depends on; they are judged again only when it changes."""
    return json.dumps([draft.base_model, draft.method, draft.training, draft.train_file], sort_keys=True, default=str)


class ComputeStep(WizardStep):
    """Where the run trains: a rented GPU picked from live offers, or the user's own server over SSH."""

    step_name = "compute"
    title = "Compute"
    purpose = (
        "Where the run trains: a GPU rented for it (terminated the moment your adapter is home), or a server of "
        "your own."
    )

    def __init__(self, context: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(context, parent)
        self.market: Market | None = None
        self.judged: JudgedOffers | None = None
        self.keys: dict[ProviderName, KeyState] = {}
        self.pick: DraftOffer | None = None
        self.pick_note = ""  # what became of a pick remembered from before (gone, repriced, too small)
        self._fetched_at = 0.0
        self._market_counts: tuple[tuple[int | None, ...], int] = ((), 1)  # the GPU counts and machines asked for
        self._judged_for = ""
        self._work: Running[Any] | None = None
        self._asked = 0
        self._renting = True
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 8, 0)
        layout.setSpacing(12)
        layout.addLayout(self._build_choice())
        self.rent_panel = self._build_rent_panel()
        self.own_form = OwnServerForm()
        self.own_form.sig_changed.connect(self.sig_changed)
        layout.addWidget(self.rent_panel)
        layout.addWidget(self.own_form)
        layout.addWidget(self._build_budget())
        layout.addStretch(1)
        self.body.addWidget(content, 1)  # in the step's own scroll area, which scrolls a problem's place into view
        self._show_mode(True)

    # -- building ----------------------------------------------------------------------------------------------------

    def _build_choice(self) -> QHBoxLayout:
        self.rent_button = QPushButton("Rent a &GPU")
        self.rent_button.setAccessibleName("Rent a GPU from a cloud provider")
        self.own_button = QPushButton("Your own &server")
        self.own_button.setAccessibleName("Train on your own server over SSH")
        row = QHBoxLayout()
        row.setSpacing(0)
        # Two checkable buttons kept exclusive by hand: in a QButtonGroup, Tab would skip the unchecked one.
        for button in (self.rent_button, self.own_button):
            button.setCheckable(True)
            row.addWidget(button)
        row.addStretch(1)
        self.rent_button.setChecked(True)
        self.rent_button.clicked.connect(lambda _checked=False: self.choose(renting=True))
        self.own_button.clicked.connect(lambda _checked=False: self.choose(renting=False))
        return row

    def _build_rent_panel(self) -> QWidget:
        panel = QWidget()
        layout = QVBoxLayout(panel)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(12)
        providers = Card("Providers")
        self.keys_panel = ProviderKeysPanel(self.context.secrets)
        self.keys_panel.sig_key_saved.connect(self.on_key_saved)
        providers.body.addWidget(self.keys_panel)
        layout.addWidget(providers)
        layout.addWidget(self._build_offers())
        layout.addWidget(self._build_pick())
        return panel

    def _build_offers(self) -> Card:
        card = Card("Offers")
        self.refresh_button = plain_button("R&efresh", "refresh-cw", "Ask the providers for offers again")
        self.refresh_button.clicked.connect(self.on_refresh_clicked)
        card.add_header_widget(self.refresh_button)
        card.body.addLayout(self._build_filters())
        self.price_note = CorrectionNote()
        self.price_note.watch(self.price_spin, "Max price")
        card.body.addWidget(self.price_note)
        status = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Asking the providers")
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.status_label = caption()
        self.status_label.setAccessibleName("Offers status")
        status.addWidget(self.progress)
        status.addWidget(self.status_label, 1)
        card.body.addLayout(status)
        self.offers_banner = Banner("warning")  # why the offers are as they are (the step's banner is for Next)
        self.offers_banner.setObjectName("offers_problem")
        card.body.addWidget(self.offers_banner)
        self.offers = OffersTable()
        self.offers.sig_picked.connect(self.on_offer_picked)
        card.body.addWidget(self.offers)
        self.empty = QWidget()
        empty_layout = QVBoxLayout(self.empty)
        empty_layout.setContentsMargins(16, 24, 16, 24)
        self.empty_title = heading("")
        self.empty_title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_text = caption()
        self.empty_text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        empty_layout.addWidget(self.empty_title)
        empty_layout.addWidget(self.empty_text)
        card.body.addWidget(self.empty)
        self.shown_label = caption()
        card.body.addWidget(self.shown_label)
        return card

    def _build_filters(self) -> QHBoxLayout:
        self.provider_combo = QComboBox()
        self.provider_combo.setAccessibleName("Show offers of")
        self.provider_combo.addItem("All providers", None)
        for name in ProviderName:
            self.provider_combo.addItem(name.label, name.value)
        self.kind_combo = QComboBox()
        self.kind_combo.setAccessibleName("Kind of machine")
        for words, spot in _KINDS:
            self.kind_combo.addItem(words, spot)
        self.price_spin = QDoubleSpinBox()
        self.price_spin.setRange(0.0, 500.0)
        self.price_spin.setSingleStep(0.1)
        self.price_spin.setPrefix("$ ")
        self.price_spin.setSuffix(" per hour")
        self.price_spin.setSpecialValueText("Any price")
        self.price_spin.setAccessibleName("Highest price per hour (the machine is never rented above it)")
        self.fits_check = QCheckBox("Fits &only")
        self.fits_check.setAccessibleName("Only machines the run fits on")
        row = QHBoxLayout()
        for text, widget in (("Pro&vider", self.provider_combo), ("K&ind", self.kind_combo)):
            row.addWidget(self._buddy(text, widget))
            row.addWidget(widget)
        row.addWidget(self._buddy("Ma&x price", self.price_spin))
        row.addWidget(self.price_spin)
        row.addWidget(self.fits_check)
        row.addStretch(1)
        self.provider_combo.currentIndexChanged.connect(self.on_filter_changed)
        self.kind_combo.currentIndexChanged.connect(self.on_filter_changed)
        self.price_spin.valueChanged.connect(self.on_filter_changed)
        self.fits_check.toggled.connect(self.on_filter_changed)
        return row

    @staticmethod
    def _buddy(text: str, widget: QWidget) -> QLabel:
        label = QLabel(text)
        label.setBuddy(widget)
        return label

    def _build_pick(self) -> Card:
        card = Card("Your pick")
        self.pick_label = QLabel()
        self.pick_label.setWordWrap(True)
        self.pick_label.setAccessibleName("The machine picked")
        self.pick_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        card.body.addWidget(self.pick_label)
        self.machine_toggle = plain_button("&Machine settings…", "settings", "Show the machine settings (advanced)")
        self.machine_toggle.setCheckable(True)
        self.machine_toggle.toggled.connect(self.on_machine_toggled)
        toggle_row = QHBoxLayout()
        toggle_row.addWidget(self.machine_toggle)
        toggle_row.addStretch(1)
        card.body.addLayout(toggle_row)
        self.machine_box = QWidget()
        form = QFormLayout(self.machine_box)
        form.setContentsMargins(0, 0, 0, 0)
        self.python_edit = self._line("Python interpreter on the machine", "python3 (the provider's image)")
        self.user_edit = self._line("Login user on the machine", "the provider's usual one (root or ubuntu)")
        self.image_edit = self._line("Container image", "a PyTorch image the provider runs")
        form.addRow("Python", self.python_edit)
        form.addRow("Login user", self.user_edit)
        form.addRow("Container image", self.image_edit)
        self.machine_box.setVisible(False)
        card.body.addWidget(self.machine_box)
        return card

    def _line(self, accessible: str, placeholder: str) -> QLineEdit:
        edit = QLineEdit()
        edit.setAccessibleName(accessible)
        edit.setPlaceholderText(placeholder)
        edit.textEdited.connect(lambda _text: self.sig_changed.emit())
        return edit

    def _build_budget(self) -> Card:
        card = Card("Budget")
        row = QHBoxLayout()
        self.budget_spin = QDoubleSpinBox()
        self.budget_spin.setRange(0.0, 100_000.0)
        self.budget_spin.setDecimals(2)
        self.budget_spin.setSingleStep(5.0)
        self.budget_spin.setPrefix("$ ")
        self.budget_spin.setSpecialValueText("No limit")
        self.budget_spin.setAccessibleName("Budget in US dollars: the run is stopped before it costs more")
        self.budget_spin.valueChanged.connect(self.on_budget_changed)
        row.addWidget(self._buddy("Bu&dget", self.budget_spin))
        row.addWidget(self.budget_spin)
        row.addStretch(1)
        card.body.addLayout(row)
        self.budget_note = CorrectionNote()
        self.budget_note.watch(self.budget_spin, "Budget")
        card.body.addWidget(self.budget_note)
        self.budget_label = caption()
        self.budget_label.setAccessibleName("What the budget means")
        card.body.addWidget(self.budget_label)
        self.budget_banner = Banner("warning")
        card.body.addWidget(self.budget_banner)
        return card

    # -- the wizard's hooks -------------------------------------------------------------------------------------------

    @property
    def renting(self) -> bool:
        """Whether the user chose to rent (else: the own server)."""
        return self._renting

    def show_draft(self) -> None:
        """Fills the step from the draft; when renting, asks for offers unless fresh ones are shown."""
        draft = self.draft
        self._show_mode(draft.renting)
        self.own_form.show_target(draft.target, draft.hourly_rate_usd)
        for edit, value in (
            (self.python_edit, draft.compute.python),
            (self.user_edit, draft.compute.user),
            (self.image_edit, draft.compute.image),
        ):
            edit.setText(value)
        self.budget_spin.blockSignals(True)
        self.budget_spin.setValue(draft.budget_usd)
        self.budget_spin.blockSignals(False)
        self._show_pick()
        if draft.renting:
            self._ensure_offers()

    def step_problem(self) -> StepProblem | None:
        """Renting needs a picked offer; the own server a tested connection (and a rate for a budget).

        When no offer fits the run, picking is no way out: the problem says why and sends the user to the Model step.
        """
        if not self.renting:
            problem = self.own_form.validate()
            if problem is None and self.budget_spin.value() > 0 and self.own_form.hourly_rate() <= 0:
                problem = "Enter your server's hourly rate, so the budget can be kept; or set the budget to No limit."
            return StepProblem(problem) if problem else None
        if self.pick is not None:
            return None
        if self.fetching:
            return StepProblem("Wait a moment: the offers are still coming in. Then pick one.")
        if not any(state.present for state in self.keys.values()):
            return StepProblem("Add a provider's API key to see its offers, then pick one; or choose Your own server.")
        if self.none_fits:
            return StepProblem(NONE_FITS, NONE_FITS_NEXT, step="model", setting="method", action="Change the model")
        return StepProblem("Pick an offer in the table (widen the filters if none is shown).")

    def show_problem(self, problem: StepProblem | None, *, focus: bool = True) -> None:
        """When nothing fits, also scrolls the offers' own reason to the top (the table under it says how close)."""
        super().show_problem(problem, focus=focus)
        if problem is not None and problem.headline == NONE_FITS:
            self._scroll_to_the_offers()

    def _scroll_to_the_offers(self) -> None:
        """Scrolls "Asked at…", the offers' reason and the table under it to the top of the step."""
        outer, content = self.layout(), self.scroll_area.widget()
        if outer is None or content is None:
            return
        outer.activate()  # the banner above just took room: scroll within the viewport as it is now
        top = self.status_label.mapTo(content, QPoint(0, 0)).y()
        self.scroll_area.verticalScrollBar().setValue(top - METRICS.gap // 2)

    def save_into(self, draft: RunDraft) -> None:
        """Copies the choice, the server, the pick with its machine settings, and the budget into ``draft``."""
        draft.renting = self.renting
        draft.target = self.own_form.target_draft()
        draft.hourly_rate_usd = self.own_form.hourly_rate()
        draft.budget_usd = float(self.budget_spin.value())
        machine = draft.compute.model_copy(
            update={
                "python": self.python_edit.text().strip(),
                "user": self.user_edit.text().strip(),
                "image": self.image_edit.text().strip(),
            }
        )
        if self.pick is not None:
            machine = pick_of(self.pick, machine, float(self.price_spin.value()))
        elif self.judged is not None:  # offers were shown and none is picked: an older pick is gone
            machine = ComputeDraft(python=machine.python, user=machine.user, image=machine.image)
        draft.compute = machine

    async def load(self) -> None:
        """Asks for offers when the window opens on this step (a reopened wizard, a screenshot)."""
        if self.draft.step == self.step_name and self.draft.renting:
            if not self.fetching:
                self._start_fetch()
            await self.wait_for_offers()

    async def wait_for_offers(self) -> None:
        """Waits until the offers asked for now are shown (or the asking was cancelled)."""
        while self._work is not None and self._work.active:
            await self._work.wait()

    # -- mode ------------------------------------------------------------------------------------------------------

    def choose(self, *, renting: bool) -> None:
        """Switches between renting and the own server (a click on the chosen one keeps it chosen)."""
        changed = renting != self._renting
        self._show_mode(renting)
        if not changed:
            return
        if renting:
            self._ensure_offers()
        self._show_budget()
        self.sig_changed.emit()

    def _show_mode(self, renting: bool) -> None:
        self._renting = renting
        self.rent_button.setChecked(renting)
        self.own_button.setChecked(not renting)
        self.rent_panel.setVisible(renting)
        self.own_form.setVisible(not renting)
        for button in (self.rent_button, self.own_button):
            set_role(button, "primary" if button.isChecked() else "")

    # -- asking for offers ---------------------------------------------------------------------------------------

    @property
    def fetching(self) -> bool:
        """Whether offers are being asked or judged now."""
        return self._work is not None and self._work.active

    def _ensure_offers(self) -> None:
        if self.fetching:
            return
        stale = self.market is None or time.monotonic() - self._fetched_at > MARKET_MAX_AGE_S
        if stale or self._market_counts != (offer_counts(self.draft), offer_nodes(self.draft)):
            self._start_fetch()
        elif self._judged_for != sizing_key(self.draft):
            self._start_judge()
        else:
            self._show_offers()

    def on_refresh_clicked(self) -> None:
        """Asks every provider again."""
        self._start_fetch()

    def on_key_saved(self, _name: ProviderName) -> None:
        """A new key: ask again, so its provider's offers appear."""
        self._start_fetch()

    def _start_fetch(self) -> Running[_Fetched]:
        snapshot, secrets, store = self.draft.model_copy(deep=True), self.context.secrets, self.context.store
        counts, nodes = offer_counts(snapshot), offer_nodes(snapshot)

        async def work(job: Job) -> _Fetched:
            keys = await asyncio.to_thread(lambda: {name: key_state(name, secrets) for name in ProviderName})
            job.report(keys)
            market = await ask_market(secrets, counts, nodes=nodes, on_answer=job.report)
            judged = await asyncio.to_thread(judge_offers, snapshot, market.offers, secrets, store)
            return keys, market, judged, sizing_key(snapshot)

        self._market_counts = (counts, nodes)
        self._busy("Asking the providers for offers…")
        running = CoroutineOperation(self, work, self._show_fetched, group="offers")
        self._work = running.with_progress(self._on_fetch_progress).failure(self._on_failed).run()
        return self._work

    def _start_judge(self) -> None:
        snapshot, secrets, store = self.draft.model_copy(deep=True), self.context.secrets, self.context.store
        offers = list(self.market.offers) if self.market else []
        self._busy("Judging the offers for this run…")

        def work(_job: Job) -> tuple[JudgedOffers, str]:
            return judge_offers(snapshot, offers, secrets, store), sizing_key(snapshot)

        running = Operation(self, work, self._show_judged, group="offers").failure(self._on_failed)
        self._work = running.run()

    def _busy(self, words: str) -> None:
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self.refresh_button.setEnabled(False)
        self.status_label.setText(words)

    def _on_fetch_progress(self, value: dict[ProviderName, KeyState] | ProviderAnswer) -> None:
        if isinstance(value, ProviderAnswer):
            self.keys_panel.show_answer(value)
            self.progress.setValue(self.progress.value() + 1)
            self.status_label.setText(f"{self.progress.value()} of {self._asked} providers answered…")
            return
        self.keys = value
        self.keys_panel.show_asking(value)
        self._asked = sum(state.present for state in value.values())
        self.progress.setRange(0, max(1, self._asked))
        self.progress.setValue(0)
        self.status_label.setText(f"Asking {self._asked} provider{'s' if self._asked != 1 else ''} for offers…")

    def _show_fetched(self, fetched: _Fetched) -> None:
        self.keys, self.market, judged, judged_for = fetched
        self._fetched_at = time.monotonic()
        for answer in self.market.answers:
            self.keys_panel.show_answer(answer)
        self._show_judged((judged, judged_for))

    def _show_judged(self, result: tuple[JudgedOffers, str]) -> None:
        self._work = None  # delivered: its task ends right after this
        self.judged, self._judged_for = result
        self._idle()
        self._show_offers()
        if self._judged_for != sizing_key(self.draft):  # the run changed while the offers were judged
            self._start_judge()

    def _on_failed(self, exc: Exception) -> None:
        self._work = None
        self._idle()
        self.status_label.setText(f"The offers could not be shown: {exc}. Press Refresh to try again.")

    def _idle(self) -> None:
        self.progress.setVisible(False)
        self.refresh_button.setEnabled(True)
        if self.market is not None:
            answered = sum(1 for answer in self.market.answers if answer.count)
            stamp = time.strftime("%H:%M")
            self.status_label.setText(
                f"Asked at {stamp}: {len(self.market.offers):,} offers from {answered} provider"
                f"{'s' if answered != 1 else ''}."
            )

    # -- showing offers ------------------------------------------------------------------------------------------

    def offer_filter(self) -> OfferFilter:
        """The filters as set."""
        price = float(self.price_spin.value())
        provider = self.provider_combo.currentData()
        return OfferFilter(
            provider=ProviderName(provider) if provider else None,
            spot=self.kind_combo.currentData(),
            max_price_per_hour=price if price > 0 else None,
            fits_only=self.fits_check.isChecked(),
        )

    def visible_offers(self) -> list[DraftOffer]:
        """The judged offers the filters let through, best first."""
        if self.judged is None:
            return []
        admits = self.offer_filter().admits
        return [item for item in self.judged.offers if admits(item)]

    def _show_offers(self) -> None:
        items = self.visible_offers()
        self.offers.show_offers(items)
        one_kind = self.kind_combo.currentData() is not None  # every row would say the same: room for the place
        self.offers.table.setColumnHidden(KIND_COLUMN, one_kind)
        judged = self.judged.offers if self.judged else []
        problem = self.judged.problem if self.judged else None
        none_fits = self.none_fits
        if problem:
            headline = "The offers cannot be judged for this run"
            details = f"{problem} Meanwhile the offers are listed by price, without fit or totals."
        elif none_fits:
            headline, details = NONE_FITS, none_fits_words(judged)
        else:
            headline, details = "", ""
        self.offers_banner.show_message("warning", headline, details)
        self._show_empty(items)
        shown = min(len(items), MAX_ROWS)
        order = "by price: none fits" if none_fits or problem else "best first"
        self.shown_label.setText(f"Showing {shown:,} of {len(judged):,} offers, {order}." if judged else "")
        self._select_pick(items)

    @property
    def none_fits(self) -> bool:
        """Whether offers were judged for this run and not one of them fits it (whatever the filters show)."""
        if self.judged is None or self.judged.problem:
            return False
        return bool(self.judged.offers) and not any(item.fits for item in self.judged.offers)

    def _select_pick(self, items: list[DraftOffer]) -> None:
        """Keeps the user's pick; a pick remembered from before is kept only while the job fits it.

        A remembered pick that is gone, no longer fits or changed its price is said in the pick's line, never
        replaced silently.
        """
        chosen_now = self.pick is not None
        remembered = self._draft_pick_key() if not chosen_now else None
        found = self.offers.select(self.pick.key if self.pick else remembered)
        self.pick_note = ""
        if remembered is not None:
            self.pick_note = remembered_pick_note(self.draft.compute, found)
        if found is not None and not chosen_now and found.fit is Fit.NO:
            found = None  # the job changed since: it would fail there, so it is not picked for the user
        if found is None:
            found = cheapest_fitting(items)
            self.offers.select(found.key if found else None)
        self._set_pick(found)

    def _draft_pick_key(self) -> tuple[str, str, bool] | None:
        compute = self.draft.compute
        return (compute.provider, compute.offer_id, compute.spot) if compute.picked else None

    def _show_empty(self, items: list[DraftOffer]) -> None:
        self.offers.setVisible(bool(items))
        self.empty.setVisible(not items)
        if items:
            return
        if not any(state.present for state in self.keys.values()):
            title = "Add an API key to see offers"
            text = "Add a key above: Rentune then lists each provider's machines, judged for this run."
        elif self.judged is not None and self.judged.offers:
            title, text = "No offer passes the filters", "Widen the filters above to see more machines."
        else:
            title, text = "No offers to show", "No provider answered with machines in stock. Press Refresh later."
        self.empty_title.setText(title)
        self.empty_text.setText(text)
        self.empty.setAccessibleName(title)

    def on_filter_changed(self) -> None:
        """Shows the offers the filters let through (the pick moves only when it is filtered out)."""
        if self.judged is not None:
            self._show_offers()
        self.sig_changed.emit()

    def on_offer_picked(self, item: DraftOffer | None) -> None:
        """The user picked a row."""
        self._set_pick(item)

    def _set_pick(self, item: DraftOffer | None) -> None:
        changed = (item.key if item else None) != (self.pick.key if self.pick else None)
        self.pick = item
        self._show_pick()
        if changed:
            self.sig_changed.emit()

    def _show_pick(self) -> None:
        if self.pick is not None:
            self.pick_label.setText(" ".join(filter(None, [self.pick_note, pick_words(self.pick)])))
        elif self.judged is None and self.draft.compute.picked:
            self.pick_label.setText(f"Picked earlier: {compute_pick_words(self.draft.compute)}. Checking the offers…")
        elif self.none_fits:
            self.pick_label.setText("Nothing picked: no machine offered fits this run (why and what to change: above).")
        else:
            self.pick_label.setText("Nothing picked yet: pick a row in the table.")
        self._show_budget()

    # -- machine settings and budget -----------------------------------------------------------------------------

    def on_machine_toggled(self, shown: bool) -> None:
        """Shows or hides the machine settings."""
        self.machine_box.setVisible(shown)

    def on_budget_changed(self, _value: float) -> None:
        """Says what the budget means for the estimate."""
        self._show_budget()
        self.sig_changed.emit()

    def _show_budget(self) -> None:
        budget = float(self.budget_spin.value())
        total = self.pick.total_usd if self.renting and self.pick else None
        words, severity = budget_words(budget, total)
        if not self.renting and budget > 0:
            words += " The cost is metered at your server's hourly rate (above)."
        warning = severity == "warning"
        self.budget_label.setText("" if warning else words)
        self.budget_label.setVisible(not warning)
        self.budget_banner.show_message("warning", words if warning else "")
