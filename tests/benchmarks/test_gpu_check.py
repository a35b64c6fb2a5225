"""``benchmarks/gpu_check.py --tiny``: every stage of the GPU check on the CPU at toy sizes, so
the command a GPU session runs cannot rot (NOTE [ GPU check ] in that script)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402


@pytest.mark.slow
def test_every_stage_passes_tiny(tmp_path, capsys):
    rc = gpu_check.main(["--tiny", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    ok = {"ok", "skipped"} if importlib.util.find_spec("transformers") is None else {"ok"}
    bad = {r["stage"]: r["why"] for r in summary["stages"] if r["status"] not in ok}
    assert not bad, bad  # without transformers the GPT-2 stages skip, saying why
    assert rc == 0
    stages = [r["stage"] for r in summary["stages"]]
    assert stages == [name for name, _, _ in gpu_check_stages().STAGES]
    assert all(v == "ok" for v in summary["checks"].values())
    for name in ("summary.md", "rows.csv", "log.txt", "gpu_tests.txt"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back


def gpu_check_stages():
    import gpu_check_stages

    return gpu_check_stages


def test_unknown_stage_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--tiny", "--out", str(tmp_path), "--only", "nope"])
    assert "unknown stage" in capsys.readouterr().err


def test_a_broken_stage_does_not_stop_the_run(tmp_path, monkeypatch):
    import gpu_check_stages as st

    def broken(ctx):
        raise RuntimeError("boom")

    def failing(ctx):
        ctx.check("a wrong bit", False, "1 != 2")

    monkeypatch.setattr(
        st, "STAGES", [("broken", 5, broken), ("failing", 5, failing), ("env", 30, st.stage_env)]
    )
    rc = gpu_check.main(["--tiny", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["status"] for r in summary["stages"]] == ["error", "failed", "ok"]
    assert "boom" in summary["stages"][0]["why"]
    assert rc == 1
