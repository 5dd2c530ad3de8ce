"""``python -m tests.mutants [NAME ...]`` (``make mutants``): breaks the money code on purpose, one change at a time,
and shows the tests catch each.

Each mutation is applied to a copy of the working tree in a temporary folder (tracked and untracked files, so
uncommitted work is mutated too); the tests that should catch it run there, and the copy is thrown away. The tree
itself is never modified. Prints mutation -> caught (the tests that failed) / survived; exit 1 when any survives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The soak's CI set: seeds and kill sweep (tests/soak/test_money_soak.py).
SOAK = "tests/soak/test_money_soak.py"
#: Serving from the rented machine after training, in process.
SERVING = "tests/runs/test_serving_rentals.py"


@dataclass(frozen=True)
class Change:
    """One text replaced in one file.

    Attributes:
        path: The file changed.
        original: The text replaced (it must occur exactly once).
        mutant: What replaces it.
    """

    path: str
    original: str
    mutant: str


@dataclass(frozen=True)
class Mutation:
    """A change to the money code, and the tests that must catch it.

    Attributes:
        name: What the change does.
        changes: The texts it replaces.
        tests: pytest arguments selecting the tests that should fail.
    """

    name: str
    changes: tuple[Change, ...]
    tests: tuple[str, ...]


NO_ENDED_RUN_SETTLE = Change(
    "desktop/services/renting/ending.py",
    "if m.state in UNSETTLED_STATES or left_running(m, ended)]",
    "if m.state in UNSETTLED_STATES]  # mutant: live rows of ended runs are left alone",
)
MUTATIONS = (
    Mutation(
        "never terminate",
        (
            Change(
                "desktop/services/renting/terminator.py",
                "            await client.terminate(instance_id)\n",
                "            pass  # mutant: the terminate request is never sent\n",
            ),
        ),
        (SOAK,),
    ),
    Mutation(
        "retry a create after a 5xx",
        (
            Change(
                "desktop/services/providers/http.py",
                "retried = ONCE_RETRIED_STATUSES if once else RETRIED_STATUSES",
                "retried = RETRIED_STATUSES  # mutant: a create is sent again after a 5xx",
            ),
        ),
        (SOAK, "tests/providers/test_vast.py", "tests/providers/test_runpod.py", "-k", "502 or 5xx or once or soak"),
    ),
    Mutation("skip the ended-run settle", (NO_ENDED_RUN_SETTLE,), ("tests/runs/test_ended_runs_settle.py",)),
    Mutation(
        "end the run before its machine is marked terminating, and skip the ended-run settle (before issue 41)",
        (
            NO_ENDED_RUN_SETTLE,
            Change(
                "desktop/services/renting/driver.py",
                "        end_rentals_first(self.ctx, self.ledger)",
                "        pass  # mutant: the run ends before its machine is marked terminating",
            ),
        ),
        (SOAK, "-k", "killed_after"),
    ),
    Mutation(
        "book a cluster's rows at $0",
        (
            Change(
                "desktop/services/billing/ledger.py",
                "None if price_per_hour is None else price_per_hour / len(rows),",
                "0.0 if grouped else None if price_per_hour is None else price_per_hour,  # mutant: a cluster is free",
            ),
        ),
        ("tests/runs/test_cluster_money.py", "-k", "not one_rental_per_machine"),
    ),
    Mutation(
        "drop the driver's own lost-machine end time",
        (
            Change(
                "desktop/services/renting/driver.py",
                "                self._lost_at[rental.instance_id] = instance.ended_at\n",
                "                pass  # mutant: the end the provider gave when the machine was lost is dropped\n",
            ),
        ),
        ("tests/runs/test_rental_money.py",),
    ),
    Mutation(
        "replace a machine lost while it serves",
        (
            Change(
                "desktop/services/renting/driver.py",
                'if record.spec.get("serve_started") and record.adapter:',
                "if False:  # mutant: a serving run's lost machine is replaced like a training one's",
            ),
        ),
        (SERVING, "-k", "lost"),
    ),
    Mutation(
        "let the training idle guard end serving",
        (
            Change(
                "desktop/services/renting/driver.py",
                "if record.state in PULL_STATES or record.state is RunState.SERVING:",
                "if record.state in PULL_STATES:  # mutant: serving counts as idle",
            ),
        ),
        (SERVING, "-k", "idle_guard"),
    ),
    Mutation(
        "fail a run whose serving hit the budget",
        (
            Change(
                "desktop/services/renting/driver.py",
                "if record.state is RunState.SERVING:  # trained and home",
                "if False:  # mutant: trained and home",
            ),
        ),
        (SERVING, "-k", "budget"),
    ),
    Mutation(
        "bring a freshly rented machine up twice",
        (
            Change(
                "desktop/services/renting/driver.py",
                "            record = self.ctx.store.get(run_id)  # renting pointed the run at its machine\n",
                "",
            ),
        ),
        (SERVING, "-k", "bills_while"),
    ),
    Mutation(
        "take a machine gone after its run ended for a lost one",
        (
            Change(
                "desktop/services/renting/driver.py",
                "if self.ctx.store.get(run_id).state in ENDED:  # gone after the run ended",
                "if False:  # mutant: gone after the run ended",
            ),
        ),
        ("tests/runs/test_rental_logic.py", "-k", "gone_after_its_run_ended"),
    ),
)


def tree_copy(into: Path) -> None:
    """Copies the working tree's tracked and untracked (not ignored) files into ``into``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def apply(mutation: Mutation, tree: Path) -> None:
    """Writes the mutant into the copy.

    Raises:
        SystemExit: An original text is not in its file exactly once (the code moved: update the mutation).
    """
    for change in mutation.changes:
        path = tree / change.path
        text = path.read_text()
        if text.count(change.original) != 1:
            raise SystemExit(f"mutation {mutation.name!r}: its original text is not in {change.path} exactly once")
        path.write_text(text.replace(change.original, change.mutant))


def failed_tests(mutation: Mutation, tree: Path) -> tuple[list[str], float]:
    """Runs the mutation's tests in the copy; the ids of those that failed, and the seconds it took."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", *mutation.tests, "-q", "-n", "0", "-p", "no:cacheprovider", "-rf"]
    started = time.monotonic()
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)
    if result.returncode not in (0, 1) and not failed:
        failed = [f"pytest exited {result.returncode}: {result.stdout[-300:]}{result.stderr[-300:]}"]
    return failed, time.monotonic() - started


def main() -> int:
    """Runs each mutation (or those named) and prints the table."""
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__)
    parser.add_argument("names", nargs="*", help="mutations to run (a part of the name; default: all)")
    wanted = parser.parse_args().names
    survived = 0
    rows = []
    for mutation in MUTATIONS:
        if wanted and not any(part in mutation.name for part in wanted):
            continue
        with tempfile.TemporaryDirectory(prefix="rentune-mutant-") as folder:
            tree = Path(folder)
            tree_copy(tree)
            apply(mutation, tree)
            failed, seconds = failed_tests(mutation, tree)
        survived += not failed
        more = f" and {len(failed) - 2} more" if len(failed) > 2 else ""
        verdict = f"caught by {', '.join(failed[:2])}{more}" if failed else "SURVIVED"
        rows.append(f"{mutation.name}: {verdict} ({seconds:.0f} s)")
        print(rows[-1], flush=True)
    print("\nmutation -> verdict")
    print("\n".join(rows))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
