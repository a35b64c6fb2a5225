"""`tritondtr demo`, the main job, end to end at a tiny size: its exit status, its table and
its files say what the runs did, and every budgeted run's gradients equal the reference."""

import csv
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from tritondtr.cli import main
from tritondtr.demo.cli import add_arguments
from tritondtr.demo.regimes import REGIMES, Regime
from tritondtr.demo.runs import run_demo
from tritondtr.demo.tinygpt import GPTConfig, TinyGPT, batches
from tritondtr.sim import load_trace, runtime_peak

TINY = GPTConfig(vocab=64, block=16, width=32, layers=2, heads=2, dropout=0.1)


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_run_demo_rows(tmp_path):
    path = tmp_path / "trace.npz"
    rows = run_demo(
        TINY,
        steps=2,
        batch=2,
        ratios=(0.5, 0.001),
        refine=1,
        trace_path=path,
        log=lambda _: None,
    )
    eager, unlimited, *budgeted, ckpt = rows
    assert eager.run == "eager" and eager.grads_equal is None
    assert unlimited.grads_equal is True and unlimited.evictions == 0
    assert unlimited.peak_bytes > 0
    # The twin is exact at the recorded (unlimited) budget: the peak of each step's replay.
    assert unlimited.twin_peak_bytes == unlimited.peak_bytes
    assert (unlimited.twin_evictions, unlimited.twin_remats) == (0, 0)
    worked = [r for r in budgeted if not r.error]
    failed = [r for r in budgeted if r.error]
    # 0.5 works, 0.1 % of the peak cannot hold one op; one bisection step between them.
    assert [r.ratio for r in budgeted] == sorted((r.ratio for r in budgeted), reverse=True)
    assert len(budgeted) == 3 and worked and failed
    assert worked[0].ratio == 0.5
    for r in worked:
        assert r.grads_equal is True, r
        assert r.evictions > 0 and r.rematerializations > 0, r
        assert r.peak_bytes <= unlimited.peak_bytes
        # A prediction from other measured op costs, so no equality; it must exist.
        assert r.twin_status == "ok" and r.twin_remats > 0, r
        assert r.predicted_step_s > unlimited.step_s, r
        assert (r.first_loss, r.last_loss) == (eager.first_loss, eager.last_loss)
    assert all(r.grads_equal is None and "needs" in r.error for r in failed)
    assert all(r.twin_status == "oom" and r.predicted_step_s is None for r in failed)
    # Per-block checkpoint recomputes the block forwards and holds less than unlimited;
    # its recomputation replays the same ops under the same RNG state: equal gradients.
    assert ckpt.run == "checkpoint" and ckpt.grads_equal is True
    assert 0 < ckpt.peak_bytes < unlimited.peak_bytes
    assert ckpt.rematerializations > 0 and ckpt.twin_status == ""
    # The file is the unlimited run's last step: its replay reaches the measured peak.
    trace = load_trace(path)
    assert trace.meta["runtime"]["budget"] is None
    assert runtime_peak(trace) == trace.meta["runtime"]["peak_bytes"] <= unlimited.peak_bytes


