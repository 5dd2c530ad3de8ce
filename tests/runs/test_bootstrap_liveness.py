"""Whether the bootstrap still runs, asked of a real process while it execs its new environment's Python.

A process's command line reads empty for a moment while it execs. The bootstrap execs once (into the environment
it just created), and a run that asked at that moment was failed as "the bootstrap ended without a result".
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from desktop.services.runs.launch import _bootstrap_running

#: Execs itself over and over, its argv naming the bootstrap, then exits; a stand-in for the bootstrap's exec.
_EXEC_LOOP = """
import os, sys
left = int(sys.argv[-1])
if left:
    os.execv(sys.executable, [sys.executable, __file__, "trainer_payload", "bootstrap", str(left - 1)])
"""


class ShellMachine:
    """Runs commands in a local shell, as sshd would on the machine."""

    host_key = ""

    async def run(self, command: str, *, stdin: str | None = None, check: bool = True, time_limit: float = 300) -> str:
        """The command's stdout."""
        process = await asyncio.create_subprocess_shell(command, stdout=subprocess.PIPE)
        out, _ = await process.communicate()
        return out.decode()


def test_a_bootstrap_caught_in_its_exec_counts_as_running(tmp_path: Path) -> None:
    script = tmp_path / "exec_loop.py"
    script.write_text(_EXEC_LOOP)
    process = subprocess.Popen([sys.executable, str(script), "trainer_payload", "bootstrap", "400"])

    async def ask_while_it_execs() -> list[bool]:
        answers = []
        while process.poll() is None and len(answers) < 60:
            answers.append(await _bootstrap_running(ShellMachine(), process.pid))
        return answers

    try:
        answers = asyncio.run(ask_while_it_execs())
    finally:
        process.kill()
        process.wait()
    assert len(answers) >= 10
    assert all(answers[:-1])  # the last may be asked as it exits


def test_a_finished_or_foreign_process_is_not_the_bootstrap() -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not asyncio.run(_bootstrap_running(ShellMachine(), finished.pid))
        assert not asyncio.run(_bootstrap_running(ShellMachine(), other.pid))
    finally:
        other.kill()
        other.wait()
