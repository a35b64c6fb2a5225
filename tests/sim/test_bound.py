"""The cut and support bounds (NOTE [ Cut bound ], NOTE [ Support bound ],
tritondtr/sim/bound.py) against independent optima: revolve on chains, a brute-force search
of every schedule on tiny graphs, hand-made traces whose optimum is plain, and every
heuristic's replay on recorded zoo steps. A lower bound must never exceed any of them."""

import csv
import math

import pytest
import torch

import tritondtr
from tests import zoo
from tests.sim.test_optimum import brute_force, tiny_graphs
from tritondtr.cli import main
from tritondtr.sim import TraceBuilder, baseline, generators, runtime_peak, save_trace, simulate
from tritondtr.sim.bound import cut_bound, support_bound
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


def _released_parent(parent_size: int = 8, release: bool = True):
    """``v = g(f(x))`` is read at the end; ``f``'s output (cost 10) is released at once when
    ``release``; in between, ``h2`` reads ``y`` while ``v`` is live."""
    b = TraceBuilder()
    x = b.constant(8, name="x")
    (a,) = b.call("f", [x], sizes=[parent_size], cost=10.0)
    (v,) = b.call("g", [a], sizes=[8], cost=1.0)
    if release:
        b.release(a)
    (y,) = b.call("h", [x], sizes=[8], cost=1.0)
    (w,) = b.call("h2", [y], sizes=[8], cost=1.0)
    b.release(y)
    b.release(w)
    b.call("k", [v], sizes=[8], cost=1.0)
    return b.build()


def test_support_bound_prices_the_released_parent():
    # At h2's cut only y fits (8 bytes): v is brought back later, and its parent, released
    # before the cut, with it: 1 + 10. The cut bound sees g's cost alone; the twin pays both.
    trace = _released_parent()
    (cut,) = cut_bound(trace, [8], "runtime")
    (sup,) = support_bound(trace, [8])
    res = simulate(trace, "dtr_eq", budget=8, semantics="runtime")
    assert (cut.extra_cost, sup.extra_cost, res.remat_compute) == (1.0, 11.0, 11.0)
    assert sup.status == "ok" and sup.op == "h2"
    (free,) = support_bound(trace, [16])  # room for v beside y: nothing to recompute
    assert free.extra_cost == 0.0


def test_support_bound_keeps_a_held_parent_when_it_fits():
    # f's output is never released: a 4-byte buffer still held is kept beside y (8 + 4 <=
    # 12) and only g runs again; with no room beside y (budget 8), f runs again too.
    for size, budget, want in ((4, 12, 1.0), (8, 8, 11.0)):
        trace = _released_parent(size, release=False)
        (sup,) = support_bound(trace, [budget])
        res = simulate(trace, "dtr_eq", budget=budget, semantics="runtime")
        assert sup.extra_cost == want and res.ok and res.remat_compute >= want, size
    # A linear program, not the integer optimum: with room for half of v (budget 12, an
    # 8-byte f output), half of v is kept and half of f and g run again: 5.5, below 11.
    (half,) = support_bound(_released_parent(8, release=False), [12])
    assert half.extra_cost == 5.5


@pytest.mark.parametrize("n", [12, 127])
def test_chain_support_bound_is_below_revolve(n):
    trace = generators.chain(n)
    budgets = list(range(1, n + 4))
    for b, cut, sup in zip(
        budgets, cut_bound(trace, budgets, "runtime"), support_bound(trace, budgets)
    ):
        assert sup.status == cut.status
        opt = chain_optimum_extra(n, b + 2)  # runtime B = paper B + 2 units
        if opt is None:
            continue
        assert cut.extra_cost <= sup.extra_cost <= opt + 1e-9, b


