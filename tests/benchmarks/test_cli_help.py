"""Every benchmark command answers ``--help`` with its usage and exit status 0, and refuses
an unknown option with argparse's one-line error (bench_runtime_budget's ``--help`` raised
TypeError on a ``%`` in its help text; bench_sim_reuse ran the whole benchmark)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(
    p.stem for p in BENCH.glob("*.py") if "\ndef main(" in p.read_text() and p.stem != "harness"
)


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))


def _main(name: str):
    main = importlib.import_module(name).main
    assert "argv" in inspect.signature(main).parameters, f"{name}.main takes no argv"
    return main


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        _main(name)(["--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", SCRIPTS)
def test_unknown_option(name, capsys):
    with pytest.raises(SystemExit) as e:
        _main(name)(["--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err  # the unknown option, or a required argument first
    assert err.startswith("usage:") and "error:" in err and "Traceback" not in err


def test_every_command_is_listed():
    assert len(SCRIPTS) >= 20, SCRIPTS
