"""The benchmark harness (benchmarks/harness.py): statistics, the row schema, file round trips,
tables and plots, and one tiny end-to-end run of the scoring sweep. No timing is asserted."""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# benchmarks/ is a folder of scripts, not a package: its modules import each other by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_scoring
import harness
from harness import SCHEMA, Env, Row, Stats

ENV = Env(torch="2.13.0", triton="3.9.0", python="3.11.7", git_sha="abc123", date="2026-01-01")


def _row(**kw) -> Row:
    base = dict(
        what="decision_latency",
        provider="torch",
        size=1000,
        stats=Stats(2.0, 1.5, 3.0, 1.0, 9.0),
        unit="us",
        device="CPU: test",
        env=ENV,
    )
    base.update(kw)
    return Row.of(**base)


def test_schema_is_fixed():
    assert SCHEMA == (
        "what",
        "provider",
        "size",
        "median",
        "q1",
        "q3",
        "min",
        "max",
        "unit",
        "repeats",
        "loops",
        "params",
        "device",
        "torch",
        "triton",
        "python",
        "git_sha",
        "date",
        "note",
    )


@pytest.mark.parametrize("n", [1, 2, 5, 10, 11])
def test_stats_quantiles_match_numpy(n):
    xs = np.random.default_rng(n).lognormal(size=n)
    s = Stats.of(xs.tolist())
    want = np.percentile(xs, [50, 25, 75, 0, 100])
    np.testing.assert_allclose([s.median, s.q1, s.q3, s.min, s.max], want, rtol=1e-12)


def test_stats_of_infinite_samples_are_infinite_not_nan():
    """A sample that is inf (a copy price scale that never copies) gives inf quantiles where
    the interpolation reaches it (numpy's percentile gives nan there: inf - inf)."""
    inf = math.inf
    assert Stats.of([inf]) == Stats(inf, inf, inf, inf, inf)
    assert Stats.of([1.0, inf, inf]) == Stats(inf, inf, inf, 1.0, inf)


def test_stats_map_keeps_order_under_a_decreasing_function():
    s = Stats(2.0, 1.0, 4.0, 0.5, 8.0).map(lambda t: 8.0 / t)
    assert s == Stats(4.0, 2.0, 8.0, 1.0, 16.0)
    with pytest.raises(ValueError, match="at least one sample"):
        Stats.of([])


def test_row_of_takes_repeats_and_loops_from_the_timing():
    t = harness.Timing(samples=(1e-6, 2e-6, 3e-6), loops=40)
    r = _row(stats=t.stats(1e6), timing=t, params="heuristic=dtr")
    assert (r.repeats, r.loops, r.median, r.min, r.max) == (3, 40, 2.0, 1.0, 3.0)
    assert (r.torch, r.git_sha, r.date, r.params) == (
        "2.13.0",
        "abc123",
        "2026-01-01",
        "heuristic=dtr",
    )


def test_csv_round_trip_is_exact(tmp_path):
    rows = [
        _row(),
        _row(provider="python", size=10**5, stats=Stats(1 / 3, 0.1, 0.7, math.inf, math.nan)),
        _row(what="target", provider="python/torch", unit="x", note='PASS, "quoted"; a,b'),
    ]
    path = harness.write_csv(rows, tmp_path / "sub" / "r.csv")
    with path.open() as f:
        assert tuple(next(csv.reader(f))) == SCHEMA
    back = harness.read_csv(path)
    assert back[0] == rows[0] and back[2] == rows[2]
    assert back[1].median == 1 / 3 and back[1].min == math.inf and math.isnan(back[1].max)
    assert all(isinstance(r.size, int) and isinstance(r.median, float) for r in back)


def test_json_round_trip_is_exact(tmp_path):
    rows = [_row(), _row(size=7, stats=Stats(0.1, 0.1, 0.2, 0.05, 0.3))]
    path = harness.write_json(rows, tmp_path / "r.json")
    assert [set(d) for d in json.loads(path.read_text())] == [set(SCHEMA)] * 2
    assert harness.read_json(path) == rows


def test_a_file_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("what,provider,size\nx,y,1\n")
    with pytest.raises(ValueError, match="missing field"):
        harness.read_csv(path)


def test_measure_takes_the_samples_it_is_asked_for():
    calls = []
    t = harness.measure(lambda: calls.append(1), warmup=2, repeats=4, min_sample_s=0.0)
    assert len(t.samples) == 4 and t.loops == 1 and len(calls) == 2 + 4
    t = harness.measure(lambda: None, warmup=1, repeats=3, min_sample_s=1e-4)
    assert t.loops > 1 and all(s >= 0 for s in t.samples)
    with pytest.raises(ValueError, match="repeats >= 1"):
        harness.measure(lambda: None, repeats=0)


