"""NOTE [ Unheld storages ] in tritondtr/core/unheld.py: a resident storage no wrapper holds is
scored by its evicted ancestors, not by its evicted descendants' class; the core is driven
directly with a counting executor."""

from __future__ import annotations

import pytest
import torch

import tritondtr
from tests.core_executor import Counting
from tritondtr.core import Core
from tritondtr.core.unheld import UnheldScorer
from tritondtr.engine.residency import EVICTED, RESIDENT
from tritondtr.sim import runtime_peak
from tritondtr.sim.twin import replay_runtime


def scene(heuristic: str, root_cost: float, drop_root: bool = False):
    """``a -> b -> c`` and ``b -> d -> e`` (100 bytes each, ``a`` of cost ``root_cost``),
    ``x`` (cost 50) alone, one op per clock tick (``x`` at 6). ``b`` (cost 1) and ``d`` (cost
    1000) lose their wrappers; ``c`` is evicted and recomputed (clock 7 and 8), which
    recomputes ``b`` as an input: ``b`` is resident, unheld (last access 2), and borders
    ``d``'s class. ``drop_root``: ``a`` is evicted before, and recomputed too."""
    ex = Counting()
    core = Core(10**6, heuristic, ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    sid = {}
    for name, cost, parents in (
        ("a", root_cost, ()),
        ("b", 1.0, ("a",)),
        ("c", 1.0, ("b",)),
        ("d", 1000.0, ("b",)),
        ("e", 1.0, ("d",)),
        ("x", 50.0, ()),
    ):
        core.begin(name)
        sid[name] = core.new(100, cost, tuple(sid[p] for p in parents), name)
        core.end()
    core.release(sid["b"])
    core.release(sid["d"])
    if drop_root:
        core.drop(sid["a"])
    core.drop(sid["c"])
    core.materialize(sid["c"])
    core.unlock(sid["c"])
    return core, ex, sid


@pytest.mark.parametrize("heuristic", ["dtr_eq", "dtr"])
def test_an_unheld_intermediate_is_scored_by_its_ancestors(heuristic):
    core, ex, s = scene(heuristic, 200.0)
    assert ex.recomputed == [s["b"], s["c"]]
    assert core.state[s["b"]] == RESIDENT and not core.held[s["b"]]
    assert core.now == 8
    # the engine alone: b's neighbourhood holds d (1000): (1 + 1000) / (100 x 6) = 1.67;
    # x: 50 / (100 x 2) = 0.25 is the lowest (a: 200 / (100 x 7) = 0.29)
    assert core.engine.select(core.now, 1) == [core.eslot[s["x"]]]
    assert core.evict_one()
    # the rule: b costs its own 1 (a is resident): 1 / (100 x 6) = 0.0017
    assert core.state[s["b"]] == EVICTED and core.state[s["x"]] == RESIDENT
    assert core.stats.evictions == 1 and core.stats.rematerializations == 2
    assert core.evict_one()  # the next choice drops b from the rule's candidates (rule 4)
    assert core.state[s["x"]] == EVICTED and core.scorer.unheld == {}
    core.check_invariants()


def test_expensive_ancestors_keep_an_unheld_intermediate():
    core, ex, s = scene("dtr_eq", 5000.0, drop_root=True)
    assert ex.recomputed == [s["a"], s["b"], s["c"]] and core.now == 9
    core.drop(s["a"])  # b's recomputation needs a again: (1 + 5000) / (100 x 7) = 7.1
    assert core.evict_one()
    assert core.state[s["x"]] == EVICTED and core.state[s["b"]] == RESIDENT
    assert list(core.scorer.unheld) == [s["b"]]
    core.check_invariants()


def test_other_heuristics_keep_the_engine_victim():
    core, _, s = scene("lru", 200.0)  # lru's victim is a; the rule would take b
    assert core.engine.select(core.now, 1) == [core.eslot[s["a"]]]
    assert core.evict_one()
    assert core.state[s["a"]] == EVICTED and core.state[s["b"]] == RESIDENT


def test_the_rule_rests_once_backward_storages_were_forced_out():
    """Rule 5: after the budget unpinned backward storages, the engine's victim stands until
    the step's freeze."""
    core, _, s = scene("dtr_eq", 200.0)
    g = core.new(100, 1.0, (s["e"],), "grad", backward=True)  # pinned (Backward storages)
    assert g in core.pins.out and core.eslot[g] < 0  # ibid. rule 5: out of the engine
    assert core._unpin_backward() and core.pins.forced  # what make_room does when nothing is left
    assert core.engine.is_candidate(core.eslot[g])  # admitted, then unpinned
    victim = core.engine.choose(core.now)
    assert victim == core.eslot[s["x"]]  # the engine alone (see the first test)
    assert core.evict_one()
    assert core.state[s["x"]] == EVICTED and core.state[s["b"]] == RESIDENT
    core.freeze()  # the step ends: every held storage becomes external, the rule is back
    assert not core.pins.forced
    core.check_invariants()


@pytest.mark.parametrize("heuristic", ["dtr_eq", "dtr"])
def test_an_unheld_engine_victim_is_scored_by_its_ancestors_too(heuristic):
    """Rule 4: the engine's victim ``p`` is itself unheld; scored by its engine score alone it
    would lose to ``q``, whose own-and-ancestors score lies between p's two scores."""
    core = Core(10**6, heuristic, Counting(), backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    s = {}
    for name, cost, parents in (
        ("a", 10000.0, ()),
        ("x", 5.0, ()),
        ("p", 1.0, ("a",)),
        ("pc", 10.0, ("p",)),
        ("q", 1.0, ("x",)),
        ("qc", 1000.0, ("q",)),
    ):
        core.begin(name)
        s[name] = core.new(100, cost, tuple(s[n] for n in parents), name)
        core.end()
    core.release(s["p"])
    core.release(s["q"])
    for name in ("pc", "qc", "x"):
        core.drop(s[name])
    for name in ("pc", "qc"):  # recomputes p, and x then q: both resident, unheld
        core.materialize(s[name])
        core.unlock(s[name])
    for name in ("x", "pc", "qc"):
        core.drop(s[name])
    assert list(core.scorer.unheld) == [s["p"], s["q"]]
    # engine: p (1 + 10) / (100 x 8) = 0.0138, q (1 + 1005 + ...) / ... = 1.68; the rule:
    # p 1 / (100 x 8) = 0.0013 (a is resident), q (1 + 5) / (100 x 6) = 0.01 (x evicted)
    assert core.engine.select(core.now, 1) == [core.eslot[s["p"]]]
    assert core.evict_one()
    assert core.state[s["p"]] == EVICTED and core.state[s["q"]] == RESIDENT
    core.check_invariants()


@pytest.mark.parametrize("held", [False, True])
def test_a_version_chain_is_rebuilt_in_one_buffer(held):
    """NOTE [ Consumed versions ] in tritondtr/core/remat.py: ``a`` (an op's output, also read
    by ``r``) written in place twice (``b``, ``c``: new versions; ``c`` absorbs ``b``, NOTE
    [ Fused versions ] in core.py, and is a version of ``a``). ``c`` is evicted, then asked
    for: ``a`` is recomputed on the way, and ``c``'s replay consumes it (unheld, read once,
    locked only by the recomputation), unless a wrapper still holds it."""
    ex = Counting()
    core = Core(10**6, "dtr_eq", ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    core.begin("a")
    a = core.new(100, 5.0, (), "a")
    core.end()
    core.begin("r")
    r = core.new(100, 1.0, (a,), "r")  # a second reader of a: b keeps a as its parent
    core.end()
    core.drop(r)
    core.begin("b")
    core.hand_out(a)  # the in-place op's old version (NOTE [ In-place versions ])
    b = core.new(100, 1.0, (a,), "b", writes=a)
    core.end()
    core.begin("c")
    core.hand_out(b)
    c = core.new(100, 1.0, (b,), "c", writes=b)
    core.end()
    assert core.inputs[c] == (a,) and core.writes[c] == a and core.cost[c] == 2.0
    if held:
        core.held[a] = 1  # as if a wrapper of the program still read that version
    core.drop(c)
    assert core.resident == 0 and core.state[a] == EVICTED
    core.materialize(c)
    core.unlock(c)
    assert ex.recomputed == [a, c]
    if held:
        assert ex.consumed == []  # a stays: a wrapper holds it
        assert core.state[a] == RESIDENT and core.resident == 200
    else:
        assert ex.consumed == [a]
        assert core.state[a] == EVICTED and core.resident == 100
    assert core.stats.evictions == 0  # consuming is not an eviction decision
    core.check_invariants()


def _gru_trace(steps: int = 24):
    """One training step of an unrolled ``nn.GRUCell`` loop (batch 4, hidden 32), recorded
    unlimited with the analytic cost (the same trace on every machine)."""
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(32, 32)
    x = torch.randn(steps, 4, 32)
    with tritondtr.trace(cost="analytic") as rec:
        h = torch.zeros(4, 32)
        for t in range(steps):
            h = cell(x[t], h)
        h.square().mean().backward()
    return rec.trace


@pytest.mark.parametrize("frac", [0.4, 0.3, 0.2])
def test_kept_ancestor_sums_agree_with_a_fresh_walk(monkeypatch, frac):
    """Rule 6: every sum kept across choices is, at every later choice, what a fresh walk up
    the evicted ancestors gives (exact sums equal, bounds below, capped storages over the
    cap); and the kept sums serve choices (the walks are fewer than the sums read). Not at
    50 %: there, once NOTE [ Fused versions ] made each gate chain one storage, a choice
    rarely meets a sum kept from an earlier one (19 walks, 18 sums read)."""
    trace = _gru_trace()
    counts = {"choices": 0, "walks": 0, "kept": 0}
    choose, walk = UnheldScorer.victim, UnheldScorer.ancestors_cost

    def checked_choose(self, eng, v, now):
        self.check()
        counts["choices"] += 1
        counts["kept"] += sum(1 for sid in self.unheld if sid in self.sums)
        out = choose(self, eng, v, now)
        self.check()
        return out

    def counted_walk(self, *args):
        counts["walks"] += 1
        return walk(self, *args)

    monkeypatch.setattr(UnheldScorer, "victim", checked_choose)
    monkeypatch.setattr(UnheldScorer, "ancestors_cost", counted_walk)
    st, core = replay_runtime(trace, "dtr_eq", int(frac * runtime_peak(trace)))
    assert st.status == "ok" and st.evictions > 0
    assert counts["choices"] > 10 and counts["kept"] > counts["walks"] > 0, counts
    core.check_invariants()
