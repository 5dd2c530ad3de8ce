"""The pure core speaks data: no CLI flag or command text in its strings (front ends word things their own way)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "desktop" / "core"
FRONT_END_WORDS = re.compile(r"(^|[\s(])--[a-z]|\brentune [a-z]")


def _docstrings(tree: ast.Module) -> set[int]:
    """Ids of the string nodes that are docstrings (they may show how a front end is used)."""
    holders = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)),
    ]
    found = set()
    for holder in holders:
        body = holder.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
    return found


def test_core_strings_name_no_cli_flags_or_commands() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        offenders += [
            f"{path.relative_to(CORE)}:{node.lineno}: {node.value!r}"
            for node in strings
            if id(node) not in docstrings and FRONT_END_WORDS.search(node.value)
        ]
    assert not offenders, "CLI wording in the core:\n" + "\n".join(offenders)
