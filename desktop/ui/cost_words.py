"""Money in words for people: the tray menu, the status bar, the Costs page and the notifications say it alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from desktop.core.runs.progress import format_duration
from desktop.core.runs.states import RunState
from desktop.services.billing.meter import BillingMachine, MeterReading
from desktop.services.billing.notices import Notice, NoticeKind
from desktop.services.billing.records import RunRow
from desktop.services.billing.spend import OWN_SERVER
from desktop.services.providers.base import ProviderName

#: The order providers are listed and coloured in (a provider keeps its chart colour).
PROVIDER_ORDER = (ProviderName.RUNPOD.value, ProviderName.VAST.value, ProviderName.LAMBDA.value, OWN_SERVER)


def money(usd: float) -> str:
    """Dollars to the cent: ``$1,234.56``."""
    return f"${usd:,.2f}"


def rate(usd_per_hour: float) -> str:
    """Dollars per hour: ``$0.69/h``."""
    return f"${usd_per_hour:,.2f}/h"


def provider_label(key: str) -> str:
    """A provider key as people know it: ``RunPod``, ``Vast.ai``, ``Lambda``, ``Your servers``."""
    if key == OWN_SERVER:
        return "Your servers"
    try:
        return ProviderName(key).label
    except ValueError:  # a provider this version does not know: show what was recorded
        return key


def provider_colour_index(key: str) -> int:
    """The chart colour of a provider (its place in :data:`PROVIDER_ORDER`; unknown ones share the last)."""
    return PROVIDER_ORDER.index(key) if key in PROVIDER_ORDER else len(PROVIDER_ORDER)


def tray_place() -> str:
    """Where the tray icon lives on this system, in its own words."""
    if sys.platform == "darwin":
        return "the menu bar"
    return "the notification area" if sys.platform.startswith("win") else "the system tray"


def short_run(run_id: str | None) -> str:
    """A run id as menus show it."""
    return f"run {run_id}" if run_id else "no run"


def machine_name(machine: BillingMachine) -> str:
    """What the machine is: ``RunPod RTX 4090`` or ``your server ssh://me@box:22``."""
    if not machine.rented:
        return f"your server {machine.gpu}"
    return f"{provider_label(machine.provider)} {machine.gpu}".strip()


def stop_action_text(machine: BillingMachine) -> str:
    """The menu action that stops a machine."""
    if machine.owned:
        return f"Stop {short_run(machine.run_id)} ({machine_name(machine)}, {rate(machine.rate_per_hour)})…"
    return f"Terminate {machine_name(machine)} ({rate(machine.rate_per_hour)}, no run uses it)…"


def spend_line(reading: MeterReading) -> str:
    """Today and this month: ``Today $1.20 · This month $45.00``."""
    overview = reading.overview
    return f"Today {money(overview.today_usd)} · This month {money(overview.month_usd)}"


def burn_line(reading: MeterReading) -> str:
    """What bills now: ``Billing $0.69/h now (1 machine)`` or ``Nothing is billing now``."""
    count = len(reading.machines)
    if not count:
        return "Nothing is billing now"
    return f"Billing {rate(reading.burn_per_hour)} now ({count} machine{'s' if count != 1 else ''})"


def _run_name(record: RunRow) -> str:
    model = str(record.spec.get("base_model") or "")
    return upper_first(short_run(record.id)) + (f" ({model})" if model else "")


def upper_first(text: str) -> str:
    """``text`` with its first letter in capitals (the rest as it is: ``RunPod`` stays ``RunPod``)."""
    return text[:1].upper() + text[1:]


def _live_line(record: RunRow, machine: BillingMachine | None) -> str:
    """What a live run does once Rentune has quit."""
    bills = f"{machine_name(machine)}, billing {rate(machine.rate_per_hour)}" if machine else ""
    if record.state is RunState.TRAINING:
        return f"{_run_name(record)} keeps training" + (f" on {bills}." if bills else ".")
    if record.state in (RunState.SYNCING, RunState.PULLING):
        then = "has finished training: its adapter comes home when Rentune opens again"
    else:
        then = f"is {record.state.value}: Rentune carries on with it when it opens again"
    return f"{_run_name(record)} {then}" + (f"; meanwhile {bills}." if bills else ".")