def test_cli_writes_table_and_files(tmp_path, capsys):
    argv = [
        "demo",
        "--steps",
        "1",
        "--batch",
        "2",
        "--ratios",
        "0.6",
        "--refine",
        "0",
        "--layers",
        "1",
        "--width",
        "32",
        "--heads",
        "2",
        "--block",
        "16",
        "--vocab",
        "64",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "lowest budget that works: 60.0%" in out
    assert "loss: first " in out and "twin" in out and "checkpoint" in out
    with open(tmp_path / "demo.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["eager", "unlimited", "60.0%", "checkpoint"]
    assert {r["regime"] for r in rows} == {"large"}  # the default regime
    assert rows[2]["grads_equal"] == "True" and rows[2]["twin_status"] == "ok"
    assert load_trace(tmp_path / "trace.npz").num_ops > 0
    pytest.importorskip("matplotlib")
    assert (tmp_path / "demo.png").stat().st_size > 0


TINY_ARGS = ["--steps", "1", "--batch", "2", "--ratios", "0.6", "--refine", "0"]
TINY_ARGS += ["--layers", "1", "--width", "32", "--heads", "2", "--block", "16", "--vocab", "64"]


@pytest.mark.parametrize(
    "regime, expected",
    [("large", [Regime.LARGE]), ("small", [Regime.SMALL]), ("both", [Regime.LARGE, Regime.SMALL])],
    ids=["large", "small", "both"],
)
def test_cli_regime_labels_tables_rows_and_files(regime, expected, tmp_path, capsys):
    """NOTE [ The demo ] rule 4: each regime run has its label above its table and in its
    numbers line (saying its sizes came from the options, which apply to every regime), its
    rows in demo.csv under its name; the first regime's trace and memory picture keep their
    names, a second's carry its name."""
    argv = ["demo", "--regime", regime, *TINY_ARGS, "--device", "cpu", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    labels = [f"{REGIMES[r].label} (sizes from the options)" for r in expected]
    others = [s.label for r, s in REGIMES.items() if r not in expected]
    # In order: a label above its table, its numbers line after it (and again at the end).
    starts = [out.index(f"{label}") for label in labels]
    assert starts == sorted(starts)
    assert out.count("tritondtr demo: 1-layer GPT of width 32") == len(labels)
    lines = [ln for ln in out.splitlines() if "tracked ops per step" in ln]
    assert len(lines) == (len(labels) if len(labels) == 1 else 2 * len(labels))
    assert all(any(ln.startswith(label) for ln in lines) for label in labels)
    assert not any(label in out for label in others)
    with open(tmp_path / "demo.csv") as f:
        rows = list(csv.DictReader(f))
    runs = ["eager", "unlimited", "60.0%", "checkpoint"]
    assert [(r["regime"], r["run"]) for r in rows] == [
        (e.value, run) for e in expected for run in runs
    ]
    assert all(r["grads_equal"] == "True" for r in rows if r["run"] != "eager")
    suffixes = ["", *(f"-{e.value}" for e in expected[1:])]
    for suffix in suffixes:
        assert load_trace(tmp_path / f"trace{suffix}.npz").num_ops > 0
        assert (tmp_path / f"memory{suffix}.csv").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("trace*.npz")) == sorted(
        f"trace{s}.npz" for s in suffixes
    )


def test_cli_regime_at_its_own_sizes_prints_its_bare_label(tmp_path, capsys, monkeypatch):
    """A regime run at its own sizes is named by its label alone, above its table and in its
    numbers line (the small regime made tiny here, so that the test takes seconds)."""
    tiny = dataclasses.replace(REGIMES[Regime.SMALL], config=TINY, batch=2, steps=1)
    monkeypatch.setitem(REGIMES, Regime.SMALL, tiny)
    argv = ["demo", "--regime", "small", "--ratios", "0.6", "--refine", "0", "--timeline"]
    assert main([*argv, "none", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tiny.label}\ntritondtr demo: 2-layer GPT of width 32")
    assert f"\n{tiny.label}: " in out and "sizes from the options" not in out


def test_cli_regime_default_is_large():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.regime == (Regime.LARGE,)
    assert (args.width, args.steps, args.batch) == (None, None, None)  # the regime's
    assert parser.parse_args(["--regime", "both"]).regime == (Regime.LARGE, Regime.SMALL)


@pytest.mark.parametrize(
    "bad",
    [["--steps", "0"], ["--ratios", "1.5"], ["--ratios", "x"], ["--regime", "medium"]],
    ids=["steps0", "ratios1.5", "ratiosx", "regime-medium"],
)
def test_cli_rejects_bad_arguments(bad, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["demo", *bad, "--out", str(tmp_path)])
    if bad[0] == "--regime":
        assert "expected large, small or both, got 'medium'" in capsys.readouterr().err


def test_tinygpt_is_initialised_as_gpt2():
    """NOTE [ GPT-2 initialisation ]: weights N(0, 0.02), residual projections scaled by
    1/sqrt(2 * layers), so the first loss is a uniform guess's, ln(vocab) (it was ~70)."""
    config = GPTConfig(vocab=64, block=64, width=128, layers=4, heads=4, dropout=0.0)
    torch.manual_seed(0)
    model = TinyGPT(config)
    blk, residual = model.blocks[-1], 0.02 / math.sqrt(2 * 4)
    for w, std in (
        (blk.qkv.weight, 0.02),
        (model.tok.weight, 0.02),
        (blk.proj.weight, residual),
        (blk.out.weight, residual),
    ):
        assert w.std().item() == pytest.approx(std, rel=0.03)
    assert torch.equal(blk.fc.bias, torch.zeros_like(blk.fc.bias))
    x, y = batches(config, 1, 8, 0, "cpu")[0]
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    assert loss == pytest.approx(math.log(64), abs=0.1)
