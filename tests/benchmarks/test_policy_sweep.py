"""The policy sweep (benchmarks/bench_policy_sweep.py, NOTE [ Policy sweep ]) on a tiny chain:
its rows are consistent with the optima they are compared with, and the before / after
comparison flags a run that got worse. No timing is asserted."""

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_policy_sweep as bps
import policy_report
from harness import write_csv

from tritondtr.sim import generators

needs_scipy = pytest.mark.skipif(
    importlib.util.find_spec("scipy") is None,
    reason="the Checkmate MILP needs scipy: pip install tritondtr[milp]",
)


@pytest.fixture(scope="module")
def rows():
    emit = bps.Emit()
    bps.sweep_trace("chain12", generators.chain(12), (0.9, 0.6, 0.1), ("dtr_eq", "lru"), emit)
    return emit.rows


@needs_scipy
def test_sweep_rows_agree_with_the_optima(rows):
    c = policy_report.cells(rows)
    assert {p for _, _, p in c} == {
        "runtime:dtr_eq",
        "runtime:lru",
        "paper:dtr_eq",
        "bound:runtime",
        "bound:runtime-cut",
        "bound:paper",
        "revolve:runtime",
        "checkmate:paper",
    }
    ok = lambda r: r.note.split()[0] in ("ok", "optimal")
    for ratio in (0.9, 0.6):
        get = lambda p, ratio=ratio: c["chain12", ratio, p]
        opt = get("revolve:runtime")
        cut, support = get("bound:runtime-cut"), get("bound:runtime")
        assert ok(opt) and cut.median <= support.median <= opt.median
        for h in ("dtr_eq", "lru"):
            run = get(f"runtime:{h}")
            assert ok(run) and run.median >= opt.median, h
        cm, paper = get("checkmate:paper"), get("paper:dtr_eq")
        assert ok(cm) and get("bound:paper").median <= cm.median <= paper.median
    assert c["chain12", 0.9, "runtime:dtr_eq"].median == c["chain12", 0.9, "revolve:runtime"].median
    # 10 % of the peak is one unit: no op of the backward pass fits, for anyone.
    lb = c["chain12", 0.1, "bound:runtime"]
    assert lb.note == "infeasible" and math.isnan(lb.median)
    assert c["chain12", 0.1, "runtime:dtr_eq"].note == "oom"
    assert not any("VIOLATED" in r.note for r in rows)
    assert "| chain12 |" in policy_report.table(rows)
    assert "| chain12 | 4 / 4 / 4 x1 |" in policy_report.bounds_table(rows)  # exact at 90 %


def test_compare_flags_a_worse_run(rows, tmp_path, capsys):
    before, after = tmp_path / "before.csv", tmp_path / "after.csv"
    write_csv(rows, before)
    write_csv(rows, after)
    assert policy_report.compare(before, after) == 0
    worse = [
        dataclasses.replace(r, median=r.median * 2 + 0.1)
        if r.what == "extra" and r.provider == "runtime:lru" and "ratio=0.6" in r.params
        else r
        for r in rows
    ]
    write_csv(worse, after)
    assert policy_report.compare(before, after) == 1
    assert "WORSE   chain12" in capsys.readouterr().out
