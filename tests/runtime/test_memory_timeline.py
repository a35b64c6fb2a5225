"""The memory timeline (``enable(timeline=True)``, NOTE [ Memory timeline ]) and its picture
(``tritondtr.plot_memory``, the demo's ``--timeline``): a row per op equal to the core's
accounting, the phases of a training step, nothing recorded when off."""

from __future__ import annotations

import csv

import pytest
import torch
import torch.nn.functional as F

import tritondtr
from tritondtr.cli import main
from tritondtr.runtime import session as session_module
from tritondtr.runtime import timeline as timeline_module
from tritondtr.runtime.timeline import Phase

PHASES = [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(33, 127), torch.nn.GELU(), torch.nn.Linear(127, 127), torch.nn.GELU(),
        torch.nn.Linear(127, 7),
    )  # fmt: skip


def _step(model, opt, x, y, *, log_loss=False):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if log_loss:  # between the backward and the step, as training loops log it
        loss.item()
    opt.step()
    return loss


def _train(budget, steps=1, **kw):
    """``steps`` AdamW steps of a small MLP in one session; its stats."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(31, 33, generator=g), torch.randint(0, 7, (31,), generator=g)
    with tritondtr.enable(budget, timeline=True) as s:
        for _ in range(steps):
            _step(model, opt, x, y, **kw)
    return s.stats


@pytest.fixture(scope="module")
def unlimited():
    return _train(None)


@pytest.fixture(scope="module")
def budgeted(unlimited):
    return _train(int(unlimited.peak_bytes * 0.4))


def test_each_row_is_the_cores_accounting_after_its_op():
    """One op per statement: the row of each op is what the stats say right after it."""
    x = torch.randn(1000)
    w = torch.randn(1000)
    seen = []
    with tritondtr.enable(budget=5 * 4000, timeline=True) as s:
        ys = []
        y = x
        for _ in range(12):
            y = torch.add(y, w)  # aten.add.Tensor, one op
            ys.append(y)
            seen.append((s.stats.resident_bytes, s.stats.evictions, s.stats.rematerializations))
        for y in reversed(ys):  # the evicted ones are recomputed: rematerializations
            z = torch.mul(y, 2.0)
            seen.append((s.stats.resident_bytes, s.stats.evictions, s.stats.rematerializations))
            del z
    tl = s.stats.timeline
    assert len(tl) == len(seen) + 1 and tl.name[-1] == "exit"
    assert tl.name[:2] == ("aten.add.Tensor", "aten.add.Tensor")
    assert tl.name[12] == "aten.mul.Tensor"
    rows = list(zip(tl.resident_bytes[:-1], tl.evictions[:-1], tl.rematerializations[:-1]))
    assert [tuple(int(v) for v in r) for r in rows] == seen
    assert s.stats.evictions > 0 and s.stats.rematerializations > 0


@pytest.mark.parametrize("run", ["unlimited", "budgeted"])
def test_last_row_peak_and_marks_are_the_stats(run, request):
    st = request.getfixturevalue(run)
    tl = st.timeline
    assert tl.budget == st.budget
    assert tl.name[-1] == "exit"
    assert tl.resident_bytes[-1] == st.resident_bytes
    assert tl.peak_bytes[-1] == st.peak_bytes > 0
    assert (tl.peak_bytes[1:] >= tl.peak_bytes[:-1]).all()
    assert (tl.resident_bytes <= tl.peak_bytes).all()
    # A peak reached in flight may lie above every sample (rule 4); none without evictions.
    assert tl.resident_bytes.max() <= st.peak_bytes
    if st.evictions == 0:
        assert tl.resident_bytes.max() == st.peak_bytes
    assert len(tl.eviction_ops()) == tl.evictions[-1] == st.evictions
    assert len(tl.remat_ops()) == tl.rematerializations[-1] == st.rematerializations
    assert (run == "budgeted") == (st.evictions > 0 and st.rematerializations > 0)


def test_the_budget_does_not_change_the_ops(unlimited, budgeted):
    """Recomputations run below the mode: the same step has the same rows at any budget."""
    assert unlimited.timeline.name == budgeted.timeline.name
    assert (unlimited.timeline.phase == budgeted.timeline.phase).all()


@pytest.mark.parametrize("run", ["unlimited", "budgeted"])
def test_phases_of_a_training_step_in_order(run, request):
    tl = request.getfixturevalue(run).timeline
    spans = tl.phase_spans()
    assert [p for p, _, _ in spans] == PHASES
    (_, f0, f1), (_, b0, b1), (_, o0, o1) = spans
    assert f0 == 0 and f1 == b0 and b1 == o0 and o1 == len(tl)
    assert tl.name[b0] == "aten.nll_loss_backward.default"
    # The optimizer's first parameter write froze the step (NOTE [ Parameter writes ]);
    # AdamW's step count and lazily made state came before it, already optimizer (rule 6).
    assert len(tl.freezes) == 1 and o0 < tl.freezes[0] < o1
    # What wrappers held left the count there; the rest (a freeze's recomputed ancestors,
    # counted in its row) is released by the next op.
    assert (tl.resident_bytes[tl.freezes[0] + 1 :] == 0).all()


def test_logging_the_loss_and_a_second_step_keep_the_order():
    tl = _train(None, steps=2, log_loss=True).timeline
    assert [p for p, _, _ in tl.phase_spans()] == PHASES * 2
    assert len(tl.freezes) == 2
    (_, _, _), (_, _, b1), *_ = tl.phase_spans()
    assert "aten._local_scalar_dense.default" in tl.name[:b1]  # loss.item(): still backward


def test_gradient_accumulation_starts_a_forward_again():
    """Two micro-batches, one optimizer step: rule 5 turns the second forward back."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 33), torch.randint(0, 7, (8,))
    with tritondtr.enable(None, timeline=True) as s:
        for half in (slice(0, 4), slice(4, 8)):
            F.cross_entropy(model(x[half]), y[half]).backward()
        opt.step()
    tl = s.stats.timeline
    assert [p for p, _, _ in tl.phase_spans()] == [*PHASES[:2], *PHASES]


