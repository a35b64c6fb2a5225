"""NOTE [ Core parts ] in tritondtr/core/core.py, read from the source: every field of the
DTR core and of its parts has one writer, the class that declares it; eviction and
rematerialization write none; the parts never write what they were lent. The tests below
also check that the checker sees each kind of write, on planted code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.source_writes import assigned, unsubscripted, written

CORE = Path(__file__).resolve().parents[2] / "tritondtr" / "core"

# Classes with state, by file: NOTE [ Core parts ] rule 1.
PARTS = {
    "core.py": "Core",
    "graph.py": "StorageGraph",
    "account.py": "ByteAccount",
    "backward.py": "BackwardPins",
    "unheld.py": "UnheldScorer",
    "anchors.py": "Anchors",
    "offload.py": "HostCopies",
    "plan.py": "StepPlan",
    "tuning.py": "CopyScale",
    "rehearsal.py": "Tape",
}
# What each part is lent (rule 3): the core's lists and counters, bound in ``__init__``,
# read, never written.
LENT = {
    "Core": {
        "anchored",
        *("size", "cost", "born", "inputs", "name", "writes", "nread", "links"),
        *("absorbed", "free_ids", "readers"),
        *("host", "arriving"),
    },
    "StorageGraph": {"state"},
    "ByteAccount": {"stats"},
    "BackwardPins": {"state", "pinned", "backward", "inputs", "stats"},
    "UnheldScorer": {"state", "held", "inputs", "cost", "size", "eslot", "sid_of"},
    "Anchors": set(),
    "HostCopies": set(),
    "StepPlan": set(),
    "CopyScale": set(),
    "Tape": set(),
}
# The core's own methods in files of their own, which declare and write nothing (rule 2).
STATELESS = {"evict.py": "Evictor", "offload.py": "Offloader", "remat.py": "Rematerializer"}


def _self_field(node: ast.AST) -> str | None:
    """``F`` for ``self.F``, ``self.F[...]`` and ``self.F[...][...]``, else None."""
    node = unsubscripted(node)
    named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    return node.attr if named and node.value.id == "self" else None


def declared(cls: ast.ClassDef) -> set[str]:
    """The fields ``__init__`` binds (``self.F = ...``)."""
    out = set()
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
            for node in ast.walk(fn):
                for t in assigned(node):
                    if isinstance(t, ast.Attribute) and _self_field(t) == t.attr:
                        out.add(t.attr)
    return out


def writes(cls: ast.ClassDef) -> dict[str, set[str]]:
    """Field -> the methods that write it, outside ``__init__``: assignment, augmented or
    item assignment, ``del`` of an item, a mutating call, also through a local bound to
    ``self.F`` (``state = self.state`` ... ``state[i] = x``)."""
    found: dict[str, set[str]] = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        alias: dict[str, str] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = assigned(node)
                values = (
                    list(node.value.elts)
                    if isinstance(node.value, ast.Tuple) and len(targets) > 1
                    else [node.value] * len(targets)
                )
                for t, v in zip(targets, values):
                    f = _self_field(v) if isinstance(v, ast.Attribute) else None
                    if isinstance(t, ast.Name) and f is not None:
                        alias[t.id] = f
        for node in ast.walk(fn):
            for t in written(node):
                if isinstance(t, ast.Name) and not isinstance(node, ast.Call):
                    continue  # a local bound again: no write
                f = _self_field(t) or alias.get(getattr(unsubscripted(t), "id", None))
                if f is not None:
                    found.setdefault(f, set()).add(fn.name)
    return found


def _class(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return cls


@pytest.mark.parametrize("file, name", sorted(PARTS.items()))
def test_a_part_writes_only_what_it_declares(file, name):
    cls = _class(CORE / file, name)
    fields = declared(cls)
    assert fields and LENT[name] <= fields, f"{name} declares {sorted(fields)}"
    own = fields - LENT[name]
    stray = {f: m for f, m in writes(cls).items() if f not in own}
    assert not stray, f"{name} writes fields it does not own: {stray}"


@pytest.mark.parametrize("file, name", sorted(STATELESS.items()))
def test_eviction_and_rematerialization_write_no_field(file, name):
    cls = _class(CORE / file, name)
    assert declared(cls) == set()
    assert writes(cls) == {}, f"{name} writes {writes(cls)}: go through the core's methods"


def test_no_two_parts_own_a_field():
    owners: dict[str, list[str]] = {}
    for file, name in PARTS.items():
        for f in declared(_class(CORE / file, name)) - LENT[name]:
            owners.setdefault(f, []).append(name)
    assert {f: o for f, o in owners.items() if len(o) > 1} == {}


def test_every_class_with_state_in_the_core_is_listed():
    """A new part of the core joins PARTS (and NOTE [ Core parts ]); records, enums,
    protocols and errors declare no ``__init__`` of state here."""
    listed = set(PARTS.items()) | set(STATELESS.items())
    for path in sorted(CORE.glob("*.py")):
        for cls in ast.parse(path.read_text()).body:
            if isinstance(cls, ast.ClassDef) and any(
                isinstance(f, ast.FunctionDef) and f.name == "__init__" for f in cls.body
            ):
                if path.name == "errors.py":
                    continue
                assert (path.name, cls.name) in listed, f"{path.name}: {cls.name} not in PARTS"


PLANTED = """
class Part:
    def __init__(self, given, other):
        self.mine = []
        self.count = 0
        self.given = given
        self.other_list = other.items

    def ok(self):
        self.mine.append(1)
        self.count += 1

    def assigns(self):
        self.given = None

    def item(self):
        self.given[0] = 1

    def through_a_local(self):
        g, m = self.given, self.mine
        g[1] = 2
        m.clear()

    def mutates(self):
        self.other_list.append(3)

    def deletes(self):
        del self.given[0]

    def declares_late(self):
        self.late = 1
