"""A fresh ed25519 key pair per run.

The private key lives in the OS keyring (never in a file); the public key is installed on the machine for the run's
lifetime and removed when the run ends.
"""

from __future__ import annotations

import shlex

import asyncssh
import keyring
import keyring.errors

from desktop.services.platform.logs import remember_secret
from desktop.services.platform.secrets import KEYRING_SERVICE

DEFAULT_AUTHORIZED_KEYS = "$HOME/.ssh/authorized_keys"


def _username(run_id: str) -> str:
    return f"run-key/{run_id}"


def create_run_key(run_id: str) -> str | None:
    """Makes the run's key pair and stores the private half in the keyring.

    Returns:
        The public key line, or None when no keyring is usable (the run then logs in with the user's identity).
    """
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"rentune-run-{run_id}")
    private = key.export_private_key().decode()
    try:
        keyring.set_password(KEYRING_SERVICE, _username(run_id), private)
    except keyring.errors.KeyringError:
        return None
    remember_secret(private)
    return key.export_public_key().decode().strip()


def load_run_key(run_id: str) -> asyncssh.SSHKey | None:
    """The run's private key from the keyring, or None."""
    try:
        private = keyring.get_password(KEYRING_SERVICE, _username(run_id))
    except keyring.errors.KeyringError:
        return None
    return asyncssh.import_private_key(private) if private else None


def delete_run_key(run_id: str) -> None:
    """Forgets the run's private key."""
    try:
        keyring.delete_password(KEYRING_SERVICE, _username(run_id))
    except keyring.errors.KeyringError:
        return


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
