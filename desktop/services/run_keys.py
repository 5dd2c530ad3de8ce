"""A fresh ed25519 key pair per run.

The private key lives in the OS keyring (never in a file); the public key is installed on the machine for the run's
lifetime and removed when the run ends.
"""

from __future__ import annotations

import shlex

import asyncssh
import keyring
import keyring.errors

from desktop.services.logs import remember_secret
from desktop.services.secrets import KEYRING_SERVICE

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


def install_command(public_key: str, authorized_keys: str) -> str:
    """Shell command appending the key to the authorized keys file once (public data only)."""
    target = shell_path(authorized_keys)
    line = shlex.quote(public_key)
    return (
        f'umask 077; f={target}; mkdir -p "$(dirname "$f")"; touch "$f"; '
        f'grep -qxF {line} "$f" || printf "%s\\n" {line} >> "$f"'
    )


def remove_command(public_key: str, authorized_keys: str) -> str:
    """Shell command removing the key from the authorized keys file, keeping the file's permissions."""
    target = shell_path(authorized_keys)
    line = shlex.quote(public_key)
    return (
        f'f={target}; [ -f "$f" ] || exit 0; grep -vxF {line} "$f" > "$f.rentune"; cat "$f.rentune" > "$f"; '
        'rm -f "$f.rentune"'
    )
