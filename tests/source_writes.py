"""What a piece of Python source writes, read from its syntax tree: shared by the tests that
check who writes whose fields (tests/core/test_parts.py, tests/runtime/test_session_fields.py)."""

from __future__ import annotations

import ast

# Methods that change the object they are called on (lists, dicts, sets, bytearrays).
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "remove",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "sort",
        "reverse",
    }
)


def assigned(node: ast.AST) -> list[ast.AST]:
    """The targets ``node`` assigns, augments, annotates or deletes (tuples unpacked)."""
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            out += t.elts if isinstance(t, ast.Tuple) else [t]
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def written(node: ast.AST) -> list[ast.AST]:
    """What ``node`` writes: its :func:`assigned` targets, or the object a mutating method
    call is made on."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MUTATORS
    ):
        return [node.func.value]
    return assigned(node)


def unsubscripted(node: ast.AST) -> ast.AST:
    """``x`` for ``x[i]``, ``x[i][j]`` ...; ``node`` itself otherwise."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node
