"""Rules for tight budgets: NOTE [ Backward storages ] rule 4 in tritondtr/core/evict.py,
NOTE [ Evicted inputs first ] and NOTE [ Readers before release ] in tritondtr/core/core.py;
a core driven directly with a counting executor, and the runtime against eager and its twin."""

from __future__ import annotations

import pytest
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


def _reader_scene(budget: int, ex: Counting | None = None):
    """``x`` (resident, held) and ``d`` read from it alone (held, evicted): 100 bytes each."""
    ex = ex if ex is not None else Counting()
    core = Core(budget, "dtr_eq", ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    core.begin("x")
    x = core.new(100, 1.0, (), "x")
    core.end()
    core.begin("d")
    d = core.new(100, 1.0, (x,), "d")
    core.end()
    core.drop(d)  # evicted, as the budget would
    return core, ex, x, d


def test_a_held_reader_is_rematerialized_before_its_input_is_released():
    """NOTE [ Readers before release ] rule 2: once ``x`` is freed, ``d`` would cost ``x``'s
    recomputation too; while ``x`` is resident it costs one op."""
    core, ex, x, d = _reader_scene(10**6)
    core.release(x)
    assert ex.recomputed == [d] and ex.freed == [d, x]
    assert core.state[d] == RESIDENT and core.state[x] == EVICTED
    assert core.stats.rematerializations == 1
    core.check_invariants()


def test_no_reader_is_rematerialized_when_that_would_evict():
    core, ex, x, d = _reader_scene(150)  # 100 resident: within the budget, d would fit ...
    core.budget = 99  # ... not now: over the budget, rematerializing d must evict nothing
    core.release(x)
    assert ex.recomputed == [] and core.state[d] == EVICTED
    core.check_invariants()


class _Failing(Counting):
    """A counting executor whose recomputation of ``fail`` raises (a device out of memory)."""

    fail = -1

    def recompute(self, sid: int, consume: int = -1) -> None:
        if sid == self.fail:
            raise RuntimeError("out of memory (test)")
        super().recompute(sid, consume)


@pytest.mark.parametrize("escape", [False, True])
def test_a_reader_whose_recomputation_raises_leaves_its_input_released(escape):
    """NOTE [ Readers before release ] rule 5: the error leaves ``release`` (or the escape's
    ``hand_out``) with ``x`` released all the same; before, ``x`` stayed resident and held
    with no wrapper left (the runtime's drain had taken the death off its queue)."""
    core, ex, x, d = _reader_scene(10**6, _Failing())
    ex.fail = d
    with pytest.raises(RuntimeError, match="out of memory"):
        if escape:
            core.hand_out(x, escape=True)
        else:
            core.release(x)
    assert core.state[x] == EVICTED and not core.held[x] and core.state[d] == EVICTED
    assert ex.freed == [d, x] and core.resident == 0
    core.check_invariants()


def test_an_in_place_version_hands_out_its_old_buffer_without_readers():
    """The old version of an in-place write is overwritten: its readers are not recomputed
    from it (only ``release`` and an escape apply the rule)."""
    core, ex, x, d = _reader_scene(10**6)
    core.hand_out(x)
    assert ex.recomputed == [] and core.state[d] == EVICTED
    core.check_invariants()


def test_readers_before_release_in_the_runtime_and_its_twin():
    """``t = tanh(c)`` evicted, ``c`` made resident again, then ``c``'s last wrapper dies:
    ``t`` is recomputed from ``c`` at once (two rematerializations in all; three without
    the rule: ``c`` again, then ``t``), values equal to eager, the twin's counts equal."""
    torch.manual_seed(0)
    x = torch.randn(256)

    def prog(session=None):
        c = x * 2
        t = torch.tanh(c)
        if session is not None:
            session.evict_all()
        s = c.sum()
        del c
        return s, t * 3

    ref = prog()
    with tritondtr.trace(None, budget=1 << 20, cost="analytic") as rec:
        got = prog(rec.session)
    assert all(torch.equal(rt.unwrap(a), b) for a, b in zip(got, ref))
    st = rec.stats
    assert st.rematerializations == 2
    twin = simulate(rec.trace, "dtr_eq", budget=1 << 20, semantics="runtime")
    assert (twin.evictions, twin.remats, twin.peak_bytes) == (
        st.evictions,
        st.rematerializations,
        st.peak_bytes,
    )


def test_inputs_made_resident_give_way_to_one_that_does_not_fit_beside_them():
    """NOTE [ Evicted inputs first ] rule 4: ``a`` (200 B) is made resident first and locked;
    ``b`` needs its released parent ``p`` beside it, 300 B of a 250 B budget with ``a``
    locked. ``a`` gives way (evicted for ``b``), and the next round brings it back beside
    ``b``: every input resident, no BudgetError counted."""
    ex = Counting()
    core = Core(10**6, "dtr_eq", ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    sid = {}
    for name, size, inputs in (("a", 200, ()), ("p", 100, ()), ("b", 100, ("p",))):
        core.begin(name)
        sid[name] = core.new(size, 1.0, tuple(sid[i] for i in inputs), name)
        core.end()
    core.release(sid["p"])
    core.drop(sid["a"])
    core.drop(sid["b"])
    core.budget = 250
    locked = []
    core.use_evicted([sid["a"], sid["b"]], locked)
    assert core.state[sid["a"]] == RESIDENT and core.state[sid["b"]] == RESIDENT
    assert locked == [sid["b"], sid["a"]] and core.stats.budget_errors == 0
    assert ex.recomputed == [sid["a"], sid["p"], sid["b"], sid["a"]]
    for s in locked:
        core.unlock(s)
    core.check_invariants()