def keeps_running_lines(reading: MeterReading) -> list[str]:
    """What goes on after Rentune quits: each live run and each billing machine, with its rate."""
    machines_of = {machine.run_id: machine for machine in reading.machines if machine.owned}
    lines = [_live_line(record, machines_of.get(record.id)) for record in reading.live]
    live = {record.id for record in reading.live}
    for machine in reading.machines:
        if machine.owned and machine.run_id in live:
            continue
        if machine.owned:
            whose = f" of {short_run(machine.run_id)}"
            lines.append(f"{upper_first(machine_name(machine))}{whose} keeps billing {rate(machine.rate_per_hour)}.")
        else:
            lines.append(
                f"{upper_first(machine_name(machine))} keeps billing {rate(machine.rate_per_hour)}: no run uses it."
            )
    return lines


def quit_question(lines: Sequence[str]) -> tuple[str, str]:
    """The Quit question: a headline and the details (what keeps going, and what that means)."""
    details = "\n".join(f"• {line}" for line in lines)
    details += (
        "\n\nQuitting stops nothing: training goes on detached on the machines, and rented machines keep billing "
        "until their run ends and Rentune, open again, brings the adapter home and terminates them (or until you "
        "stop them). While Rentune is closed, budgets and the idle guard are not watched."
    )
    return "Quit Rentune while something still runs?", details


def _about(notice: Notice) -> str:
    """``Run 20261201-… (model)``: what a notice is about."""
    return upper_first(short_run(notice.run_id)) + (f" ({notice.model})" if notice.model else "")


def _budget_words(notice: Notice) -> tuple[str, str, str]:
    if notice.percent >= 100:
        text = f"{_about(notice)} has spent {money(notice.usd)}, its whole budget: Rentune stops it and brings its "
        return "Budget reached", text + "checkpoint home.", "danger"
    text = f"{_about(notice)} has spent {money(notice.usd)} of its {money(notice.budget_usd)} budget."
    return f"{notice.percent} % of the budget spent", text, "warning"


def _idle_words(notice: Notice) -> tuple[str, str, str]:
    if notice.guard_minutes:
        then = f" Rentune terminates its machine after {notice.guard_minutes:g} min without progress."
    else:
        then = " Open the run to see its log, or stop it."
    idle = format_duration(notice.minutes * 60)
    return "A machine is idle", f"{_about(notice)} bills but has trained nothing for {idle}.{then}", "warning"


def _orphans_words(notice: Notice) -> tuple[str, str, str]:
    what = (
        "1 rented machine that no run uses bills"
        if notice.count == 1
        else f"{notice.count} rented machines that no run uses bill"
    )
    return "Machines billing for nothing", f"{what} {rate(notice.usd)}. Stop them from the menu or Costs.", "danger"


def _finished_words(notice: Notice) -> tuple[str, str, str]:
    return "Fine-tune finished", f"{_about(notice)} is done: the adapter is on this computer.", "success"


def _failed_words(notice: Notice) -> tuple[str, str, str]:
    detail = f" {notice.detail}" if notice.detail else ""
    return "Fine-tune failed", f"{_about(notice)} failed.{detail}", "danger"


def _budget_stopped_words(notice: Notice) -> tuple[str, str, str]:
    text = f"{_about(notice)} reached its {money(notice.budget_usd)} budget and was stopped; its checkpoint is home."
    return "Stopped at its budget", text, "warning"


_NOTICE_WORDS = {
    NoticeKind.BUDGET: _budget_words,
    NoticeKind.IDLE: _idle_words,
    NoticeKind.ORPHANS: _orphans_words,
    NoticeKind.FINISHED: _finished_words,
    NoticeKind.FAILED: _failed_words,
    NoticeKind.BUDGET_STOPPED: _budget_stopped_words,
}


def notice_words(notice: Notice) -> tuple[str, str, str]:
    """A notice as (title, text, severity) for a notification."""
    return _NOTICE_WORDS[notice.kind](notice)
