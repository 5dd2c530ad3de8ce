from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.sshd import SshHost
from tests.fixtures.tiny_models import TINY_TRAINING, TinyModel

SpecFactory = Callable[..., Path]


@pytest.fixture
def make_spec(tmp_path: Path, tiny_model: TinyModel, chat_dataset: Path) -> SpecFactory:
    """Writes a SPEC.toml training the tiny model on the loopback sshd (keyword arguments override [training])."""

    def make(host: SshHost, name: str = "SPEC.toml", **training: object) -> Path:
        settings = {**TINY_TRAINING, **training}
        lines = ["[model]", f'base = "{tiny_model.path}"', "", "[data]", f'train = "{chat_dataset}"', "", "[training]"]
        lines += [f"{key} = {value!r}".replace("'", '"') for key, value in settings.items()]
        lines += [
            "",
            "[target]",
            f'ssh = "{host.url}"',
            f'identity = "{host.client_key}"',
            f'python = "{sys.executable}"',
            f'workdir = "{tmp_path / "remote"}"',
            f'authorized_keys = "{host.server.directory / "authorized_keys"}"',
        ]
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        return path

    return make


def python_wrapper(folder: Path, *extra: str, delay_s: float = 0) -> tuple[Path, Path]:
    """A stand-in for the machine's Python that logs each start, may wait first and may add arguments."""
    calls, wrapper = folder / "python-starts.log", folder / "python-wrapper"
    wrapper.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\nsleep {delay_s}\nexec {sys.executable} "$@" {" ".join(extra)}\n'
    )
    wrapper.chmod(0o755)
    return wrapper, calls


def with_python(spec_path: Path, python: Path) -> Path:
    spec_path.write_text(spec_path.read_text().replace(f'python = "{sys.executable}"', f'python = "{python}"'))
    return spec_path


@pytest.fixture
def token_probe(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter for [target] python that notes whether HF_TOKEN is in its environment (never its value)."""
    seen, wrapper = tmp_path / "token-seen", tmp_path / "python-probe"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -n "${{HF_TOKEN:-}}" ]; then echo sent >> "{seen}"; else echo absent >> "{seen}"; fi\n'
        f'HF_HUB_OFFLINE=1 exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, seen
