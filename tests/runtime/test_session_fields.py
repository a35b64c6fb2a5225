"""Only session.py writes the session's fields, read from the source: no other module of the
runtime writes a field of the session (assigns ``session.X``, an item of it, or calls a
mutating method on it); they call the session's own methods (``died``, ``observe``,
``in_flight``, ``watch_leaf``, ...). A session is reached as ``session``, ``owner`` (the
OutputOwner of outputs.py) or ``self.session``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_writes import unsubscripted, written

RUNTIME = Path(__file__).resolve().parents[2] / "tritondtr" / "runtime"
NAMES = {"session", "owner"}


def _session_field(node: ast.AST) -> str | None:
    """``X`` for ``session.X`` / ``owner.X`` / ``self.session.X`` (and items of it)."""
    node = unsubscripted(node)
    if not isinstance(node, ast.Attribute):
        return None
    root = node.value
    if isinstance(root, ast.Name) and root.id in NAMES:
        return node.attr
    if isinstance(root, ast.Attribute) and root.attr == "session":
        return node.attr
    return None


def session_writes(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        for t in written(node):
            field = _session_field(t)
            if field is not None:
                found.append((node.lineno, field))
    return sorted(found)


def test_no_runtime_module_writes_the_sessions_fields():
    bad = {
        path.name: writes
        for path in sorted(RUNTIME.glob("*.py"))
        if path.name != "session.py" and (writes := session_writes(path.read_text()))
    }
    assert bad == {}, f"writes to the session's fields outside session.py: {bad}"


def test_the_check_sees_each_kind_of_write():
    planted = (
        "session.depth = 1\n"
        "session.dead.append(s)\n"
        "self.session.observer = r\n"
        "owner.absorbed[0] = x\n"
        "session.stats.ops += 1\n"  # the stats object's field: not the session's
        "session.died(s)\n"  # a method: allowed
    )
    assert session_writes(planted) == [(1, "depth"), (2, "dead"), (3, "observer"), (4, "absorbed")]
