"""NOTE [ Deferred locks ] in tritondtr/core/core.py: an op's resident inputs are locked only
when something may evict before the op runs, and then before it evicts; the core is driven
directly with a counting executor."""

from __future__ import annotations

import pytest
import torch

from tests.core_executor import Counting
from tritondtr.core import BudgetError, Core
from tritondtr.engine.residency import EVICTED, RESIDENT


def _core(budget: int):
    """``a`` (cost 1, the cheapest victim by far), ``b`` (cost 1000), ``c`` (cost 1000): 100
    bytes each, one op per clock tick."""
    ex = Counting()
    core = Core(budget, "dtr_eq", ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    sid = {}
    for name, cost in (("a", 1.0), ("b", 1000.0), ("c", 1000.0)):
        core.begin(name)
        sid[name] = core.new(100, cost, (), name)
        core.end()
    return core, ex, sid


def _lock_count(core, sid: int) -> int:
    return core.engine.lock_count(core.eslot[sid])


def test_resident_inputs_are_not_locked_when_nothing_evicts():
    core, _, s = _core(10**6)
    core.use(s["a"])
    assert _lock_count(core, s["a"]) == 0 and core.deferred == [s["a"]]
    assert core.recomputed == []
    core.begin("op")
    assert _lock_count(core, s["a"]) == 0  # under budget: nothing to protect it from
    core.release_inputs()
    assert core.deferred == [] and core.input_locks == []
    core.check_invariants()


def test_room_made_before_the_op_never_takes_its_inputs():
    core, _, s = _core(250)  # 300 bytes resident: one victim
    core.use(s["a"])
    core.begin("op")  # a, the engine's best victim, is locked first
    assert core.state[s["a"]] == RESIDENT and core.stats.evictions == 1
    assert _lock_count(core, s["a"]) == 1
    core.release_inputs()
    assert _lock_count(core, s["a"]) == 0
    core.check_invariants()


def test_recomputing_an_input_never_takes_the_inputs_used_before_it():
    core, ex, s = _core(10**6)
    core.drop(s["b"])
    core.bytes.set_budget(150)  # b's recomputation must make room: a is the best victim
    core.use(s["a"])
    core.use(s["b"])
    assert ex.recomputed == [s["b"]] and core.recomputed == [s["b"]]
    assert core.state[s["a"]] == RESIDENT and core.state[s["c"]] == EVICTED
    assert _lock_count(core, s["a"]) == 1 and _lock_count(core, s["b"]) == 1
    core.bytes.set_budget(10**6)
    core.begin("op")
    core.release_inputs()  # NOTE [ Op protocol ]: the recomputed input too
    assert _lock_count(core, s["a"]) == 0 and _lock_count(core, s["b"]) == 0
    assert core.recomputed == [] and core.input_locks == []
    core.check_invariants()


def test_an_out_of_memory_retry_locks_the_inputs_first():
    core, _, s = _core(10**6)
    core.use(s["a"])
    core.begin("op")
    assert core.evict_one()  # what the session does when the op runs out of memory
    assert core.state[s["a"]] == RESIDENT
    core.release_inputs()
    core.check_invariants()


def test_a_failed_op_leaves_no_lock_behind():
    core, _, s = _core(10**6)
    core.bytes.set_budget(50)  # nothing can be evicted once a, b and c are inputs
    for name in "abc":
        core.use(s[name])
    with pytest.raises(BudgetError):
        core.begin("op")
    core.release_inputs()  # the driver's error path
    assert all(_lock_count(core, s[n]) == 0 for n in "abc")
    core.check_invariants()


def test_stress_never_takes_the_inputs_used_before_a_recomputed_one():
    """Under ``stress`` every recomputation is followed by evicting everything evictable,
    without ``evict_one``: the deferred inputs are locked before the recomputation."""
    ex = Counting()
    core = Core(None, "dtr_eq", ex, backend="torch", stress=True)
    core.start(torch.device("cpu"))
    core.begin("a")
    a = core.new(100, 1.0, (), "a")
    core.begin("b")
    b = core.new(100, 1.0, (a,), "b")
    core.release_inputs()
    core.end()  # stress: a and b are evicted
    assert core.state[a] == EVICTED and core.state[b] == EVICTED
    core.begin("c")
    c = core.new(100, 1.0, (), "c")
    core.materialize(a)  # a program read of a: resident, locked for the reader
    core.unlock(a)
    core.use(a)
    core.use(b)
    assert ex.recomputed[-1] == b and core.recomputed == [b]
    assert core.state[a] == RESIDENT  # evict_all ran after b's recomputation
    core.begin("op")
    core.release_inputs()
    core.end()
    assert core.state[c] == EVICTED
    core.check_invariants()
