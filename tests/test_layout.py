"""The import direction of STYLE.md: kernels know nothing of tritondtr; the simulator never
imports the runtime nor the runtime the simulator; the trace format and the engine core import
neither."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names.add(mod)
                names.update(f"{mod}.{a.name}" for a in node.names)
            else:
                names.add(node.module or "")
    return names


def files(*parts):
    return sorted((ROOT.joinpath(*parts)).rglob("*.py"))


@pytest.mark.parametrize("path", files("kernels"), ids=lambda p: p.name)
def test_kernels_import_nothing_of_tritondtr(path):
    assert not {n for n in imports(path) if n.startswith("tritondtr")}


@pytest.mark.parametrize("path", files("tritondtr", "sim"), ids=lambda p: p.name)
def test_simulator_never_imports_runtime(path):
    assert not {n for n in imports(path) if n.startswith("tritondtr.runtime")}


@pytest.mark.parametrize("path", files("tritondtr", "runtime"), ids=lambda p: p.name)
def test_runtime_never_imports_simulator(path):
    assert not {n for n in imports(path) if n.startswith("tritondtr.sim")}


@pytest.mark.parametrize("path", files("tritondtr", "traceformat"), ids=lambda p: p.name)
def test_trace_format_imports_neither_runtime_nor_simulator(path):
    assert not {n for n in imports(path) if n.startswith(("tritondtr.runtime", "tritondtr.sim"))}


@pytest.mark.parametrize("path", files("tritondtr", "core"), ids=lambda p: p.name)
def test_dtr_core_imports_neither_runtime_nor_simulator(path):
    """The DTR core is driven by both: it knows neither (STYLE.md, shape of the house)."""
    bad = {n for n in imports(path) if n.startswith(("tritondtr.runtime", "tritondtr.sim"))}
    assert not bad


CORE = [
    "table.py",
    "policy.py",
    "scoring.py",
    "heuristics.py",
    "engine.py",
    "bounded.py",
    "neighborhood.py",
    "regions.py",
    "eqclass.py",
    "residency.py",
    "units.py",
]


@pytest.mark.parametrize("name", CORE)
def test_engine_core_imports_neither_runtime_nor_simulator(name):
    path = ROOT / "tritondtr" / name
    if not path.exists():
        pytest.fail(f"{path} is part of the engine core and must exist")
    bad = {n for n in imports(path) if n.startswith(("tritondtr.runtime", "tritondtr.sim"))}
    assert not bad
