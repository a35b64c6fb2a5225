"""``tritondtr.trace``: a recorded run is a well-formed trace of the program, its baseline
matches the runtime's accounting, and the simulator replays it (NOTE [ Recording a trace ])."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tests import zoo
from tritondtr.sim import EventKind, baseline, load_trace, save_trace, simulate
from tritondtr.traceformat.trace import Trace

_PROGRAM = ("kind", "arg", "op_name", "in_ptr", "inputs", "out_ptr", "size", "alias")
_ARRAYS = (*_PROGRAM, "op_cost")
NO_THRASH = math.inf  # the replays below test structure, not measured costs


def _step(name: str, **options):
    """One recorded training step of zoo model ``name`` after a warm-up step (Adam state),
    and the parameters after it."""
    case = zoo.make(name, seed=0)
    opt = torch.optim.Adam(case.model.parameters())
    zoo.train_step(case, opt)
    with tritondtr.trace(**options) as rec:
        zoo.train_step(case, opt)
    return rec, [p.detach().clone() for p in case.model.parameters()]


def _eager(name: str) -> list[torch.Tensor]:
    case = zoo.make(name, seed=0)
    opt = torch.optim.Adam(case.model.parameters())
    zoo.train_step(case, opt)
    zoo.train_step(case, opt)
    return [p.detach().clone() for p in case.model.parameters()]


def _same_arrays(a: Trace, b: Trace, names=_ARRAYS) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in names) and (
        a.names == b.names and a.annotations == b.annotations
    )


def _events(t: Trace) -> list[tuple]:
    """The event stream as readable tuples: (kind, op name, inputs, sizes, aliases) for ops,
    (kind, tensor) otherwise."""
    out = []
    for k, a in zip(t.kind.tolist(), t.arg.tolist()):
        k = EventKind(k)
        if k in (EventKind.CALL, EventKind.CONSTANT):
            lo, hi = t.out_ptr[a], t.out_ptr[a + 1]
            out.append(
                (
                    k.name,
                    t.names[t.op_name[a]],
                    t.inputs[t.in_ptr[a] : t.in_ptr[a + 1]].tolist(),
                    t.size[lo:hi].tolist(),
                    t.alias[lo:hi].tolist(),
                )
            )
        elif k == EventKind.ANNOTATE:
            out.append((k.name, t.annotations[a]))
        else:
            out.append((k.name, a))
    return out


def test_events_of_a_small_program():
    """Constants first, views as aliases, a 0-byte output for ``.item()``, releases when the
    last wrapper of a buffer dies, in-place writes copy-on-write, the rest output."""
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    with tritondtr.trace() as rec:
        h = x @ w
        v = h.view(-1)
        del h  # v still holds the buffer: nothing is released
        s = v.sum()
        s.item()
        del v
        a = x * 2
        a.add_(1)
    assert _events(rec.trace) == [
        ("CONSTANT", "constant", [], [128], [-1]),  # x
        ("CONSTANT", "constant", [], [256], [-1]),  # w
        ("CALL", "aten.mm.default", [0, 1], [128], [-1]),
        ("CALL", "aten.view.default", [2], [0], [0]),
        ("CALL", "aten.sum.default", [3], [4], [-1]),
        ("CALL", "aten._local_scalar_dense.default", [4], [0], [-1]),
        ("RELEASE", 5),
        ("RELEASE", 2),
        ("RELEASE", 3),
        ("CALL", "aten.mul.Tensor", [0], [128], [-1]),
        ("CALL", "aten.add_.Tensor", [6], [128], [-1]),
        ("RELEASE", 6),
        ("OUTPUT", 0),
        ("OUTPUT", 1),
        ("OUTPUT", 4),
        ("OUTPUT", 7),
    ]
    # The simulator counts the in-place write's new version before the old one is released
    # (copy-on-write); the runtime writes the buffer: exactly 128 bytes apart at that op.
    base = baseline(rec.trace)
    assert rec.stats.peak_bytes == 132
    assert base.peak_bytes - base.constant_bytes == rec.stats.peak_bytes + 128
    assert rec.trace.meta["recorder"]["inplace_bytes_max"] == 128


@pytest.mark.parametrize("name", ["mlp", "gpt", "cnn", "lstm", "treelstm"])
def test_baseline_peak_is_the_runtime_peak(name):
    """Unlimited budget: the trace's baseline peak without its constants is the runtime's
    measured peak, up to the in-place bound (NOTE [ Recording a trace ] rule 8); the
    recording does not change the run (parameters after the step equal eager, bit for bit)."""
    rec, params = _step(name)
    trace, st = rec.trace, rec.stats
    trace.validate()
    base = baseline(trace)
    diff = base.peak_bytes - base.constant_bytes - st.peak_bytes
    inplace = trace.meta["recorder"]["inplace_bytes_max"]
    assert 0 <= diff <= inplace
    if inplace == 0:
        assert diff == 0
    assert all(torch.equal(p, q) for p, q in zip(params, _eager(name)))
    # Every tracked op is a CALL (NOTE [ Recording a trace ] rule 5).
    rmeta = trace.meta["recorder"]
    assert rmeta["ops"] == trace.num_ops - rmeta["constants"]
    assert rmeta["ops"] == st.ops
    assert trace.meta["runtime"]["peak_bytes"] == st.peak_bytes
    assert trace.meta["runtime"]["evictions"] == 0
    assert "BACKWARD" in trace.annotations


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".npz", ".npz.gz"])
def test_file_round_trip(tmp_path, suffix):
    path = tmp_path / f"step{suffix}"
    case = zoo.make("mlp", seed=0)
    opt = torch.optim.Adam(case.model.parameters())
    with tritondtr.trace(path, meta={"model": "mlp"}) as rec:
        zoo.train_step(case, opt)
    loaded = load_trace(path)
    assert _same_arrays(loaded, rec.trace)
    assert loaded.meta["model"] == "mlp"
    assert loaded.meta["runtime"]["peak_bytes"] == rec.stats.peak_bytes
    assert baseline(loaded) == baseline(rec.trace)


def test_replay_at_a_ratio_and_the_cli(tmp_path):
    rec, _ = _step("gpt", path=tmp_path / "gpt.npz")
    r = simulate(rec.trace, "dtr_eq", ratio=0.5, overhead_limit=NO_THRASH)
    assert r.status == "ok" and r.evictions > 0 and r.remats > 0
    assert r.peak_bytes <= r.budget
    from tritondtr.cli import main

    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                str(tmp_path / "gpt.npz"),
                "--heuristics",
                "dtr_eq",
                "--ratios",
                "1.0,0.5",
                "--overhead-limit",
                "1000",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "results.csv").read_text().count("\n") == 3  # header + two rows


def test_runtime_and_simulator_at_half_the_baseline():
    """The runtime at 50 % of its baseline records the same program as the unlimited run
    (rematerializations are not events); the simulator replays it at that budget, with the
    constants added (the runtime does not count them). The simulator makes room for an op's
    outputs before it runs (memory + outputs <= budget), the runtime only for its inputs
    (peak <= budget + max_op_out_bytes), so the simulator is run at both ends of that gap."""
    free, _ = _step("gpt")
    full = free.stats.peak_bytes
    budget = full // 2
    rec, params = _step("gpt", budget=budget)
    st = rec.stats
    assert all(torch.equal(p, q) for p, q in zip(params, _eager("gpt")))
    assert st.evictions > 0 and st.rematerializations > 0
    assert st.peak_bytes <= budget + st.max_op_out_bytes
    assert _same_arrays(rec.trace, free.trace, _PROGRAM)
    assert rec.trace.meta["runtime"]["evictions"] == st.evictions
    assert rec.trace.meta["runtime"]["rematerializations"] == st.rematerializations
    const = baseline(rec.trace).constant_bytes
    for slack in (0, st.max_op_out_bytes):
        r = simulate(rec.trace, "dtr_eq", budget=budget + const + slack, overhead_limit=NO_THRASH)
        assert r.status == "ok", (slack, r)
        assert r.evictions > 0 and r.remats > 0
        assert r.peak_bytes <= budget + const + slack


def test_trace_after_an_error_and_bad_arguments(tmp_path):
    path = tmp_path / "t.jsonl"
    x = torch.randn(16, requires_grad=True)
    rec = tritondtr.trace(path)
    with pytest.raises(KeyError), rec:
        y = x * 2
        raise KeyError("user error")
    del y
    assert rec.trace is not None and rec.trace.num_ops == 2  # the constant and the mul
    assert not path.exists()  # written only on a clean exit
    with pytest.raises(RuntimeError, match="entered once"), rec:
        pass
    with pytest.raises(ValueError, match=r"\.npz or \.jsonl"):
        tritondtr.trace(tmp_path / "t.txt")
    with pytest.raises(ValueError, match="stress"):
        tritondtr.trace(budget=1 << 20, stress=True)
    with pytest.raises(ValueError, match="meta"):
        tritondtr.trace(meta=["model"])


@pytest.mark.parametrize("fmt", ["memory", "jsonl", "npz"])
@pytest.mark.parametrize("trigger", ["caught_budget_error", "evict_all"])
def test_twin_counts_match_a_run_with_session_side_work(trigger, fmt, tmp_path):
    """NOTE [ Recording a trace ] rule 8 and NOTE [ The twin ] rule 7: a caught BudgetError's
    work and session.evict_all() are events the twin replays, through both file formats. Found by
    the differential fuzzer (24f9447)."""
    import tritondtr
    from tritondtr.sim import load_trace, simulate

    x = torch.randn(64, 64, requires_grad=True)
    budget = 56 * 1024 if trigger == "caught_budget_error" else 1 << 20
    with tritondtr.trace(None, budget=budget, cost="analytic") as rec:
        h, hs = x, []
        for _ in range(4):
            h = (h @ x).tanh()
            hs.append(h)
        if trigger == "evict_all":
            rec.session.evict_all()
        with contextlib.suppress(rt.BudgetError):  # documented: the session stays usable
            torch.cat(hs * 3)
        h.sum().backward()
    trace = rec.trace
    if fmt != "memory":
        trace = load_trace(save_trace(trace, tmp_path / f"t.{fmt}"))
    m = trace.meta["runtime"]
    assert m["evictions"] > 0
    r = simulate(trace, m["heuristic"], budget=budget, semantics="runtime", overhead_limit=None)
    assert (r.evictions, r.remats, r.peak_bytes) == (
        m["evictions"],
        m["rematerializations"],
        m["peak_bytes"],
    )
