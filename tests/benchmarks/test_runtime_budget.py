"""The runtime step benchmark (benchmarks/bench_runtime_budget.py): its per-op rows and table
(NOTE [ Runtime step benchmark ] rule 6) on one tiny run. No timing is asserted: the rows are
checked against each other and against the session's own op count."""

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_runtime_budget as brb


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("budget")
    argv = ["--models", "mlp:1", "gru", "--settings", "tracking,50%", "--repeats", "1"]
    assert brb.main([*argv, "--max-time", "0", "--out", str(out), "--tag", "t"]) == 0
    with open(out / "runtime_budget_t.csv") as f:
        return list(csv.DictReader(f)), (out / "runtime_budget_t.md").read_text()


def _cell(rows, model, provider, what):
    (r,) = [
        r
        for r in rows
        if r["params"].split(";")[0] == f"model={model}"
        and (r["provider"], r["what"]) == (provider, what)
    ]
    return float(r["median"])


@pytest.mark.parametrize("model", ["mlp:1", "gru"])
def test_per_op_rows_are_the_step_times_over_the_ops(rows, model):
    rows, _ = rows
    ops = _cell(rows, model, "eager", "ops")
    eager = _cell(rows, model, "eager", "step_time")
    assert ops == int(ops) > 0
    assert _cell(rows, model, "eager", "per_op_us") == pytest.approx(1e3 * eager / ops)
    for setting in ("tracking", "50%"):
        added = _cell(rows, model, setting, "step_time") - eager
        assert _cell(rows, model, setting, "per_op_us") == pytest.approx(1e3 * added / ops)
    assert _cell(rows, model, "50%", "evictions") > 0
    assert _cell(rows, model, "eager", "dispatches") >= ops  # rule 7: every op, and more
    assert not [r for r in rows if r["provider"] in ("wrapper-floor", "not-binding", "70%")]


def test_the_gru_step_dispatches_its_forty_cells(rows):
    """The GRU loop (recorded.py) is the step of NOTE [ Recorded steps ] rule 2: forty cells,
    each several ops forward and backward."""
    rows, _ = rows
    assert _cell(rows, "gru", "eager", "ops") > 40 * 10


def test_the_per_op_table_has_a_line_per_step(rows):
    _, md = rows
    table = md.split("| step | ops / step |", 1)[1]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert [ln.split(" | ")[0] for ln in lines] == ["| mlp:1", "| gru"]
    assert "tracking +us / op (x eager)" in table and "50% +us / op (x eager)" in table


def test_an_unknown_step_or_a_cpu_step_on_cuda_is_refused():
    with pytest.raises(ValueError, match="CPU step"):
        brb.load("gru", 1, "cuda", 1)
    with pytest.raises(ValueError, match="unknown step 'no-such-model'"):
        brb.load("no-such-model", 1, "cpu", 1)
