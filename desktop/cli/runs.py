"""``rentune run|runs|status|logs|stop|pull|resume``: the run commands, on the run engine."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from desktop.cli.errors import EXIT_FAILED, CliError
from desktop.core.runs.bill_phases import BillSplit
from desktop.core.runs.spec import RunSpec, RunSpecError, SshTarget, parse_ssh_url
from desktop.core.runs.states import LIVE, TERMINAL, RunState
from desktop.core.settings import Settings, SettingsError
from desktop.core.units import memory_text
from desktop.services.billing.ledger import Ledger
from desktop.services.billing.rentals import compute_of, rental_of
from desktop.services.machines.ssh import HostKeyChangedError, RemoteError
from desktop.services.platform.logs import redact_known
from desktop.services.platform.secrets import SecretStoreError
from desktop.services.platform.settings import load_settings
from desktop.services.providers.base import ProviderError, ProviderName
from desktop.services.renting.driver import RentalDriver
from desktop.services.renting.ending import end_rentals_first
from desktop.services.runs.actions import resume_refusal
from desktop.services.runs.bill import run_bill_split
from desktop.services.runs.engine import EngineOptions, RunEngine, RunError
from desktop.services.runs.estimates import run_money
from desktop.services.runs.events import describe_event, mirrored_events
from desktop.services.runs.remote_export import check_before_renting
from desktop.services.runs.spec_file import read_run_spec
from desktop.services.runs.store import RunRecord, UnknownRunError
from trainer_payload.protocol import EVENTS_FILE_NAME

_T = TypeVar("_T")
#: How long ``rentune stop`` waits for another process following the run to save the checkpoint and end it.
STOP_WAIT_SECONDS = 900


def _stamp(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else "-"


def _spawn_detached(command: list[str], log: Path) -> None:
    """Starts a process that outlives this one, in its own session, output to ``log``."""
    if hasattr(os, "posix_spawn"):
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        os.posix_spawn(command[0], command, dict(os.environ), file_actions=actions, setsid=True)
        return
    flags = getattr(subprocess, "DETACHED_PROCESS", 0) | getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
    with log.open("ab") as handle:
        subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, creationflags=flags
        )


_MACHINE_PROBLEMS: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "refuses SSH connections (nothing listens on its SSH port)"),
    (TimeoutError, "did not answer in time"),
    (socket.gaierror, "has a host name that could not be found"),
    (asyncssh.PermissionDenied, "refused the login"),
)


def _machine_problem(exc: BaseException) -> str:
    """Why the machine could not be used, as the end of a sentence (no exception class names where words exist)."""
    words = next((text for kind, text in _MACHINE_PROBLEMS if isinstance(exc, kind)), None)
    if words is not None:
        return words
    if isinstance(exc, asyncssh.Error):
        return f"closed the SSH connection ({exc.reason})"
    if isinstance(exc, OSError):
        return f"cannot be reached ({exc.strerror or exc or type(exc).__name__})"
    return f"failed a command ({exc})"


def _print(line: str) -> None:
    print(redact_known(line), flush=True)  # the engine's reports: every known secret masked


async def ask_in_terminal(run_id: str, words: str) -> bool:
    """Asks on the terminal whether run ``run_id`` goes on although it overruns; True for yes."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()

    def give(line: str) -> None:
        if not answer.done():  # no answer in time: the question was given up already
            answer.set_result(line)

    def read() -> None:  # a daemon thread: an unanswered question never keeps the process from ending
        loop.call_soon_threadsafe(give, sys.stdin.readline())

    print(f"\nrun {run_id}: {words}.", flush=True)
    print("Go on with this run? [y/N] (it waits paused, at most 10 minutes): ", end="", flush=True)
    threading.Thread(target=read, daemon=True).start()
    return (await answer).strip().lower() in {"y", "yes"}