"""


def test_the_checker_sees_every_kind_of_write():
    (cls,) = ast.parse(PLANTED).body
    assert declared(cls) == {"mine", "count", "given", "other_list"}
    found = writes(cls)
    assert found == {
        "mine": {"ok", "through_a_local"},
        "count": {"ok"},
        "given": {"assigns", "item", "through_a_local", "deletes"},
        "other_list": {"mutates"},
        "late": {"declares_late"},
    }


def _core_writes(source: str) -> list[tuple[int, str]]:
    """Writes to a core's field from outside the core: ``core.X``, ``self.core.X`` or
    ``session.core.X`` assigned, item-assigned, deleted or mutated."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for t in written(node):
            t = unsubscripted(t)
            if not isinstance(t, ast.Attribute):
                continue
            root = t.value
            if (isinstance(root, ast.Name) and root.id == "core") or (
                isinstance(root, ast.Attribute) and root.attr == "core"
            ):
                found.append((node.lineno, t.attr))
    return sorted(found)


def test_no_module_outside_the_core_writes_its_fields():
    """The runtime, the simulator and the applications drive the core through its methods
    (NOTE [ Core parts ] rule 1): e.g. ``core.bytes.set_budget``, ``core.time_with``."""
    package = CORE.parent
    bad = {}
    for path in sorted(package.rglob("*.py")):
        if CORE in path.parents:
            continue
        writes = _core_writes(path.read_text())
        if writes:
            bad[str(path.relative_to(package))] = writes
    assert bad == {}


def test_the_outside_check_sees_each_kind_of_write():
    planted = (
        "core.budget = 1\n"
        "self.core.clock = c\n"
        "session.core.seen[3] = 4\n"
        "core.free_ids.append(2)\n"
        "core.bytes.set_budget(5)\n"  # a method of a part: allowed
        "core.stats.freed += 1\n"  # the counters' object: not a core field
    )
    assert _core_writes(planted) == [(1, "budget"), (2, "clock"), (3, "seen"), (4, "free_ids")]