def test_device_bytes_are_none_on_a_cpu_session(unlimited):
    tl = unlimited.timeline
    assert tl.device_bytes is None
    assert all(r["device_bytes"] is None for r in tl.as_rows())


def test_device_bytes_on_a_cuda_session(monkeypatch):
    """Rule 3 without a GPU: rows before the session's device is fixed get -1, then the
    device's ``memory_allocated``; the column exists once a CUDA device was seen."""
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 4097)
    rec = timeline_module.TimelineRecorder()
    st = tritondtr.SessionStats()
    rec.op(torch.ops.aten.add.Tensor, torch.ones(1), st, None)
    rec.op(torch.ops.aten.add.Tensor, torch.ones(1), st, torch.device("cuda", 1))
    rec.exit(st, torch.device("cuda", 1))
    tl = rec.snapshot(None)
    assert tl.device_bytes.tolist() == [-1, 4097, 4097]
    assert [r["device_bytes"] for r in tl.as_rows()] == [None, 4097, 4097]
    cpu = timeline_module.TimelineRecorder()
    cpu.op(torch.ops.aten.add.Tensor, torch.ones(1), st, torch.device("cpu"))
    assert cpu.snapshot(None).device_bytes is None


def test_nothing_is_recorded_when_off(monkeypatch):
    """Off, the session enters its plain mode: no recorder, no call per op."""

    def refuse(*args, **kwargs):
        raise AssertionError("a timeline was recorded with timeline=False")

    monkeypatch.setattr(timeline_module.TimelineRecorder, "__init__", refuse)
    monkeypatch.setattr(timeline_module.TimelineRecorder, "op", refuse)
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    with tritondtr.enable(budget=None) as s:
        assert type(s._mode) is session_module._Mode
        _step(model, opt, torch.randn(4, 33), torch.tensor([0, 1, 2, 3]))
    assert s.timeline is None and s.stats.timeline is None
    assert s.stats.ops > 0


def test_timeline_must_be_a_bool():
    with pytest.raises(ValueError, match="timeline must be a bool"):
        tritondtr.enable(timeline=1)


def test_sessions_with_a_timeline_do_not_nest_either():
    with tritondtr.enable(timeline=True), pytest.raises(RuntimeError, match="do not nest"):
        tritondtr.enable().__enter__()
    with tritondtr.enable(), pytest.raises(RuntimeError, match="do not nest"):
        tritondtr.enable(timeline=True).__enter__()