def _engine_options() -> EngineOptions:
    """The engine's options with the user's settings (as the app uses them); defaults when the file is unusable."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"warning: {exc}; using the default settings", file=sys.stderr, flush=True)
        settings = Settings()
    return EngineOptions().with_settings(settings)


class RunsCommands:
    """Implements the run subcommands; ``error`` is the CLI's one-line error type."""

    def __init__(self, error: type[CliError]) -> None:
        self.error = error
        self.engine = RunEngine(options=_engine_options(), report=_print)

    def _record(self, run_id: str) -> RunRecord:
        try:
            return self.engine.store.get(run_id)
        except UnknownRunError as exc:
            raise self.error(str(exc)) from exc

    def _load_spec(self, path: Path) -> RunSpec:
        try:
            spec = read_run_spec(path)
        except RunSpecError as exc:
            raise self.error(str(exc)) from exc
        identity = spec.target.identity if spec.target else None
        if identity is not None and not identity.is_file():
            raise self.error(f"{path}: [target] identity {identity} is not a file; give your private key file")
        return spec

    def _target(self, args: argparse.Namespace, base: SshTarget | None) -> SshTarget | None:
        if not (args.target or args.identity or args.python):
            return base
        url = args.target or (base.url if base else None)
        if url is None:
            raise self.error("--identity/--python need a target: add --target ssh://user@host:port")
        try:
            user, host, port = parse_ssh_url(url)
        except RunSpecError as exc:
            raise self.error(str(exc)) from exc
        identity = args.identity.expanduser().resolve() if args.identity else (base.identity if base else None)
        if args.identity and not args.identity.expanduser().is_file():
            raise self.error(f"--identity {args.identity} is not a file; pass your private key file (not the .pub)")
        python = args.python or (base.python if base else "python3")
        same_machine = base is not None and not args.target
        return SshTarget(
            user,
            host,
            port,
            identity,
            python,
            base.workdir if base else None,
            base.authorized_keys if base else None,
            base.host_key if base and same_machine else None,  # the pin holds while the machine stays the same
        )

    def _on_machine(self, coroutine: Coroutine[Any, Any, _T], record: RunRecord, doing: str) -> _T:
        """Runs an engine coroutine that talks to the run's machine; a failure becomes one line and exit code 1.

        Args:
            coroutine: The engine call.
            record: The run (for its id and machine in the message).
            doing: What the command does, for the message ("stop", "pull a checkpoint of").
        """
        try:
            return asyncio.run(coroutine)
        except (RunError, HostKeyChangedError) as exc:
            raise self.error(f"cannot {doing} run {record.id}: {exc}", EXIT_FAILED) from exc
        except (OSError, asyncssh.Error, RemoteError) as exc:
            raise self.error(
                f"cannot {doing} run {record.id}: its machine {record.target} {_machine_problem(exc)}; check that "
                "the machine is running and reachable, then try again",
                EXIT_FAILED,
            ) from exc

    def _drive(self, coroutine: Coroutine[Any, Any, RunRecord], run_id: str) -> int:
        try:
            record = self._on_machine(coroutine, self.engine.store.get(run_id), "follow")
        except KeyboardInterrupt:
            print(f"\ndetached: {_left_running(self.engine.store.get(run_id))}", flush=True)
            rental = rental_of(self.engine.store.get(run_id))
            if rental is not None:
                print(
                    f"the rented {rental.provider.label} machine keeps billing ${rental.price_per_hour:.2f}/h until "
                    f"the run ends under rentune resume {run_id}, or rentune stop {run_id}",
                    flush=True,
                )
            return 130
        print(f"run {record.id}: {record.state.value}" + (f" ({record.error})" if record.error else ""))
        return 0 if record.state is RunState.FINISHED else 1

    def _rented(self, run_id: str) -> bool:
        return compute_of(self.engine.store.get(run_id)) is not None

    def _driver(self) -> RentalDriver:
        return RentalDriver(self.engine)

    def _follow(self, run_id: str) -> int:
        """Follows a run to its end: a rented run through the rental driver (it terminates the machine)."""
        if not self._rented(run_id):
            return self._drive(self.engine.drive(run_id), run_id)
        try:
            return self._drive(self._driver().drive(run_id), run_id)
        except ProviderError as exc:
            raise self.error(f"run {run_id}: {exc}", EXIT_FAILED) from exc

    def _warn_orphans(self) -> None:
        """Warns (on stderr) of machines at the user's providers that no live run owns, and what they burn."""
        from desktop.services.renting.orphans import orphan_warning

        try:
            warning = asyncio.run(orphan_warning(self.engine.store, self.engine.secrets))
        except (ProviderError, SecretStoreError):
            return
        if warning:
            print(warning, file=sys.stderr, flush=True)

    def run(self, args: argparse.Namespace) -> int:
        """``rentune run SPEC.toml``."""
        spec = self._load_spec(args.spec)
        self._warn_orphans()
        target = self._target(args, spec.target)
        compute = None if target is not None else spec.compute  # --target trains on that machine instead of renting
        spec = RunSpec(**{**spec.__dict__, "target": target, "compute": compute})
        try:
            asyncio.run(check_before_renting(spec, lambda text, _fraction: print(text, flush=True)))
            record = self.engine.create(spec)
        except RunError as exc:
            raise self.error(str(exc)) from exc
        asking = sys.stdin.isatty() and not args.detach
        policy = args.on_overrun or ("ask" if asking else "stop")
        self.engine.ctx.set_spec(record.id, on_overrun=policy)  # any process that drives the run keeps to it
        self.engine.ctx.ask_overrun = ask_in_terminal if asking else None
        if args.detach:
            log = self.engine.folder(record.id) / "engine.log"
            _spawn_detached([sys.executable, "-m", "desktop", "resume", record.id], log)
            print(f"run {record.id} started in the background (log: {log}); rentune status {record.id}")
            return 0
        return self._follow(record.id)

    def resume(self, args: argparse.Namespace) -> int:
        """``rentune resume RUN [--target ...]``."""
        record = self._record(args.run_id)
        refusal = resume_refusal(record)
        if record.state in TERMINAL and refusal is not None:  # a run stopped by the user goes on, as in the app
            print(f"run {record.id} is already {record.state.value}: {refusal}")
            return 0 if record.state is RunState.FINISHED else 1
        targets: list[str] = args.target or []
        if self.engine.store.nodes_of(record.id):
            self._move_machines(record, args, targets)
        elif len(targets) > 1:
            raise self.error(f"run {record.id} trains on one machine: give one --target")
        elif targets or args.identity or args.python:
            args.target = targets[0] if targets else None
            base = None
            if record.target:
                user, host, port = parse_ssh_url(record.target)
                spec = record.spec
                base = SshTarget(
                    user,
                    host,
                    port,
                    None,
                    spec.get("python", "python3"),
                    spec.get("workdir"),
                    spec.get("authorized_keys"),
                )
            target = self._target(args, base)
            assert target is not None
            if rental_of(record) is not None:  # moving to the user's machine: the rented one goes first
                self._release(record.id, f"the run moves to {target.url}")
            self.engine.retarget(record.id, target)
            self.engine.store.update(record.id, spec={**self.engine.store.get(record.id).spec, "compute": None})
        try:
            self.engine.prepare_resume(record.id)
        except RunError as exc:
            raise self.error(str(exc)) from exc
        return self._follow(record.id)

    def _move_machines(self, record: RunRecord, args: argparse.Namespace, targets: list[str]) -> None:
        """``resume`` of a run across several machines: onto a fresh set when ``--target`` names one per machine."""
        if not targets:
            return  # the same machines
        spec = record.spec
        python, workdir, authorized = spec.get("python", "python3"), spec.get("workdir"), spec.get("authorized_keys")
        base = SshTarget("", "", 22, None, python, workdir, authorized)
        moved = []
        for url in targets:
            args.target = url
            target = self._target(args, base)
            assert target is not None
            moved.append(target)
        try:
            self.engine.retarget_nodes(record.id, moved)
        except RunError as exc:
            raise self.error(str(exc)) from exc

    def stop(self, args: argparse.Namespace) -> int:
        """``rentune stop RUN``: exit code 0 only when the run has ended (cancelled, or finished meanwhile)."""
        record = self._record(args.run_id)
        if record.state in TERMINAL:
            print(f"run {record.id} is already {record.state.value}; nothing to stop")
            return 0
        if self._rented(record.id):  # its machine is marked terminating before the run is cancelled
            end_rentals_first(self.engine.ctx, Ledger())
        final = self._on_machine(self.engine.stop(record.id), record, "stop")
        if final.state in LIVE:  # another process follows the run: it pulls the checkpoint and ends it
            final = self._wait_for_end(final)
        if final.state in TERMINAL and self._rented(final.id):
            self._release(final.id, f"the run was stopped ({final.state.value})")
        print(f"run {final.id}: {final.state.value}" + (f" ({final.error})" if final.error else ""))
        if final.state not in TERMINAL:
            raise self.error(
                f"run {final.id} is {final.state.value}, not stopped; the trainer may still run: try rentune stop "
                f"{final.id} again, and if the machine is gone, stop it at your provider",
                EXIT_FAILED,
            )
        return 0

    def _release(self, run_id: str, why: str) -> None:
        """Terminates a rented run's machine now (the process that followed the run may have done so already)."""

        async def release() -> None:
            driver = self._driver()
            try:
                await driver.release(run_id, why)
            finally:
                await driver.aclose()

        try:
            asyncio.run(release())
        except ProviderError as exc:
            raise self.error(
                f"run {run_id} is stopped but its machine could not be terminated: {exc}; run rentune machines "
                "--stop-orphans, or stop it in the provider's console",
                EXIT_FAILED,
            ) from exc

    def _wait_for_end(self, record: RunRecord) -> RunRecord:
        """Waits while the process following the run saves the checkpoint and ends it (Ctrl-C stops waiting)."""
        print(f"waiting for the process following run {record.id} to end it (Ctrl-C stops waiting)", flush=True)
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        with contextlib.suppress(KeyboardInterrupt):  # the stop was sent; the state printed next says where it is
            while record.state in LIVE and time.monotonic() < deadline:
                time.sleep(0.5)
                record = self.engine.store.get(record.id)
        return record

    def pull(self, args: argparse.Namespace) -> int:
        """``rentune pull RUN``."""
        record = self._record(args.run_id)
        folder = self._on_machine(self.engine.pull(record.id), record, "pull a checkpoint of")
        print(f"newest checkpoint on this computer: {folder}" if folder else "no checkpoint written yet")
        return 0

    def list(self, args: argparse.Namespace) -> int:
        """``rentune runs``."""
        records = self.engine.store.all()
        rows = [
            {"id": r.id, "state": r.state.value, "target": r.target, "started": _stamp(r.started), "adapter": r.adapter}
            for r in records
        ]
        if args.json:
            ledger = Ledger()
            for row, record in zip(rows, records, strict=True):
                row.update(self._money(ledger, record))
            print(json.dumps(rows, indent=2, default=str))
            return 0
        if not rows:
            print("no runs yet; start one with rentune run SPEC.toml")
        for row in rows:
            print(f"{row['id']:<24}{row['state']:<14}{row['started']:<27}{row['target'] or '-'}")
        return 0

    def _money(self, ledger: Ledger, record: RunRecord) -> dict[str, Any]:
        """The run's renting: what it asked for, its machines, predicted and measured, paid idle."""
        transitions = self.engine.store.transitions(record.id)
        money = run_money(record, transitions, ledger.rentals(record.id), self.engine.folder(record.id))
        return {"compute": record.spec.get("compute"), **money}

    def status(self, args: argparse.Namespace) -> int:
        """``rentune status RUN``."""
        record = self._record(args.run_id)
        history = self.engine.store.transitions(record.id)
        events = mirrored_events(self.engine.folder(record.id))
        others = self.engine.store.nodes_of(record.id)
        bill = run_bill_split(self.engine.store, record.id)
        if args.json:
            print(
                json.dumps(
                    {
                        "id": record.id,
                        "state": record.state.value,
                        "target": record.target,
                        "fingerprint": record.fingerprint,
                        "adapter": record.adapter,
                        "error": record.error,
                        "relaunches": record.relaunches,
                        "transitions": history,
                        "last_event": events[-1] if events else None,
                        "nodes": [_node_dict(node) for node in others],
                        **self._money(Ledger(), record),
                        "bill": bill.as_dict() if bill else None,
                        "serving": record.spec.get("serving"),
                        "served": record.spec.get("served"),
                    },
                    indent=2,
                    default=str,
                )
            )
            return 0
        print(f"run {record.id}: {record.state.value} on {record.target} (host key {record.fingerprint or '-'})")
        for node in others:
            rank, pinned = _node_dict(node)["rank"], node.fingerprint or "-"
            print(f"  node {rank}: {node.state.value} on {node.target} (host key {pinned})")
        for step in history:
            print(
                f"  {_stamp(step['ts'])}  {step['from_state'] or '':<13} -> {step['to_state']:<13} {step['note'] or ''}"
            )
        for event in events[-5:]:
            print("  " + describe_event(event))
        for line in [*money_lines(self._money(Ledger(), record)), *bill_lines(bill)]:
            print("  " + line)
        serving = record.spec.get("serving") or {}
        if record.state is RunState.SERVING and serving.get("url"):
            idle = (record.spec.get("serve") or {}).get("idle_minutes", 0)
            count = int(serving.get("requests", 0))
            print(
                f"  serving {serving.get('model')} at {serving['url']} ({count} request{'' if count == 1 else 's'} so "
                f"far; it stops after {idle:g} min without one, or with rentune stop {record.id})"
            )
        if record.error:
            print(f"  problem: {record.error}")
        return 0

    def logs(self, args: argparse.Namespace) -> int:
        """``rentune logs RUN [-f]``: the mirrored event stream."""
        record = self._record(args.run_id)
        if args.payload:
            print(self._on_machine(self.engine.payload_log(record.id), record, "read the trainer's log of"), end="")
            return 0
        path = self.engine.folder(record.id) / EVENTS_FILE_NAME
        shown = 0
        while True:
            events = mirrored_events(self.engine.folder(record.id)) if path.exists() else []
            for event in events[shown:]:
                print(describe_event(event), flush=True)
            shown = len(events)
            if not args.follow or self.engine.store.get(record.id).state in TERMINAL:
                return 0
            try:
                time.sleep(1)
            except KeyboardInterrupt:
                return 0