def test_pivot_markdown_has_one_line_per_size_and_a_column_per_provider():
    rows = [
        _row(provider="torch", size=10),
        _row(provider="numpy", size=10),
        _row(provider="torch", size=100, stats=Stats(5.0, 5, 5, 5, 5)),
        _row(what="throughput", size=10),
    ]
    text = harness.pivot_markdown(rows, "decision_latency")
    assert text.splitlines()[0] == "decision_latency (us)"
    assert "| N | torch | numpy |" in text
    assert "| 10 | 2 | 2 |" in text and "| 100 | 5 | - |" in text


def test_plot_rows_writes_a_png(tmp_path):
    rows = [_row(size=n, provider=p) for n in (10, 100) for p in ("a", "b")]
    path = harness.plot_rows(rows, [("decision_latency", "us")], tmp_path / "p.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_environment_is_described():
    assert harness.describe_device("cpu").startswith("CPU: ")
    env = Env.capture()
    assert env.torch == torch.__version__ and env.python.count(".") == 2
    assert env.git_sha and "T" in env.date


@pytest.mark.parametrize(
    "text,n", [("1000", 1000), ("1e6", 10**6), ("16M", 16 * 10**6), ("2^24", 2**24), ("3k", 3000)]
)
def test_sizes_parse(text, n):
    assert bench_scoring.parse_size(text) == n


def test_the_scoring_sweep_runs_end_to_end(tmp_path, capsys):
    """A tiny sweep: every provider's victim agrees with the twin (exit status 0, rule 3)."""
    rc = bench_scoring.main(
        [
            "--sizes",
            "100",
            "2000",
            "--out",
            str(tmp_path),
            "--tag",
            "t",
            "--providers",
            "torch",
            "numpy",
            "python",
            "--heuristic",
            "dtr_eq",
        ]
    )
    assert rc == 0
    rows = harness.read_csv(tmp_path / "scoring_t.csv")
    assert harness.read_json(tmp_path / "scoring_t.json") == rows
    assert (tmp_path / "scoring_t.png").exists()
    lat = {(r.provider, r.size) for r in rows if r.what == "decision_latency"}
    assert lat == {(p, n) for p in ("torch", "numpy", "python") for n in (100, 2000)}
    assert not any(r.note.startswith("MISMATCH") for r in rows)
    assert all(r.params.startswith("heuristic=dtr_eq;k=1") for r in rows if r.size)
    assert "targets are defined for heuristic dtr" in capsys.readouterr().out


def test_target_verdicts_from_rows():
    """The four targets of issue 2 section 6, from rows alone (the GPU ones cannot run here)."""

    def make(what, provider, size, stats, unit, timing=None, note="", on=None):
        return _row(what=what, provider=provider, size=size, stats=stats, unit=unit, note=note)

    def lat(provider, n, us):
        return _row(provider=provider, size=n, stats=Stats(us, us, us, us, us))

    frac = [
        _row(
            what="bandwidth_fraction",
            provider="triton",
            size=n,
            unit="fraction",
            stats=Stats(f, f, f, f, f),
        )
        for n, f in ((10**7, 0.1), (2**24, 0.85), (10**8, 0.7))
    ]
    rows = [
        *frac,
        lat("triton", 10**6, 19.0),
        lat("torch-cuda", 10**6, 80.0),
        lat("torch", 10**5, 500.0),
        lat("python", 10**5, 40_000.0),
    ]
    out, lines = bench_scoring.targets(rows, make)
    got = {(r.provider, r.size): r.note.split(":")[0] for r in out}
    assert got == {
        ("triton", 2**24): "PASS",
        ("triton", 10**8): "FAIL",
        ("triton", 10**6): "PASS",
        ("torch-cuda/triton", 10**6): "FAIL",
        ("python/torch", 10**5): "FAIL",
    }
    ratio = next(r for r in out if r.provider == "python/torch")
    assert ratio.median == 80.0 and ratio.unit == "x"
    assert not any("not measured" in ln for ln in lines)
    _, lines = bench_scoring.targets(rows[:1], make)
    assert sum("not measured" in ln for ln in lines) == 4


@pytest.mark.parametrize("mode", ["ModeOnly", "WrapperFloor"])
@pytest.mark.parametrize("name", ["mlp", "treelstm"])
def test_floor_modes_run_a_training_step_exactly(mode, name):
    """The reference settings of the runtime benchmark (benchmarks/floor.py) time a real
    step: loss and gradients equal to eager, so the floor is not a broken run."""
    import floor

    from tests.zoo import make

    ref, case = make(name), make(name)
    ref_loss = ref.loss(ref.model, ref.inputs)
    ref_loss.backward()
    with getattr(floor, mode)():
        loss = case.loss(case.model, case.inputs)
        loss.backward()
        got = loss.detach()
        got = got._plain if type(got) is not torch.Tensor else got
    assert torch.equal(got, ref_loss.detach())
    for p, q in zip(case.model.parameters(), ref.model.parameters()):
        g = p.grad._plain if type(p.grad) is not torch.Tensor else p.grad
        assert torch.equal(g, q.grad)