@pytest.mark.parametrize("name", ["lstm", "gpt", "treelstm"])
def test_support_bound_is_below_every_heuristic_on_a_recorded_step(name):
    torch.manual_seed(0)
    case = zoo.make(name, seed=0, scale=1)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-3)
    with tritondtr.trace() as rec:
        zoo.train_step(case, opt)
    trace = rec.trace
    peak = runtime_peak(trace)
    budgets = [int(r * peak) for r in (0.8, 0.5, 0.3)]
    cut = cut_bound(trace, budgets, "runtime")
    sup = support_bound(trace, budgets, cuts=64)
    assert any(s.extra_cost > c.extra_cost for s, c in zip(sup, cut))  # not the cut bound
    for b, c, s in zip(budgets, cut, sup):
        assert s.status == c.status and s.extra_cost >= c.extra_cost and s.remats == c.remats
        for h in ("dtr_eq", "dtr", "msps", "lru"):
            res = simulate(trace, h, budget=b, semantics="runtime")
            if res.ok:
                assert s.extra_cost <= res.remat_compute * (1 + 1e-9), (h, b)


def test_bounds_skip_a_call_that_raised_budget_error():
    # The program caught the BudgetError of ``a + b`` (8,000 bytes of inputs under 6,000):
    # the twin replays that outcome as ok, so neither bound may call the budget infeasible.
    x = torch.randn(1000)
    with tritondtr.trace(budget=6000) as rec:
        a, b = x * 2, x * 3
        with pytest.raises(tritondtr.BudgetError):
            a + b
        del a
        (b * 2).sum()
    trace = rec.trace
    res = simulate(trace, "dtr_eq", budget=6000, semantics="runtime")
    (cut,) = cut_bound(trace, [6000], "runtime")
    (sup,) = support_bound(trace, [6000])
    assert res.ok and cut.status == sup.status == "ok"
    assert sup.extra_cost <= res.remat_compute


def test_support_bound_does_not_count_a_frozen_input():
    # ``a`` is frozen (outside the budget) when ``h`` reads it: the room at h's cut is the
    # whole budget. Counting a's 8 bytes there claimed g0 or g1 (cost 10) must run again.
    b = TraceBuilder()
    x = b.constant(8, name="x")
    (a,) = b.call("f", [x], sizes=[8], cost=1.0)
    b.freeze()
    v = [b.call(f"g{i}", [x], sizes=[8], cost=c)[0] for i, c in enumerate((10.0, 10.0, 1.0))]
    b.release(b.call("h", [a], sizes=[8], cost=1.0)[0])
    b.release(b.call("k01", v[:2], sizes=[1], cost=1.0)[0])
    b.release(b.call("k2", v[2:], sizes=[1], cost=1.0)[0])
    trace = b.build()
    for budget in (17, 18, 20, 23):
        (sup,) = support_bound(trace, [budget])
        res = simulate(trace, "dtr_eq", budget=budget, semantics="runtime")
        assert res.ok and sup.extra_cost <= res.remat_compute == 1.0, budget


@pytest.mark.parametrize("semantics", ["runtime", "paper"])
def test_simulate_cli_prints_and_writes_the_bound(tmp_path, capsys, semantics):
    path = tmp_path / "chain.npz"
    save_trace(generators.chain(12), path)
    out = tmp_path / "out"
    argv = ["simulate", str(path), "--semantics", semantics, "--ratios", "0.7,0.5"]
    argv += ["--heuristics", "dtr_eq", "--bound", "--no-plot", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    which = "support bound" if semantics == "runtime" else "cut bound"
    assert f"lower bound of any schedule ({which})" in text
    rows = list(csv.DictReader((out / "bounds.csv").read_text().splitlines()))
    results = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert [int(r["budget"]) for r in rows] == sorted({int(r["budget"]) for r in results})[::-1]
    for r in rows:
        run = next(x for x in results if x["budget"] == r["budget"])
        assert r["status"] == "ok"
        assert (
            1.0 <= float(r["overhead_bound"]) <= float(run["overhead"]) == float(r["best_overhead"])
        )
