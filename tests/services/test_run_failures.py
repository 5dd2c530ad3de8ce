"""Which machine failures pass (reconnect with backoff) and which do not (the run stops with the fix)."""

from __future__ import annotations

import errno
from pathlib import Path

import asyncssh
import pytest

from desktop.services.machines.failures import Backoff, PermanentError, classify
from desktop.services.machines.ssh import (
    CommandFailedError,
    Endpoint,
    HostKeyChangedError,
    LoginRefusedError,
    RemoteError,
    describe_keys,
    is_refused_login,
)

PASSING = [
    ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
    ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    TimeoutError(),
    OSError(errno.EHOSTUNREACH, "No route to host"),
    asyncssh.ConnectionLost("Connection lost"),
    asyncssh.DisconnectError(asyncssh.DISC_BY_APPLICATION, "sshd restarting"),
    asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "channel refused"),
    RemoteError("upload of x did not verify (SHA-256 differs); it will be sent again"),
    RemoteError("`df -Pk x` ended without an exit status (signal: none)"),
    # Words that once read as permanent: only the kind of failure decides, never its text.
    RemoteError("sftp could not copy x (Connection reset by peer: Permission denied)"),
    asyncssh.ConnectionLost("No space left on device"),
    asyncssh.SFTPFailure("Failure"),
    asyncssh.SFTPConnectionLost("lost"),
]


@pytest.mark.parametrize("failure", PASSING, ids=lambda exc: type(exc).__name__)
def test_dropped_connections_and_timeouts_pass(failure: BaseException) -> None:
    assert not classify(failure).permanent


@pytest.mark.parametrize(
    ("output", "fix"),
    [
        ("mkdir: cannot create directory '/workspace/runs': Permission denied", "[target] workdir"),
        ("mkdir: cannot create directory '/sys/x': Operation not permitted", "[target] workdir"),
        ("sh: 1: cannot create /data/x/.rentune-write-test: Read-only file system", "[target] workdir"),
        ("mkdir: cannot create directory '/tmp/f/work': Not a directory", "[target] workdir"),
        ("mkdir: cannot create directory '/nonexistent': No such file or directory", "[target] workdir"),
        ("cp: error writing 'out/x': No space left on device", "free space on the machine"),
        ("write failed: Disk quota exceeded", "quota"),
        ("python3: command not found", "fix this on the machine"),
        ("", "fix this on the machine"),
    ],
)
def test_a_command_the_machine_ran_and_failed_is_permanent_with_its_words_and_the_fix(output: str, fix: str) -> None:
    verdict = classify(CommandFailedError("mkdir -p /x && df -Pk /x", 1, f"{output}\n"))
    assert verdict.permanent
    assert (output or "no message") in verdict.message and fix in verdict.message
    assert "\n" not in verdict.message, "one line"


def test_a_failed_command_keeps_its_exit_status_and_the_machines_words_on_one_line() -> None:
    failure = CommandFailedError("cd /x\nmkdir -p y", 2, "mkdir: cannot create\n  directory 'y'\n")
    assert isinstance(failure, RemoteError), "callers catching RemoteError still catch it"
    assert (failure.exit_status, failure.said) == (2, "mkdir: cannot create directory 'y'")
    assert str(failure) == "`cd /x mkdir -p y` failed (2): mkdir: cannot create directory 'y'"
    assert CommandFailedError("x", 1, "a" * 5000).said == "a" * 600, "the end of a long message"


def test_a_refused_login_is_told_apart_from_a_machine_not_up_yet() -> None:
    assert is_refused_login(LoginRefusedError("login as root@h:22 refused for ~/.ssh/id_x"))
    assert is_refused_login(asyncssh.PermissionDenied("Permission denied"))
    for not_up in (
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        TimeoutError(),
        asyncssh.ConnectionLost("Connection lost"),
        asyncssh.DisconnectError(asyncssh.DISC_PROTOCOL_ERROR, "handshake"),
        HostKeyChangedError("the host key of h:22 changed"),
    ):
        assert not is_refused_login(not_up), type(not_up).__name__


def test_refused_logins_changed_host_keys_and_own_findings_are_permanent() -> None:
    for failure in (
        LoginRefusedError("login as root@h:22 refused for ~/.ssh/id_x; add the key"),
        HostKeyChangedError("the host key of h:22 changed"),
        PermanentError("the machine has 0.10 GB free"),
    ):
        verdict = classify(failure)
        assert verdict.permanent and verdict.message == str(failure)
    assert classify(asyncssh.PermissionDenied("Permission denied")).permanent


def test_sftp_refusals_and_a_full_disk_here_are_permanent() -> None:
    assert classify(asyncssh.SFTPPermissionDenied("Permission denied")).permanent
    assert classify(asyncssh.SFTPNoSpaceOnFilesystem("No space")).permanent
    full_here = classify(OSError(errno.ENOSPC, "No space left on device"))
    assert full_here.permanent and "this computer" in full_here.message


def test_a_refused_login_names_the_run_key_and_the_identity(tmp_path: Path) -> None:
    run_key = asyncssh.generate_private_key("ssh-ed25519", comment="rentune-run-20260101-000000-abcd")
    identity = tmp_path / "id_x"
    text = describe_keys((run_key, identity))
    assert text == f"the run key (ed25519 {run_key.get_fingerprint('sha256')}) and {identity}"
    assert describe_keys(()) == "no key (set [target] identity or --identity)"
    home_key = Path.home() / ".ssh" / "id_test"
    assert describe_keys((home_key,)) == "~/.ssh/id_test"
    endpoint = Endpoint("10.0.0.1", 2222, "root", (run_key, identity))
    assert "login as root@10.0.0.1:2222 refused for the run key (ed25519 SHA256:" in str(
        LoginRefusedError(f"login as {endpoint.user}@{endpoint.host}:{endpoint.port} refused for {text}")
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_with_jitter_up_to_a_cap_and_gives_up_after_the_grace_period() -> None:
    clock = Clock()
    low = Backoff(1.0, grace=100, cap=8, clock=clock, jitter=lambda a, _b: a)
    high = Backoff(1.0, grace=100, cap=8, clock=clock, jitter=lambda _a, b: b)
    assert [low.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert [high.next_delay() for _ in range(6)] == [1.5, 3.0, 6.0, 8.0, 8.0, 8.0]
    clock.now = 98.0
    assert high.next_delay() == pytest.approx(2.0), "never waits past the grace period"
    clock.now = 100.0
    assert high.next_delay() is None
    assert high.failing_for() == 100.0


def test_backoff_starts_over_once_the_machine_works_again() -> None:
    clock = Clock()
    backoff = Backoff(1.0, grace=10, clock=clock, jitter=lambda a, b: (a + b) / 2)
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]
    clock.now = 50.0
    backoff.reset()
    assert backoff.next_delay() == 1.0, "a new streak, a new grace period"
    assert backoff.failing_for() == 0.0


def test_real_jitter_stays_within_half_and_one_and_a_half_times() -> None:
    delays = [Backoff(2.0, grace=100).next_delay() for _ in range(200)]
    assert all(d is not None and 1.0 <= d <= 3.0 for d in delays)
    assert len(set(delays)) > 100, "attempts of many engines spread out"
