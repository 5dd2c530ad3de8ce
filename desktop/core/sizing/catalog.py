"""The bundled catalog of popular open models (``resources/models.json``), searchable by id or alias."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from desktop.core.sizing.architecture import Architecture, ArchitectureError, architecture_from_config


@dataclass(frozen=True)
class CatalogEntry:
    """One model of the catalog.

    Attributes:
        id: The Hugging Face Hub id.
        family: Model family for grouping in the UI.
        license: Licence identifier.
        aliases: Short names accepted by ``--model``.
        arch: The architecture built from the stored config fields.
    """

    id: str
    family: str
    license: str
    aliases: tuple[str, ...]
    arch: Architecture


def _normalise(name: str) -> str:
    return name.strip().lower()


class ModelCatalog:
    """Looks up architectures by Hub id (with or without the organisation) or alias, case-insensitively."""

    def __init__(self, entries: list[CatalogEntry]) -> None:
        self.entries = entries
        self._index: dict[str, CatalogEntry] = {}
        for entry in entries:
            for key in (entry.id, entry.id.split("/")[-1], *entry.aliases):
                self._index.setdefault(_normalise(key), entry)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelCatalog:
        """Builds the catalog from the decoded ``models.json``.

        Raises:
            ArchitectureError: An entry is malformed (a packaging bug; the message names the entry).
        """
        entries = []
        for raw in data.get("models", []):
            try:
                arch = architecture_from_config(raw["config"], raw["id"])
                entries.append(
                    CatalogEntry(raw["id"], raw["family"], raw["license"], tuple(raw.get("aliases", ())), arch)
                )
            except (KeyError, ArchitectureError) as exc:
                raise ArchitectureError(f"catalog entry {raw.get('id', '?')} is malformed: {exc}") from exc
        return cls(entries)

    def find(self, name: str) -> Architecture | None:
        """Returns the architecture called ``name``, or ``None`` if the catalog does not hold it."""
        entry = self._index.get(_normalise(name))
        return entry.arch if entry else None

    def entry(self, name: str) -> CatalogEntry | None:
        """Returns the catalog entry called ``name``, or ``None``."""
        return self._index.get(_normalise(name))

    def suggestions(self, name: str, limit: int = 5) -> list[str]:
        """Returns catalog ids that contain the words of ``name``, for "did you mean" messages."""
        words = [w for w in _normalise(name).replace("/", " ").replace("-", " ").split() if w]
        scored = [(sum(w in e.id.lower() for w in words), e.id) for e in self.entries]
        return [entry_id for score, entry_id in sorted(scored, key=lambda s: (-s[0], s[1])) if score][:limit]

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