def _left_running(record: RunRecord) -> str:
    """What goes on on the machine after a detach, and how to come back to it."""
    if record.state is RunState.SERVING:
        idle = (record.spec.get("serve") or {}).get("idle_minutes", 0)
        return (
            f"the machine still serves, but its address here is gone; serving ends after {idle:g} min without a "
            f"request. rentune resume {record.id} forwards the address again"
        )
    return f"training goes on on the machine; rentune resume {record.id} reattaches"


def _provider_label(value: str) -> str:
    try:
        return ProviderName(value).label
    except ValueError:
        return value


def money_lines(money: dict[str, Any]) -> list[str]:
    """The rented machines, the prediction beside the measurement, and the paid idle, in words."""
    lines = [
        f"machine {_provider_label(m['provider'])} {m['instance_id']} ({m['gpu']}, ${m['price_per_hour']:.2f}/h) "
        f"{_stamp(m['started'])} to {_stamp(m['stopped']) if m['stopped'] else 'now (billing)'}"
        for m in money["machines"]
    ]
    predicted, measured = money["predicted"], money["measured"]
    if predicted:
        lines.append(
            f"predicted: {predicted['tokens_per_s']:,.0f} tokens/s, {predicted['hours']:.2f} h, "
            f"${predicted['usd']:.2f}, peak {memory_text(predicted['peak_gb'])} per GPU"
        )
    if measured["tokens_per_s"] or measured["usd"] is not None:
        speed = f"{measured['tokens_per_s']:,.0f} tokens/s" if measured["tokens_per_s"] else "no steps yet"
        cost = f", {measured['hours']:.2f} h rented, ${measured['usd']:.2f}" if measured["usd"] is not None else ""
        lines.append(f"measured: {speed}{cost}")
    idle = money["paid_idle"]
    if idle["create_to_first_step_s"] is not None:
        after = idle["adapter_to_terminate_s"]
        tail = f", adapter to terminate {after:.0f} s" if after is not None else ""
        lines.append(f"paid idle: machine created to first step {idle['create_to_first_step_s']:.0f} s{tail}")
    return lines


