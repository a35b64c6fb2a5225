"""The import direction of STYLE.md, as a layer table: a module imports tritondtr only from
its own package or from a lower layer; the runtime and the simulator, one layer, never import
each other; and no import circle, imports under ``TYPE_CHECKING`` and inside functions counted.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A module may import a package of a lower layer, or its own package.
LAYERS: list[tuple[str, ...]] = [
    ("tritondtr.kernels", "tritondtr.units"),  # leaves: import nothing of tritondtr
    ("tritondtr.policy",),  # heuristics, scoring rules, backend dispatch
    ("tritondtr.engine",),  # metadata table, neighbourhoods, victim choice
    ("tritondtr.core",),  # the DTR core: every decision
    ("tritondtr.traceformat",),  # traces, below both of their users
    ("tritondtr.runtime", "tritondtr.sim"),  # peers: neither imports the other
    ("tritondtr", "tritondtr.cli", "tritondtr.env", "tritondtr.__main__", "tritondtr.demo"),
]

# Import circles that remain, each as its sorted modules; the test fails when one is added
# and when one of these is gone (then delete its line).
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "kernels":
        parts = ["tritondtr", *parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, pathlib.Path]:
    paths = sorted((ROOT / "tritondtr").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    return {_module(p): p for p in paths}


FILES = _files()


def _imports(name: str) -> set[str]:
    """The tritondtr modules ``name`` imports (each the most specific module file named)."""
    path = FILES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return _imported(path.read_text(), package) - {name}


def _imported(source: str, package: str) -> set[str]:
    """The tritondtr modules that ``source``, a module of ``package``, imports anywhere: at
    the top, inside functions, and under ``if TYPE_CHECKING:`` (an edge like any other)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bases = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            bases = [(base, [a.name for a in node.names])]
        else:
            continue
        for base, names in bases:
            if not base.startswith("tritondtr"):
                continue
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in FILES]
            out.update(subs or [base] if base in FILES or subs else [])
            if len(subs) < len(names) and base in FILES:
                out.add(base)
    return out


def _layer(name: str) -> tuple[int, str]:
    """(layer index, package) of a module: the longest package of the table it belongs to."""
    best = None
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            if (name == pkg or name.startswith(pkg + ".")) and (
                best is None or len(pkg) > len(best[1])
            ):
                best = (i, pkg)
    assert best is not None, f"{name} is in no layer of tests/test_layout.py: add its package"
    return best


def _upward(name: str, imports: set[str]) -> list[str]:
    """The imports of ``name`` that go up a layer, or sideways to another package of its
    layer (the applications, the top layer, may use one another)."""
    layer, package = _layer(name)
    top = layer == len(LAYERS) - 1
    bad = []
    for other in sorted(imports):
        their_layer, their_package = _layer(other)
        if their_package != package and (their_layer > layer or (their_layer == layer and not top)):
            bad.append(f"{other} (layer {their_layer}, {their_package})")
    return bad


@pytest.mark.parametrize("name", sorted(FILES))
def test_imports_go_down_the_layers(name):
    bad = _upward(name, _imports(name))
    assert not bad, f"{name} imports upward or sideways: {bad}"


def test_the_layer_check_sees_upward_and_sideways_imports():
    assert _upward("tritondtr.policy.scoring", {"tritondtr.engine.table"})
    assert _upward("tritondtr.kernels.topk_select", {"tritondtr.units"})
    assert _upward("tritondtr.sim.twin", {"tritondtr.runtime.session"})
    assert not _upward("tritondtr.sim.twin", {"tritondtr.core", "tritondtr.sim.replay"})
    assert not _upward("tritondtr.demo.runs", {"tritondtr.cli", "tritondtr.runtime"})


def test_every_package_is_in_a_layer():
    packages = {_module(p.parent) if p.name == "__init__.py" else None for p in FILES.values()}
    packages.discard(None)
    listed = {pkg for layer in LAYERS for pkg in layer}
    assert packages <= listed | {"tritondtr"}, f"packages in no layer: {packages - listed}"


def _circles() -> set[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {n: sorted(_imports(n)) for n in FILES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[tuple[str, ...]] = set()
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = graph[node]
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.add(tuple(sorted(comp)))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def test_no_import_circle_but_the_known_ones():
    found = _circles()
    assert not found - KNOWN_CIRCLES, f"new import circles: {sorted(found - KNOWN_CIRCLES)}"
    assert not KNOWN_CIRCLES - found, f"gone, delete from KNOWN_CIRCLES: {KNOWN_CIRCLES - found}"


def test_the_circle_check_sees_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .session import Session\n"
        "def f():\n"
        "    from ..core import Core\n"
    )
    assert _imported(source, "tritondtr.runtime") == {
        "tritondtr.runtime.session",
        "tritondtr.core",
    }
