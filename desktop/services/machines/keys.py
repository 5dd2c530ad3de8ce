"""A fresh ed25519 key pair per run.

The private key lives in the OS keyring. Where no keyring exists at all (a headless server: keyring's fail backend),
it goes to a file only the user can read (``0600`` in a ``0700`` folder under the data folder), as OpenSSH keeps
keys; a keyring that takes the key and loses it (the null backend) gets no key, so renting is refused there. The
public key is installed on the machine for the run's lifetime and removed when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

import asyncssh
import keyring
import keyring.errors

from desktop.services.platform.logs import remember_secret
from desktop.services.platform.secrets import KEYRING_SERVICE, key_file_folder, keyring_missing

DEFAULT_AUTHORIZED_KEYS = "$HOME/.ssh/authorized_keys"


def _username(run_id: str) -> str:
    return f"run-key/{run_id}"


def create_run_key(run_id: str) -> str | None:
    """Makes the run's key pair and keeps the private half in the keyring (a private file where there is none).

    Returns:
        The public key line, or None when the keyring refused the key or lost it (the run then logs in with the
        user's identity, and a rented run is refused).
    """
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"rentune-run-{run_id}")
    private = key.export_private_key().decode()
    remember_secret(private)
    if keyring_missing():
        _write_key_file(run_id, private)
    elif not _keep_in_keyring(run_id, private):
        return None
    return key.export_public_key().decode().strip()


def _keep_in_keyring(run_id: str, private: str) -> bool:
    """Stores the private key and reads it back: False when the keyring refused it or does not give it back."""
    try:
        keyring.set_password(KEYRING_SERVICE, _username(run_id), private)
        kept = keyring.get_password(KEYRING_SERVICE, _username(run_id)) == private
    except keyring.errors.KeyringError:
        return False
    if not kept:
        delete_run_key(run_id)
    return kept


def load_run_key(run_id: str) -> asyncssh.SSHKey | None:
    """The run's private key from the keyring or its private file, or None."""
    private = _keyring_key(run_id) or _read_key_file(run_id)
    if not private:
        return None
    remember_secret(private)
    return asyncssh.import_private_key(private)


def delete_run_key(run_id: str) -> None:
    """Forgets the run's private key, in the keyring and in its file."""
    with contextlib.suppress(keyring.errors.KeyringError):
        keyring.delete_password(KEYRING_SERVICE, _username(run_id))
    key_file(run_id).unlink(missing_ok=True)


def _keyring_key(run_id: str) -> str | None:
    try:
        private = keyring.get_password(KEYRING_SERVICE, _username(run_id))
    except keyring.errors.KeyringError:
        return None
    return private if isinstance(private, str) else None


# -- the file fallback, where no keyring exists ------------------------------------------------------------------------


def key_file(run_id: str) -> Path:
    """The file the run's private key is kept in where no keyring exists.

    Raises:
        ValueError: ``run_id`` is not a plain name (it would point outside the folder).
    """
    if not run_id or Path(run_id).name != run_id or run_id.startswith("."):
        raise ValueError(f"not a run id: {run_id!r}")
    return key_file_folder() / f"{run_id}.key"


def _write_key_file(run_id: str, private: str) -> None:
    """Writes the key whole or not at all, readable by the user only (``0600``, its folder ``0700``)."""
    target = key_file(run_id)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target.parent.chmod(0o700)  # mkdir's mode is cut by the umask, and an older folder may be wider
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(private)
    partial.chmod(0o600)
    partial.replace(target)


def _read_key_file(run_id: str) -> str | None:
    try:
        return key_file(run_id).read_text(encoding="utf-8") or None
    except OSError:  # none there (or unreadable): the run logs in without its key
        return None


def shell_path(path: str) -> str:
    """A path for a remote shell: ``~/`` and ``$HOME/`` expand to the login's home, the rest is quoted."""
    for home in ("~/", "$HOME/"):
        if path.startswith(home):
            return '"$HOME"/' + shlex.quote(path[len(home) :])
    return shlex.quote(path)


# Prologue of every authorized_keys edit: resolve a symlinked file, create its folder, and take a lock so two runs
# on the same machine never edit it at once (flock on the folder; without flock, a lock folder, waited for 30 s).
_EDIT_PROLOGUE = (
    'umask 077; if [ -L "$f" ]; then f=$(readlink -f "$f") || exit 1; fi; d=$(dirname "$f"); '
    'mkdir -p "$d" || exit 1; '
    'if command -v flock >/dev/null 2>&1; then exec 9<"$d" && flock -w 60 9 || exit 1; '
    'else i=0; until mkdir "$f.rentune-lock" 2>/dev/null || [ "$i" -ge 30 ]; do i=$((i + 1)); sleep 1; done; '
    "trap 'rmdir \"$f.rentune-lock\" 2>/dev/null' EXIT; fi; "
)
# Writes the new content (the commands in {}) to a temp file beside the original, with its mode and owner, then
# renames it over the original: a reader (sshd) sees the old file or the new one, never a truncated one.
_REPLACE = 't=$(mktemp "$f.XXXXXX") || exit 1; if cp -p "$f" "$t" && {{ {content}; }} > "$t" && mv -f "$t" "$f"; ' + (
    'then exit 0; fi; rm -f "$t"; exit 1'
)


def install_command(public_key: str, authorized_keys: str) -> str:
    """Shell command adding the key to the authorized keys file once (public data only), atomically."""
    line = shlex.quote(public_key)
    # A file whose last line lacks its newline gets one first, so the key never joins that line.
    content = f'cat "$f"; if [ -n "$(tail -c 1 "$f")" ]; then echo; fi; printf "%s\\n" {line}'
    return (
        f"f={shell_path(authorized_keys)}; {_EDIT_PROLOGUE}"
        f'[ -e "$f" ] || : > "$f" || exit 1; grep -qxF {line} "$f" && exit 0; {_REPLACE.format(content=content)}'
    )


def remove_command(public_key: str, authorized_keys: str) -> str:
    """Shell command removing the key from the authorized keys file, atomically, keeping its mode and other lines."""
    line = shlex.quote(public_key)
    content = f'grep -vxF {line} "$f"; [ "$?" -le 1 ]'
    return (
        f"f={shell_path(authorized_keys)}; {_EDIT_PROLOGUE}"
        f'[ -f "$f" ] || exit 0; grep -qxF {line} "$f" || exit 0; {_REPLACE.format(content=content)}'
    )
