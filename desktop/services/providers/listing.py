"""A provider's list of machines read row by row: one row (or one part) that cannot be read hides nothing else.

Every provider client builds its :meth:`~.base.Provider.listing` here: :func:`read_rows` parses a list one row at a
time, and a row that cannot be read (a field of the wrong type, a port that is not a number) is left out alone,
named in a note; :func:`listed_apart` reads the parts of an account apart (RunPod's pods and its clusters), so one
part that fails leaves the others listed, with a note. A look-up by label (:meth:`Listing.named`) that finds
nothing while a part or a row that could be that machine was left out raises instead of answering "none": a create
of unknown outcome must not be taken for one that made nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from desktop.services.providers.base import Instance, ProviderError, ProviderName, named_in

log = logging.getLogger(__name__)

#: What parsing an untrusted row may raise: a missing field, a field of the wrong type, a value that is no number.
ROW_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)

#: Reads one row of a provider's list into an instance.
RowParser = Callable[[dict[str, Any]], Instance]


@dataclass(frozen=True)
class Unread:
    """A row or a part of a provider's list that could not be read, and was left out.

    Attributes:
        note: One line naming it (provider, id) and what was wrong.
        name: The machine's name where that much could be read; None where it could be any machine (a part of the
            list that failed, a row without a readable name).
    """

    note: str
    name: str | None = None

    def could_be(self, label: str) -> bool:
        """Whether the machine left out may be the one named ``label``."""
        return self.name is None or self.name == label


@dataclass(frozen=True)
class Listing:
    """The machines a provider listed, and what it could not read.

    Attributes:
        provider: Whose list.
        instances: Every machine that could be read.
        unread: One entry per row or part of the list left out.
    """

    provider: ProviderName
    instances: list[Instance] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """One line per row or part left out."""
        return [unread.note for unread in self.unread]

    def plus(self, other: Listing) -> Listing:
        """This listing and ``other`` together (two parts of one account)."""
        return Listing(self.provider, self.instances + other.instances, self.unread + other.unread)

    def named(self, label: str) -> list[Instance]:
        """The machines named ``label`` that are not gone.

        Raises:
            ProviderError: None was found, but something left out of the list may be it: whether it exists is
                unknown (a create looked up so stays unsettled, for the next start).
        """
        found = named_in(self.instances, label)
        unsure = [unread.note for unread in self.unread if unread.could_be(label)]
        if found or not unsure:
            return found
        raise ProviderError(
            self.provider,
            f"no machine named {label} among those that could be read, and it may be one that could not "
            f"({'; '.join(unsure)}); look again later",
        )


def problem_words(error: Exception) -> str:
    """What was wrong with a row, in a few words (a missing field is named as such)."""
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}" if error.args else "a missing field"
    return str(error) or type(error).__name__


def _row_words(what: str, row: Any, name_key: str) -> tuple[str, str | None]:
    """How a note names a row (``instance 42 (rentune-x)``), and the machine's name where it can be read."""
    if not isinstance(row, Mapping):
        return f"a {what} that is not an object ({str(row)[:40]!r})", None
    name = row.get(name_key)
    readable = str(name) if isinstance(name, str | int) and name != "" else None
    named = f" ({readable})" if readable else ""
    ident = row.get("id")
    return (f"{what} {ident}{named}" if ident not in (None, "") else f"a {what} without an id{named}"), readable


def unread_row(provider: ProviderName, what: str, row: Any, why: str, name_key: str = "name") -> Unread:
    """The note for one row that could not be read: provider, the row's id (and name), what was wrong."""
    words, name = _row_words(what, row, name_key)
    return Unread(f"{provider.label}: {words} could not be read ({why})", name)


def read_row(row: Any, parse: RowParser) -> Instance:
    """One row read by ``parse``; a row must be an object with an id.

    Raises:
        ValueError: Not an object, or no id.
        KeyError, TypeError, ValueError, AttributeError, IndexError: A field ``parse`` could not read.
    """
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    if row.get("id") in (None, ""):
        raise ValueError("no id")
    return parse(row)


def read_rows(
    provider: ProviderName, what: str, rows: Iterable[Any], parse: RowParser, *, name_key: str = "name"
) -> Listing:
    """A provider's list read one row at a time: a row that cannot be read is left out alone, named in a note.

    Args:
        provider: Whose list.
        what: What a row is, for the notes ("pod", "instance").
        rows: The rows as the provider sent them (untrusted).
        parse: Reads one row.
        name_key: The row's field holding the machine's name ("label" at Vast.ai).
    """
    instances: list[Instance] = []
    unread: list[Unread] = []
    for row in rows:
        try:
            instances.append(read_row(row, parse))
        except ROW_ERRORS as exc:
            unread.append(unread_row(provider, what, row, problem_words(exc), name_key))
    return Listing(provider, instances, unread)


def rows_in(provider: ProviderName, body: Mapping[str, Any], key: str, doing: str) -> list[Any]:
    """The list under ``key`` of an answer (none when absent).

    Raises:
        ProviderError: It is there but not a list: the answer cannot be read at all.
    """
    rows = body.get(key)
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise ProviderError(provider, f"{doing}: the answer's {key!r} is not a list ({str(rows)[:60]!r})")
    return rows


async def listed_apart(provider: ProviderName, parts: Mapping[str, Callable[[], Awaitable[Listing]]]) -> Listing:
    """Reads the parts of an account one after the other (RunPod's pods, then its clusters).

    A part that fails is left out with a note and the others are listed; only when every part fails is its error
    raised (nothing could be listed).

    Raises:
        ProviderError: Every part failed (the first part's error).
    """
    listing = Listing(provider)
    errors: list[ProviderError] = []
    for what, read in parts.items():
        try:
            listing = listing.plus(await read())
        except ProviderError as exc:
            errors.append(exc)
            note = f"{provider.label}: {what} could not be listed ({exc.message}); the rest is listed without them"
            listing = listing.plus(Listing(provider, unread=[Unread(note)]))
    if errors and len(errors) == len(parts):
        raise errors[0]
    return listing


def logged(listing: Listing) -> list[Instance]:
    """The listing's machines, its notes logged (for callers that want only the machines)."""
    for note in listing.notes:
        log.warning("%s", note)
    return listing.instances
