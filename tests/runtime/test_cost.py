"""Cost models (NOTE [ Cost models ] in tritondtr/runtime/cost.py): the analytic cost makes a
run's decisions independent of wall time (two runs agree exactly, and the twin replays the
recorded trace to the same counts); a callable's costs are the ones scored and recorded; a bad
cost is a clear error that leaves nothing behind; gradients equal eager under every model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import tritondtr
import tritondtr.runtime as rt
from tests import zoo
from tritondtr.engine.residency import FREE
from tritondtr.runtime import AnalyticCost, CostError, CostModel
from tritondtr.sim import simulate

aten = torch.ops.aten


def _factory(name: str):
    case = zoo.make(name, seed=0)
    opt = torch.optim.Adam(case.model.parameters(), lr=1e-2)
    return case, lambda: zoo.train_step(case, opt)


_PEAKS: dict = {}


def _peak(name: str) -> int:
    if name not in _PEAKS:
        with tritondtr.enable() as s:
            _factory(name)[1]()
        _PEAKS[name] = s.stats.peak_bytes
    return _PEAKS[name]


def _record(name: str, frac: float, cost):
    with tritondtr.trace(budget=int(frac * _peak(name)), cost=cost) as rec:
        _factory(name)[1]()
    return rec


def _counts(rec) -> tuple[int, int, int]:
    st = rec.stats
    return st.evictions, st.rematerializations, st.peak_bytes


def _uniform(op, args, kwargs, out) -> float:
    return 7.0


# ---------------------------------------------------------------- the analytic formula
def test_analytic_cost_is_flops_and_bytes_on_the_nominal_machine():
    a, b = torch.randn(127, 1000), torch.randn(1000, 3)
    out = a @ b
    m = AnalyticCost()
    flops, nbytes = 2 * 127 * 1000 * 3, 4 * (127 * 1000 + 1000 * 3 + 127 * 3)
    want = 2000.0 + flops * 1e9 / 1e13 + nbytes * 1e9 / 1e12
    assert m(aten.mm.default, (a, b), {}, out) == pytest.approx(want, rel=1e-12)
    # no FLOP formula: bytes read and written only (a view's elements, not its storage)
    x = torch.randn(4097)[1:]
    y = x + 1
    assert m(aten.add.Tensor, (x, 1), {}, y) == pytest.approx(2000.0 + 8 * 4096 * 1e9 / 1e12)
    # other constants, and an empty op costs op_ns alone (> 0)
    e = torch.empty(0)
    assert AnalyticCost(op_ns=1.0)(aten.clone.default, (e,), {}, e.clone()) == 1.0


def test_analytic_cost_of_a_convolution_uses_torch_flop_formula():
    x, w = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    m = AnalyticCost(flops_per_s=1e9, bytes_per_s=1e30, op_ns=1.0)
    flops = 2 * 2 * 5 * 7 * 7 * 3 * 3 * 3  # 2 x N x Cout x Hout x Wout x Cin x kh x kw
    assert m(aten.convolution.default, args, {}, out) == pytest.approx(1.0 + flops)


@pytest.mark.parametrize("kw", [{"op_ns": 0}, {"flops_per_s": -1.0}, {"bytes_per_s": math.inf}])
def test_analytic_constants_are_validated(kw):
    with pytest.raises(ValueError, match="finite number > 0"):
        AnalyticCost(**kw)


# --------------------------------------------------------------------- determinism
@pytest.mark.parametrize("name", ["gpt", "treelstm"])
def test_analytic_runs_decide_alike_and_the_twin_replays_them(name):
    one, two = _record(name, 0.5, "analytic"), _record(name, 0.5, "analytic")
    assert one.stats.evictions > 0  # the budget binds
    assert _counts(one) == _counts(two)
    assert np.array_equal(one.trace.op_cost, two.trace.op_cost)
    assert one.trace.meta["cost_model"] == "analytic"
    m = one.trace.meta["runtime"]
    res = simulate(
        one.trace, m["heuristic"], budget=m["budget"], semantics="runtime", overhead_limit=None
    )
    assert (res.evictions, res.remats, res.peak_bytes) == _counts(one)


def test_recorded_costs_are_the_analytic_costs():
    seen = []
    model = AnalyticCost()

    def spy(op, args, kwargs, out):
        c = model(op, args, kwargs, out)
        seen.append(c)
        return c

    rec = _record("mlp", 0.5, spy)
    ops = rec.trace.op_cost[~rec.trace.is_constant_op()]
    assert np.array_equal(ops, np.array(seen))
    # the callable that is the analytic model makes the analytic run
    assert _counts(rec) == _counts(_record("mlp", 0.5, "analytic"))
    assert rec.trace.meta["cost_model"].startswith("callable:")


def test_a_callable_cost_is_scored_and_recorded():
    calls = []

    def cost(op, args, kwargs, out):
        calls.append((type(op), all(type(a) is not rt.DTRTensor for a in args)))
        return 7

    rec = _record("cnn", 0.5, cost)
    ops = rec.trace.op_cost[~rec.trace.is_constant_op()]
    assert len(ops) == len(calls) == rec.stats.ops and set(ops) == {7.0}
    assert set(calls) == {(torch._ops.OpOverload, True)}  # the overload; plain tensors only
    # uniform costs: the core scored every storage with 7.0 per op of its recipe (a fused
    # in-place chain counts its ops: NOTE [ Fused versions ] in core/core.py)
    core = rec.session.core
    live = [sid for sid in range(len(core.cost)) if core.state[sid] != FREE]
    assert live and {core.cost[sid] / core.links.get(sid, 1) for sid in live} == {7.0}


def test_measured_is_named_in_the_trace():
    with tritondtr.trace(cost="measured") as rec:
        torch.randn(8, requires_grad=True).exp().sum().backward()
    assert rec.session.config.cost is CostModel.MEASURED
    assert rec.trace.meta["cost_model"] == "measured"


# ----------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cost", ["fast", 3, None])
def test_an_unknown_cost_model_is_refused(cost):
    with pytest.raises(ValueError, match=r"measured.*analytic.*callable"):
        tritondtr.enable(cost=cost)


def _raises(op, args, kwargs, out):
    raise KeyError("no table entry")


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda *a: math.nan, r"not finite and > 0 .*nan"),
        (lambda *a: -1.0, r"not finite and > 0 .*-1.0"),
        (lambda *a: 0, r"not finite and > 0 .*0"),
        (lambda *a: math.inf, r"not finite and > 0 .*inf"),
        (lambda *a: "5", "returned a str"),
        (lambda *a: None, "returned a NoneType"),
        (lambda *a: torch.tensor(1.0), "returned a Tensor"),
        (lambda *a: True, "returned a bool"),
        (_raises, "raised KeyError: 'no table entry'"),
    ],
    ids=["nan", "negative", "zero", "inf", "str", "none", "tensor", "bool", "raises"],
)
def test_a_bad_cost_is_a_clear_error_that_leaves_nothing_behind(fn, match):
    case, step = _factory("mlp")
    budget = _peak("mlp") // 2
    with pytest.raises(CostError, match=match) as info, tritondtr.enable(budget, cost=fn) as s:
        step()
    msg = str(info.value)
    assert "aten." in msg and "cost='analytic'" in msg  # names the op; says what to do
    assert s.closed and not _get_current_dispatch_mode_stack()
    assert all(p.grad is None for p in case.model.parameters())
    # the next session and eager code run as if nothing happened
    ref, ref_step = _factory("mlp")
    loss = ref_step()
    case, step = _factory("mlp")
    with tritondtr.enable(budget=_peak("mlp") // 2, cost="analytic"):
        got = rt.unwrap(step().detach())
    assert torch.equal(got, loss.detach())
    for p, q in zip(case.model.parameters(), ref.model.parameters()):
        assert type(p.grad) is torch.Tensor and torch.equal(p.grad, q.grad)


def test_numpy_and_int_costs_are_floats():
    rec = _record("mlp", 0.5, lambda *a: np.float32(2.5))
    assert set(rec.trace.op_cost[~rec.trace.is_constant_op()]) == {2.5}


# --------------------------------------------------------------------- gradients
@pytest.mark.parametrize("cost", ["analytic", "uniform"])
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_gradients_equal_eager_under_every_cost_model(name, cost):
    ref, ref_step = _factory(name)
    ref_loss = ref_step().detach()
    case, step = _factory(name)
    budget = int(0.3 * _peak(name))
    with tritondtr.enable(budget=budget, cost=_uniform if cost == "uniform" else cost) as s:
        loss = rt.unwrap(step().detach())
    assert s.stats.evictions > 0
    assert torch.equal(loss, ref_loss)
    for (n, p), (_, q) in zip(case.model.named_parameters(), ref.model.named_parameters()):
        assert type(p.grad) is torch.Tensor and torch.equal(p.grad, q.grad), n
        assert torch.equal(p.detach(), q.detach()), n