def test_plot_writes_the_picture_and_the_rows(tmp_path, budgeted, unlimited):
    pytest.importorskip("matplotlib")
    png, path = tritondtr.plot_memory(budgeted, tmp_path / "pic" / "memory.png", eager=unlimited)
    assert png == tmp_path / "pic" / "memory.png" and path == png.with_suffix(".csv")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for run, st in (("session", budgeted), ("eager", unlimited)):
        tl = st.timeline
        mine = [r for r in rows if r["run"] == run]
        assert [int(r["op"]) for r in mine] == list(range(len(tl)))
        assert [r["name"] for r in mine] == list(tl.name)
        assert [int(r["resident_bytes"]) for r in mine] == tl.resident_bytes.tolist()
        assert [int(r["peak_bytes"]) for r in mine] == tl.peak_bytes.tolist()
        assert int(mine[-1]["evictions"]) == st.evictions
        assert int(mine[-1]["rematerializations"]) == st.rematerializations
        assert [r["phase"] for r in mine] == [Phase(p).label for p in tl.phase]
        assert [i for i, r in enumerate(mine) if r["freeze"] == "True"] == tl.freezes.tolist()
        assert {r["device_bytes"] for r in mine} == {""}
        assert {r["budget_bytes"] for r in mine} == {"" if st.budget is None else str(st.budget)}
    # One timeline alone, as a CSV.
    alone = budgeted.timeline.to_csv(tmp_path / "alone.csv")
    with open(alone) as f:
        assert [r for r in csv.DictReader(f)] == [r for r in rows if r["run"] == "session"]


def test_plot_without_a_timeline_says_what_to_do(tmp_path, unlimited):
    with tritondtr.enable(budget=None) as s:
        torch.add(torch.ones(3), 1)
    with pytest.raises(ValueError, match=r"stats has no memory timeline.*timeline=True"):
        tritondtr.plot_memory(s.stats, tmp_path / "m.png")
    with pytest.raises(ValueError, match=r"eager has no memory timeline.*timeline=True"):
        tritondtr.plot_memory(unlimited, tmp_path / "m.png", eager=s.stats)
    with pytest.raises(ValueError, match=r"give a \.png path"):
        tritondtr.plot_memory(unlimited, tmp_path / "m.csv")
    assert not list(tmp_path.iterdir())


def test_demo_writes_the_memory_picture(tmp_path, capsys):
    n = torch.get_num_threads()
    try:
        argv = [
            "demo", "--steps", "1", "--batch", "2", "--ratios", "0.6", "--refine", "0",
            "--layers", "1", "--width", "32", "--heads", "2", "--block", "16", "--vocab", "64",
            "--device", "cpu", "--out", str(tmp_path),
        ]  # fmt: skip
        assert main(argv) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'memory.png'} and {tmp_path / 'memory.csv'}" in out
    assert "at 60.0% of the unlimited peak" in out
    with open(tmp_path / "memory.csv") as f:
        rows = list(csv.DictReader(f))
    runs = {r["run"] for r in rows}
    assert runs == {"session", "eager"}
    session = [r for r in rows if r["run"] == "session"]
    eager = [r for r in rows if r["run"] == "eager"]
    assert [r["name"] for r in session] == [r["name"] for r in eager]  # the same step
    assert int(session[-1]["rematerializations"]) > 0 and session[0]["budget_bytes"]
    assert {r["phase"] for r in session} == {"forward", "backward", "optimizer"}
    pytest.importorskip("matplotlib")
    assert (tmp_path / "memory.png").stat().st_size > 0


def test_demo_timeline_none_writes_no_picture(tmp_path, capsys):
    n = torch.get_num_threads()
    try:
        argv = [
            "demo", "--steps", "1", "--batch", "2", "--ratios", "0.6", "--refine", "0",
            "--layers", "1", "--width", "32", "--heads", "2", "--block", "16", "--vocab", "64",
            "--device", "cpu", "--timeline", "none", "--out", str(tmp_path),
        ]  # fmt: skip
        assert main(argv) == 0
    finally:
        torch.set_num_threads(n)
    assert "memory.png" not in capsys.readouterr().out
    assert not (tmp_path / "memory.csv").exists()


@pytest.mark.parametrize("bad", ["0", "1.5", "lowestt"])
def test_demo_refuses_a_bad_timeline(bad, tmp_path):
    with pytest.raises(SystemExit):
        main(["demo", "--timeline", bad, "--out", str(tmp_path)])
