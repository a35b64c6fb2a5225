"""The cut bound (NOTE [ Cut bound ], tritondtr/sim/bound.py) against independent optima:
revolve on chains, a brute-force search of every schedule on tiny graphs, and every
heuristic's replay on recorded zoo steps. A lower bound must never exceed any of them."""

import math

import pytest
import torch
import zoo
from test_sim_optimum import brute_force, tiny_graphs

import tritondtr
from tritondtr.sim import baseline, generators, runtime_peak, simulate
from tritondtr.sim.bound import cut_bound
from tritondtr.sim.checkmate import OpGraph
from tritondtr.sim.revolve import chain_optimum_extra


@pytest.mark.parametrize("n", [1, 12, 127])
def test_chain_bound_is_below_revolve_and_tight_when_loose(n):
    trace = generators.chain(n)
    budgets = list(range(1, n + 4))
    for sem, shift in (("paper", 0), ("runtime", 2)):  # runtime B = paper B + 2 units
        for b, lb in zip(budgets, cut_bound(trace, budgets, sem)):
            opt = chain_optimum_extra(n, b + shift)
            if opt is None:
                continue
            assert lb.status == "ok" and lb.extra_cost <= opt, (sem, b)
            assert lb.remats <= opt  # unit costs: one op run = 1 operation
    # With room for every activation but a few, the bound is the optimum: the cut before
    # the turn leaves n + 2 - B live units that each must be recomputed once.
    b = max(n - 2, 4)
    (lb,) = cut_bound(trace, [b], "paper")
    assert lb.extra_cost == chain_optimum_extra(n, b)


def test_chain_runtime_bound_is_infeasible_below_one_op():
    (lb,) = cut_bound(generators.chain(12), [1], "runtime")  # b_i reads g_i and a_(i-1)
    assert lb.status == "infeasible" and math.isinf(lb.extra_cost) and lb.op == "b"


@pytest.mark.parametrize("trace", list(tiny_graphs()), ids=lambda t: t.meta["name"])
def test_paper_bound_is_below_brute_force(trace):
    g = OpGraph.from_trace(trace)
    top = g.constant_bytes + int(g.size.sum()) + 1
    budgets = list(range(1, top + 1))
    for b, lb in zip(budgets, cut_bound(trace, budgets, "paper")):
        ref = brute_force(g, b)
        if ref is None:
            continue  # the bound may or may not see the infeasibility
        assert lb.status == "ok" and lb.extra_cost <= ref + 1e-9, b


def test_bound_is_below_every_heuristic_on_a_recorded_step():
    torch.manual_seed(0)
    case = zoo.make("gpt", seed=0, scale=1)
    opt = torch.optim.Adam(case.model.parameters(), lr=1e-3)
    with tritondtr.trace() as rec:
        zoo.train_step(case, opt)
    trace = rec.trace
    peak, const = runtime_peak(trace), baseline(trace).constant_bytes
    budgets = [int(r * peak) for r in (0.8, 0.5, 0.3, 0.15)]
    rt = cut_bound(trace, budgets, "runtime")
    pp = cut_bound(trace, [b + const for b in budgets], "paper")
    assert any(lb.extra_cost > 0 for lb in rt)  # not vacuous
    for b, lb, lp in zip(budgets, rt, pp):
        for h in ("dtr_eq", "lru"):
            res = simulate(trace, h, budget=b, semantics="runtime")
            if res.ok:
                assert lb.extra_cost <= res.remat_compute and lb.remats <= res.remats, (h, b)
        res = simulate(trace, "dtr_eq", budget=b + const, overhead_limit=10.0)
        if res.ok:
            assert lp.extra_cost <= res.remat_compute and lp.remats <= res.remats, b


def test_bound_rejects_unknown_semantics():
    with pytest.raises(ValueError, match="semantics must be 'paper' or 'runtime'"):
        cut_bound(generators.chain(3), [4], "twin")
