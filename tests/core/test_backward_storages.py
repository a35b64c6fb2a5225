"""NOTE [ Backward storages ] rule 5 in tritondtr/core/backward.py: backward storages stay out of
the engine until rule 2 needs them; the core is driven directly with a counting executor."""

from __future__ import annotations

import torch

from tests.core_executor import Counting
from tritondtr.core import Core
from tritondtr.engine.residency import EVICTED, EXTERNAL, RESIDENT


def _core(budget: int, admitted: bool = False):
    """A forward chain ``a -> b -> c`` (100 bytes each, costs 1, 10, 100), then a backward
    pass: ``g1`` from ``c``, ``g2`` from ``g1`` and ``b``, ``g3`` from ``g2`` and ``a`` (50
    bytes each). ``admitted``: the backward storages enter the engine as they are made (the
    behaviour before rule 5), for a reference run."""
    ex = Counting()
    core = Core(budget, "dtr_eq", ex, backend="torch")
    core.start(torch.device("cpu"))
    core.sync()
    s = {}
    for name, cost, parents in (("a", 1.0, ()), ("b", 10.0, ("a",)), ("c", 100.0, ("b",))):
        core.begin(name)
        s[name] = core.new(100, cost, tuple(s[n] for n in parents), name)
        core.end()
    core.pins.admitted = admitted
    for name, parents in (("g1", ("c",)), ("g2", ("g1", "b")), ("g3", ("g2", "a"))):
        for p in parents:
            core.use(s[p])
        core.begin(name)
        s[name] = core.new(50, 5.0, tuple(s[n] for n in parents), name, backward=True)
        core.release_inputs()
        core.end()
    return core, ex, s


def test_backward_storages_stay_out_of_the_engine():
    core, ex, s = _core(10**6)
    eng = core.engine
    assert [core.eslot[s[n]] >= 0 for n in ("a", "b", "c")] == [True] * 3
    assert [core.eslot[s[n]] for n in ("g1", "g2", "g3")] == [-1] * 3
    assert len(eng.table) == 3 and list(core.pins.out) == [s["g1"], s["g2"], s["g3"]]
    core.use(s["g1"])
    core.begin("read")
    core.release_inputs()
    core.end()
    assert core.seen[s["g1"]] == core.now - 1  # its last use, kept by the core
    core.release(s["g1"])  # read by g2's recipe: evicted, still out of the engine
    assert core.state[s["g1"]] == EVICTED and core.eslot[s["g1"]] == -1
    assert ex.freed == [s["g1"]] and len(eng.table) == 3
    core.check_invariants()
    core.admit_backward()  # what rule 2 does first: pinned if resident, its last use
    slot = core.eslot[s["g1"]]
    assert slot >= 0 and eng.is_evicted(slot) and not core.pins.out
    assert eng.table.host_last_access[slot] == core.seen[s["g1"]]
    assert not eng.is_candidate(core.eslot[s["g2"]]) and eng.is_resident(core.eslot[s["g2"]])
    core.check_invariants()


def test_freeze_makes_kept_out_storages_external():
    core, ex, s = _core(10**6)
    core.freeze()  # the step ends: held storages become external, those kept out too
    assert [core.state[s[n]] for n in ("g1", "g2", "g3")] == [EXTERNAL] * 3
    assert not core.pins.out and set(ex.kept) >= {s["g1"], s["g2"], s["g3"]}
    core.check_invariants()


def test_admitted_when_nothing_else_is_left_with_the_same_victims():
    """Once only backward storages are left, rule 2 admits them, and the victims are those of
    a core where they entered the engine as they were made."""
    runs = []
    for admitted in (False, True):
        core, _, s = _core(10**6, admitted)
        for n in ("a", "b", "c"):
            core.drop(s[n])  # nothing but backward storages is left to evict
        core.bytes.set_budget(60)
        core.begin("op")  # 150 bytes of gradients: two of them must go
        core.end()
        assert core.resident <= 60 and core.stats.backward_unpins >= 1
        assert not core.pins.out and all(core.eslot[s[n]] >= 0 for n in ("g1", "g2", "g3"))
        core.check_invariants()
        runs.append([n for n in ("g1", "g2", "g3") if core.state[s[n]] == EVICTED])
    assert runs[0] == runs[1] and len(runs[0]) == 2


def test_a_kept_out_input_keeps_its_lock_when_admitted():
    """``g1``, the stalest gradient and so the best victim, is the input of the op in flight:
    it is locked before room is made (kept out: the core counts the lock), and the room,
    which admits every backward storage, must not take it."""
    core, _, s = _core(10**6)
    for n in ("a", "b", "c"):
        core.drop(s[n])
    core.bytes.set_budget(60)
    core.use(s["g1"])
    core.begin("op")  # over budget: g1 locked, then admitted with its lock
    assert core.state[s["g1"]] == RESIDENT
    assert core.state[s["g2"]] == EVICTED and core.state[s["g3"]] == EVICTED
    assert core.engine.lock_count(core.eslot[s["g1"]]) == 1
    core.release_inputs()
    assert core.lock_count(s["g1"]) == 0 and not core.pins.out_locks
    core.end()
    core.check_invariants()


def test_a_released_gradient_is_admitted_when_recomputed():
    """``u`` (the optimizer's, not a backward storage) reads the released ``g1``: recomputing
    an evicted ``u`` recomputes ``g1``, which enters the engine then."""
    core, ex, s = _core(10**6)
    core.pins.admitted = False
    core.use(s["g1"])
    core.begin("update")
    u = core.new(50, 2.0, (s["g1"],), "update")
    core.release_inputs()
    core.end()
    core.release(s["g1"])
    assert core.state[s["g1"]] == EVICTED and core.eslot[s["g1"]] == -1
    core.drop(u)
    core.materialize(u)
    core.unlock(u)
    assert ex.recomputed == [s["g1"], u]
    assert core.eslot[s["g1"]] >= 0 and s["g1"] not in core.pins.out
    assert core.state[s["g1"]] == RESIDENT and core.state[u] == RESIDENT
    core.check_invariants()


def _op(core, name: str, inputs=(), backward: bool = False) -> int:
    """One op as the session runs it (NOTE [ Op protocol ]): use the inputs, begin, release
    the inputs, one new 100-byte output, end."""
    for i in inputs:
        core.use(i)
    core.begin(name)
    core.release_inputs()
    sid = core.new(100, 1.0, tuple(inputs), name, backward=backward)
    core.end()
    return sid


def test_stress_keeps_no_storage_out():
    """Under ``stress`` the core keeps no map of readers, which admission needs for the edges
    to the storages reading a kept-out one: backward storages enter the engine when made
    (pinned), and a later storage reading one gets that edge."""
    core = Core(None, "dtr_eq", Counting(), backend="torch", stress=True)
    core.start(torch.device("cpu"))
    a = _op(core, "a")
    g = _op(core, "g", (a,), backward=True)
    assert not core.pins.out and core.eslot[g] >= 0
    assert not core.engine.is_candidate(core.eslot[g])  # pinned (rule 1)
    u = _op(core, "u", (g,))
    assert core.eslot[g] in core.engine.nbhd.parents[core.eslot[u]]
    core.check_invariants()
