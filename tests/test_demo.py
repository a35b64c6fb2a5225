"""`tritondtr demo`, the main job, end to end at a tiny size: its exit status, its table and
its files say what the runs did, and every budgeted run's gradients equal the reference."""

import csv

import pytest
import torch

from tritondtr.cli import main
from tritondtr.demo import run_demo
from tritondtr.tinygpt import GPTConfig

TINY = GPTConfig(vocab=64, block=16, width=32, layers=2, heads=2, dropout=0.1)


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_run_demo_rows():
    rows = run_demo(TINY, steps=2, batch=2, ratios=(0.5, 0.001), refine=1, log=lambda _: None)
    eager, unlimited, *budgeted = rows
    assert eager.run == "eager" and eager.grads_equal is None
    assert unlimited.grads_equal is True and unlimited.evictions == 0
    assert unlimited.peak_bytes > 0
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
    assert all(r.grads_equal is None and "needs" in r.error for r in failed)


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
    with open(tmp_path / "demo.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["eager", "unlimited", "60.0%"]
    assert rows[2]["grads_equal"] == "True"
    pytest.importorskip("matplotlib")
    assert (tmp_path / "demo.png").stat().st_size > 0


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--ratios", "1.5"], ["--ratios", "x"]])
def test_cli_rejects_bad_arguments(bad, tmp_path):
    with pytest.raises(SystemExit):
        main(["demo", *bad, "--out", str(tmp_path)])