def bill_lines(bill: BillSplit | None) -> list[str]:
    """A rented run's bill by phase in one line, its paid idle and its effective training hour in another."""
    if bill is None or bill.usd <= 0:
        return []
    spent = ", ".join(f"{c.phase.value} ${c.usd:.2f}" for c in bill.phases if c.seconds > 0)
    hour = bill.effective_usd_per_training_hour
    effective = f"; an hour of training cost ${hour:.2f}" if hour is not None else ""
    idle = f"paid while nothing trained: ${bill.idle_usd:.2f} ({100 * bill.idle_usd / bill.usd:.0f} %){effective}"
    return [f"bill ${bill.usd:.2f}: {spent}", idle]


def _commands() -> RunsCommands:
    return RunsCommands(CliError)


def run_run(args: argparse.Namespace) -> int:
    """``rentune run SPEC``: trains a spec on an SSH machine and brings the adapter home."""
    return _commands().run(args)


def run_runs(args: argparse.Namespace) -> int:
    """``rentune runs``: lists the runs."""
    return _commands().list(args)


def run_status(args: argparse.Namespace) -> int:
    """``rentune status RUN``: a run's state, history and last events."""
    return _commands().status(args)


def run_logs(args: argparse.Namespace) -> int:
    """``rentune logs RUN``: a run's events, or the trainer's own log."""
    return _commands().logs(args)


def run_stop(args: argparse.Namespace) -> int:
    """``rentune stop RUN``: saves a checkpoint, stops training, cancels the run."""
    return _commands().stop(args)


def run_pull(args: argparse.Namespace) -> int:
    """``rentune pull RUN``: brings the newest checkpoint home now."""
    return _commands().pull(args)


def _node_dict(node: RunRecord) -> dict[str, Any]:
    """One more machine of a run across several, for ``status``."""
    rank = (node.spec.get("cluster") or {}).get("node_rank")
    return {"id": node.id, "rank": rank, "state": node.state.value, "target": node.target, "pid": node.pid}


def run_resume(args: argparse.Namespace) -> int:
    """``rentune resume RUN``: continues a run, on its machine or another one."""
    return _commands().resume(args)
