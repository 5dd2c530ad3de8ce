"""What a finished run left for the local tools: its adapter folder, its base model and its held-out chats.

``rentune export``, ``rentune compare`` and the app accept either an adapter folder or a run id; this module turns
either into an :class:`AdapterSource`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from desktop.services.runs.store import RunStore, UnknownRunError

ADAPTER_CONFIG = "adapter_config.json"


class AdapterSourceError(ValueError):
    """The adapter or run cannot be used; the message names the problem and the fix."""


@dataclass(frozen=True)
class AdapterSource:
    """An adapter to export or compare, and what is known about it.

    Attributes:
        adapter: The PEFT adapter folder (``adapter_config.json`` and the weights).
        base: The base model it was trained on (a folder or a Hub id), or None when nothing says.
        eval_file: The run's held-out chat file, or None.
        run_id: The run it came from, or None for a plain folder.
    """

    adapter: Path
    base: str | None
    eval_file: Path | None
    run_id: str | None

    def default_out(self, suffix: str) -> Path:
        """``./NAME-SUFFIX`` where the command runs: NAME is the run id, or the adapter folder's name."""
        return Path.cwd() / f"{self.run_id or self.adapter.name}-{suffix}"


def resolve_adapter(reference: str, store: RunStore | None = None) -> AdapterSource:
    """An adapter folder, or the adapter of the run whose id (or unique prefix) is ``reference``.

    Raises:
        AdapterSourceError: Neither an adapter folder nor a run with an adapter.
    """
    path = Path(reference).expanduser()
    if path.is_dir():
        return _from_folder(path)
    if path.suffix or "/" in reference or "\\" in reference:
        raise AdapterSourceError(f"{reference}: no such adapter folder; give a folder or a run id (see rentune runs)")
    return _from_run(reference, store or RunStore())


def _from_folder(path: Path) -> AdapterSource:
    config = path / ADAPTER_CONFIG
    if not config.is_file():
        raise AdapterSourceError(
            f"{path} has no {ADAPTER_CONFIG}, so it is not a LoRA adapter; give the folder a run brought home "
            "(rentune runs shows each run's adapter)"
        )
    return AdapterSource(path.resolve(), _adapter_base(config), None, None)


def _adapter_base(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterSourceError(f"{config} is not readable JSON ({exc}); the adapter folder is damaged") from exc
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    return base if isinstance(base, str) and base else None


def _from_run(run_id: str, store: RunStore) -> AdapterSource:
    try:
        record = store.get(run_id)
    except UnknownRunError as exc:
        raise AdapterSourceError(f"{run_id!r} is neither an adapter folder nor a run: {exc}") from exc
    if not record.adapter:
        raise AdapterSourceError(
            f"run {record.id} has no adapter home yet (it is {record.state.value}); "
            f"wait for it to finish, or rentune pull {record.id}"
        )
    adapter = Path(record.adapter)
    if not (adapter / ADAPTER_CONFIG).is_file():
        raise AdapterSourceError(f"run {record.id}'s adapter folder {adapter} is missing; rentune pull {record.id}")
    base = record.spec.get("base_model")
    eval_file = record.spec.get("eval_file")
    return AdapterSource(
        adapter,
        base if isinstance(base, str) and base else _adapter_base(adapter / ADAPTER_CONFIG),
        Path(eval_file) if isinstance(eval_file, str) and eval_file else None,
        record.id,
    )
