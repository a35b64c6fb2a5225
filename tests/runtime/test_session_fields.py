"""Issue 26's one-op-path rule, read from the source: no module of the runtime but
session.py writes a field of the session (assigns ``session.X``, an item of it, or calls a
mutating method on it); they call the session's own methods (``died``, ``observe``,
``in_flight``, ``watch_leaf``, ...). A session is reached as ``session``, ``owner`` (the
OutputOwner of outputs.py) or ``self.session``."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "tritondtr" / "runtime"
NAMES = {"session", "owner"}
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard"}


def _session_field(node: ast.AST) -> str | None:
    """``X`` for ``session.X`` / ``owner.X`` / ``self.session.X`` (and items of it)."""
    while isinstance(node, ast.Subscript):
        node = node.value
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
        targets = []
        if isinstance(node, ast.Assign):
            targets = [
                e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
            ]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for t in targets:
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
