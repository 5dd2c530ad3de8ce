"""Event kinds, job states and stop causes are compared through their enums, never as string literals.

Only ``trainer_payload/protocol.py`` spells them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trainer_payload.protocol import EventKind, JobState, StopCause

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = Path("trainer_payload/protocol.py")
WORDS = {member.value for enum in (EventKind, JobState, StopCause) for member in enum}
#: Keys of an event, and names of variables, that hold an event kind, a job state or a stop cause.
EVENT_KEYS = {"event", "state", "stopped_by"}
EVENT_NAMES = {"kind", "state", "job_state", "stopped_by"}


def _is_event_field(node: ast.expr) -> bool:
    """Whether ``node`` reads an event's kind or state: ``e["event"]``, ``e.get("state")``, ``kind``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in EVENT_KEYS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in EVENT_KEYS
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) in EVENT_NAMES
    return False


def _literal_words(node: ast.expr) -> set[str]:
    """The event words a literal spells: ``"step"``, or those in ``("done", "failed")``."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)} & WORDS


def _offences(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_event_field(side) for side in sides):
                found += [(node.lineno, word) for side in sides for word in sorted(_literal_words(side))]
    return found


def test_the_checker_finds_literal_comparisons_and_passes_enum_ones() -> None:
    bad = 'if e["event"] == "step" or kind in ("done", "error") or e.get("state") != "failed": pass'
    assert [word for _, word in _offences(ast.parse(bad))] == ["step", "done", "error", "failed"]
    good = 'if e["event"] is EventKind.STEP or e.get("state") == JobState.FAILED or e["step"] == "step": pass'
    assert _offences(ast.parse(good)) == []


def test_no_module_compares_event_kinds_or_states_with_string_literals() -> None:
    offenders = []
    for package in ("desktop", "trainer_payload"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative != PROTOCOL:
                tree = ast.parse(path.read_text(encoding="utf-8"))
                offenders += [f"{relative}:{line}: {word!r}" for line, word in _offences(tree)]
    assert not offenders, "compare through EventKind, JobState or StopCause:\n" + "\n".join(offenders)
