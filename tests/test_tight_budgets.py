"""Rules for budgets close to an op's working set: NOTE [ Backward storages ] rule 4 in
tritondtr/core/evict.py (a core driven directly with a counting executor) and NOTE [ Evicted
inputs first ] in tritondtr/core/core.py (the runtime against eager, and its twin)."""

from __future__ import annotations

import torch
from core_executor import Counting

import tritondtr
import tritondtr.runtime as rt
from tritondtr.core import Core
from tritondtr.residency import EVICTED, RESIDENT
from tritondtr.sim import simulate


def _backward_scene():
    """A forward storage ``f``; a chain of ten backward storages ``g0 .. g9``, released; the
    sum ``S`` of the last (the running sum of a residual gradient, whose addends are gone);
    ``N`` computed from ``S`` through ``m``, released. Both S and N are pinned backward
    storages, and each reads an evicted backward storage (rule 3's first stage takes
    neither)."""
    core = Core(10**6, "dtr_eq", Counting(), backend="torch")
    core.start(torch.device("cpu"))
    core.sync()

    def op(name, inputs, backward=True):
        core.begin(name)
        sid = core.new(100, 1.0, inputs, name, backward=backward)
        core.end()
        return sid

    f = op("f", (), backward=False)
    g = [op("g0", (f,))]
    for k in range(1, 10):
        g.append(op(f"g{k}", (g[-1], f)))
    s = op("sum", (g[-1], f))
    for sid in g:
        core.release(sid)
    m = op("m", (s,))
    n = op("n", (m,))
    core.release(m)
    return core, s, n


def test_a_gradient_near_a_resident_one_is_unpinned_before_a_running_sum():
    core, s, n = _backward_scene()
    eng, slot = core.engine, core.eslot
    assert not eng.is_candidate(slot[s]) and not eng.is_candidate(slot[n])
    assert core._unpin_backward()  # rule 4: n needs one evicted backward storage, s ten
    assert eng.is_candidate(slot[n]) and not eng.is_candidate(slot[s])
    assert core.bw == [s]
    assert core._unpin_backward()  # nothing cheaper is left: the second stage takes s
    assert eng.is_candidate(slot[s]) and core.bw == []
    core.check_invariants()


def test_the_budget_evicts_the_near_gradient_and_keeps_the_running_sum():
    core, s, n = _backward_scene()
    core.budget = core.resident - 50  # one 100-byte victim; f is locked by the op's use
    core.use(core.inputs[s][1])  # the op in flight reads f
    core.begin("op")
    core.release_inputs()
    assert core.state[n] == EVICTED and core.state[s] == RESIDENT
    assert core.stats.evictions == 1 and core.stats.backward_unpins == 1
    core.check_invariants()


def test_an_evicted_input_is_recomputed_before_the_resident_ones_are_locked():
    """``big + y``: ``y`` was evicted and its parents released, ``big`` (16 KiB) is resident.
    Recomputing ``y`` with ``big`` locked needs 24 KiB of a 20 KiB budget (BudgetError
    before the rule); recomputing ``y`` first lets the budget evict ``big`` and recompute it
    beside ``y`` afterwards."""
    torch.manual_seed(0)
    x = torch.randn(1024)  # 4 KiB, outside the budget

    def prog(session=None):
        p1, p2 = x * 2, x * 3
        y = p1 + p2
        del p1, p2  # released: y's recipe keeps them, evicted
        if session is not None:
            session.evict_all()
        big = x.repeat(4)
        return big.view(4, 1024) + y

    ref = prog()
    with tritondtr.trace(None, budget=20 * 1024, cost="analytic") as rec:
        got = prog(rec.session)
    assert torch.equal(rt.unwrap(got), ref)
    st = rec.stats
    assert (st.rematerializations, st.budget_errors) == (4, 0)  # p1, p2, y, then big
    twin = simulate(rec.trace, "dtr_eq", budget=20 * 1024, semantics="runtime")
    assert (twin.status, twin.evictions, twin.remats, twin.peak_bytes) == (
        "ok",
        st.evictions,
        st.rematerializations,
        st.peak_bytes,
    )
