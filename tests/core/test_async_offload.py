"""NOTE [ Asynchronous offload ] in tritondtr/core/offload.py: host copies that outlive their
eviction, copies out ahead of the budget, prefetches in a plan's order, and the waits."""

from __future__ import annotations

import pytest
import torch

from tests.core_executor import Counting
from tritondtr.core import Core
from tritondtr.core.link import Link
from tritondtr.core.plan import StepPlan
from tritondtr.engine.residency import EVICTED, RESIDENT

CPU = torch.device("cpu")


def _core(budget: int, plan=None) -> tuple[Core, Counting]:
    ex = Counting()
    core = Core(budget, "lru", ex, backend="torch", link=Link("1GB/s"))  # 1 byte per ns
    core.start(CPU)
    core.sync()
    core.set_plan(plan)
    return core, ex


def _op(core: Core, name: str, size: int, cost: float, inputs=(), took=None) -> int:
    """An op whose output costs ``cost`` ns to recompute; it ran ``took`` (default: cost)."""
    core.enter(name, list(inputs))
    core.release_inputs()
    sid = core.new(size, cost, tuple(inputs), name)
    core.end(cost if took is None else took)
    return sid


def _use(core: Core, sid: int, cost: float = 1.0) -> None:
    core.enter("read", [sid])
    core.release_inputs()
    core.end(cost)


class Plan:
    """A plan by hand: ``reads[sid]`` the op numbers that read it; ``op`` the next op."""

    def __init__(self) -> None:
        self.reads: dict[int, list[int]] = {}
        self.op = 0
        self.epoch = 0

    def position(self) -> int:
        return self.op

    def next_read(self, sid: int) -> int | None:
        later = [o for o in self.reads.get(sid, ()) if o >= self.op]
        return min(later) if later else None


def test_a_copy_ahead_makes_the_later_eviction_free():
    """Rule 2: once the room not yet backed is below one op's output, the heuristic's next
    victim is copied out while the ops run; the eviction then waits for nothing."""
    core, ex = _core(300)
    a, b, c = (_op(core, n, 100, 1e6) for n in "abc")  # 1 ms each; a copy takes 100 ns
    assert ex.copied == [a] and core.host[a] and core.state[a] == RESIDENT
    assert core.copies.backed == 100 and core.resident == 300
    assert core.engine.table.host_cost[core.eslot[a]] == pytest.approx(100)  # rule 3
    _op(core, "d", 100, 1e6)  # fits: 300 <= 300 before it; b is copied after it
    assert ex.copied == [a, b] and ex.freed == []
    _op(core, "e", 100, 1e6)  # 400 > 300: lru's victim a is backed, its copy long done
    assert ex.freed == [a] and core.offloaded[a] and core.state[a] == EVICTED
    st = core.stats
    assert ex.copied == [a, b, c] and st.link_wait_ns == 0 and st.evictions == 1
    assert st.offloads == 3 and st.offloaded_bytes == 300
    assert st.link_busy_ns == pytest.approx(300)
    core.check_invariants()


def test_a_backed_victim_cheaper_to_recompute_now_is_dropped_with_its_copy():
    """Rule 3: a victim is priced when evicted; a measurement arriving after its copy ahead
    (NOTE [ Cost models ] rule 10) can make the drop the cheaper action."""
    core, ex = _core(250)
    a, _ = (_op(core, n, 100, 1e6) for n in "ab")
    assert ex.copied == [a]
    core.set_cost(a, 5.0)
    assert core.engine.table.host_cost[core.eslot[a]] == 5  # the lower of the two
    _op(core, "c", 100, 1e6)
    _op(core, "d", 100, 1e6)  # 300 > 250: a goes, dropped
    assert ex.discarded == [a] and ex.freed[:1] == [a]
    assert not core.offloaded[a] and not core.host[a] and core.state[a] == EVICTED
    _use(core, a)
    assert ex.recomputed == [a] and ex.fetched == []
    core.check_invariants()


def test_a_backed_victim_dropped_while_its_copy_is_in_flight_is_priced_as_a_recomputation():
    """Rule 3: waiting for its copy makes the drop cheaper; once dropped it can only be
    recomputed, so the engine prices it at its cost again (found by review: it kept the
    copy's price)."""
    core, ex = _core(250)
    a, _ = (_op(core, n, 100, 5000.0, took=10.0) for n in "ab")  # a copied ahead after b
    _op(core, "c", 40, 5000.0, took=10.0)
    core.set_cost(a, 150.0)  # a measurement: the engine prices it min(100, 150)
    assert core.engine.table.host_cost[core.eslot[a]] == 100
    _op(core, "d", 100, 5000.0, took=10.0)
    _op(core, "e", 10, 5000.0, took=10.0)  # a's copy still in flight: 80 ns + 100 > 150
    assert ex.discarded == [a] and not core.host[a] and core.state[a] == EVICTED
    assert core.engine.table.host_cost[core.eslot[a]] == 150
    core.check_invariants()


def test_dropping_a_storage_whose_copy_is_in_flight_waits_for_it():
    """Rule 4: ops that ran 10 ns, a copy of 100: the eviction right after waits 90 ns."""
    core, ex = _core(250)
    a, _ = (_op(core, n, 100, 1e6, took=10.0) for n in "ab")
    issued = core.elapsed  # a's copy was issued at the end of b
    assert ex.copied == [a]
    _op(core, "c", 100, 1e6, took=10.0)  # fits; the link is busy: nothing more is copied
    assert ex.copied == [a]
    _op(core, "d", 100, 1e6, took=10.0)
    assert core.offloaded[a] and ex.freed == [a]
    assert core.stats.link_wait_ns == pytest.approx(issued + 100 - (issued + 10))
    core.check_invariants()


def test_a_cheap_storage_is_not_copied_ahead():
    """Rule 2: a copy back of 100 ns does not pay for a storage recomputed in 5."""
    core, ex = _core(300)
    for n in "abcd":
        _op(core, n, 100, 5.0)
    assert ex.copied == [] and core.stats.offloads == 0


def test_a_fetched_storage_stays_backed_and_its_next_eviction_copies_nothing():
    core, ex = _core(250)
    a = _op(core, "a", 100, 1e6)
    _op(core, "b", 100, 1e6)
    _op(core, "c", 100, 1e6)  # a copied ahead after b
    _op(core, "d", 100, 1e6)  # 300 > 250: a evicted, copying nothing
    assert core.offloaded[a] and ex.copied.count(a) == 1
    _use(core, a)
    assert ex.fetched == [a] and core.host[a] and not core.offloaded[a]
    copies = core.stats.offloads
    while core.state[a] == RESIDENT:
        _op(core, "more", 100, 1e6)
    assert core.offloaded[a] and ex.copied.count(a) == 1
    assert core.stats.offloads >= copies  # others may be copied ahead; a is not again
    core.check_invariants()


@pytest.mark.parametrize("how", ["release", "hand_out", "forget", "externalize"])
def test_what_a_host_copy_survives(how):
    """Rule 1: a released or handed-out storage (its value unchanged: a write makes a new
    version) is offloaded, fetched rather than recomputed; one forgotten or made external
    (its value may change: parameter writes) loses its copy."""
    core, ex = _core(300)
    a, _, _ = (_op(core, n, 100, 1e6) for n in "abc")
    assert core.host[a] and core.state[a] == RESIDENT
    if how in ("release", "hand_out"):
        getattr(core, how)(a)
        assert core.offloaded[a] and core.copies.backed == 0
        core.materialize(a)
        core.unlock(a)
        assert ex.fetched == [a] and ex.recomputed == []
    elif how == "forget":
        core.release(a)
        core.forget(a)
        assert not core.host[a] and ex.discarded == [a]
    else:
        core.externalize(a)
        assert not core.host[a] and ex.discarded == [a] and core.copies.backed == 0
    core.check_invariants()


def test_a_prefetch_brings_back_what_the_plan_reads_next_and_the_reader_waits_for_it():
    """Rule 5: after an op, with the host-to-device link idle and room, the offloaded
    storage the plan reads next (within PREFETCH_OPS ops) comes back; an op reading it
    before it arrived waits for the rest of its copy."""
    plan = Plan()
    core, ex = _core(250, plan)
    a = _op(core, "a", 100, 1e6)
    plan.reads[a] = [10]
    b = _op(core, "b", 100, 1e6)
    c = _op(core, "c", 100, 1e6)
    d = _op(core, "d", 100, 1e6)  # a evicted (offloaded) before d
    assert core.offloaded[a] and core.copies.waiting == [(10, a, core.born[a], 0)]
    core.release(b)
    core.release(c)  # 150 bytes free: room for a, not above one op's output
    plan.op = 4
    _op(core, "e", 10, 5.0)
    assert ex.fetched == []
    core.release(d)  # 250 free
    plan.op = 5
    _op(core, "f", 10, 5.0)
    assert ex.fetched == [a] and core.state[a] == RESIDENT and core.host[a]
    st = core.stats
    assert (st.prefetches, st.fetches, st.fetched_bytes) == (1, 0, 100)
    arrives = core.arriving[a]
    assert arrives == pytest.approx(core.elapsed + 100)
    plan.op = 10
    _use(core, a)
    assert st.link_wait_ns == pytest.approx(100) and a not in core.arriving
    core.check_invariants()


def test_a_prefetch_never_evicts_and_waits_for_the_plan_window():
    plan = Plan()
    core, ex = _core(250, plan)
    a = _op(core, "a", 100, 1e6)
    plan.reads[a] = [200]
    for n in "bcd":
        _op(core, n, 100, 1e6)
    assert core.offloaded[a]
    plan.op = 100  # a is read 100 ops ahead: beyond the window
    _op(core, "e", 1, 1.0)
    assert ex.fetched == []
    plan.op = 190  # within it, but no room below the budget minus one op's output
    _op(core, "f", 1, 1.0)
    assert ex.fetched == [] and core.stats.prefetches == 0
    core.check_invariants()


@pytest.mark.parametrize("stale", [None, "epoch", "reused id"])
def test_a_stale_prefetch_entry_brings_nothing_back(stale):
    """Rule 5, the waiting heap: an entry made on another axis of the plan (a step ended
    since) or for another storage of the same id (its creation clock differs) is dropped
    when popped, not prefetched; a fresh one, the same way, is prefetched."""
    plan = Plan()
    core, ex = _core(250, plan)
    a = _op(core, "a", 100, 1e6)
    plan.reads[a] = [10]
    b, c, d = (_op(core, n, 100, 1e6) for n in "bcd")
    assert core.offloaded[a] and len(core.copies.waiting) == 1
    if stale == "epoch":
        plan.epoch += 1
    elif stale == "reused id":  # as if the entry were left by an earlier storage ``a``
        at, sid, made, epoch = core.copies.waiting[0]
        core.copies.waiting[0] = (at, sid, made - 1, epoch)
    for sid in (b, c, d):  # room for a, above one op's output
        core.release(sid)
    plan.op = 5
    _op(core, "e", 1, 1.0)
    assert ex.fetched == ([a] if stale is None else [])
    assert core.copies.waiting == []
    core.check_invariants()


def test_without_ahead_every_copy_is_made_for_room():
    ex = Counting()
    core = Core(300, "lru", ex, backend="torch", link=Link("1GB/s"), ahead=False)
    core.start(CPU)
    core.sync()
    for n in "abcd":
        _op(core, n, 100, 1e6)
    assert ex.copied == [] and core.stats.offloads == 0
    _op(core, "e", 100, 1e6)
    assert len(ex.copied) == 1 and core.stats.link_wait_ns == pytest.approx(100)


def test_the_step_plan_reads_the_previous_step_by_where_each_storage_was_made():
    """NOTE [ Step plan ]: ops are keyed by (name, occurrence), storages by (the op that made
    them, output place); times are the previous step's op numbers; ops of other names that
    the first step ran more of (lazy initialisation) shift nothing; storages made before the
    step have no key."""
    plan = StepPlan()

    def op(name: str, reads=(), made=()) -> None:
        plan.read(name, list(reads))
        for sid in made:
            plan.made(sid)
        plan.ran()

    assert plan.next_read(0) is None  # nothing recorded yet
    op("init")  # the first step's extra op: shifts the numbers, not the keys of "mm"
    op("mm", [99], [10])  # 99: made before the step
    op("mm", [10], [11])
    op("add", [11, 10])
    op("mul", [10])
    plan.step()  # previous step: mm#0 = 1, mm#1 = 2, add#0 = 3, mul#0 = 4
    op("mm", [7], [20])  # made where 10 was, another sid
    assert plan.position() == 2  # after mm#0, which was op 1 last step
    assert plan.next_read(20) == 2 and plan.next_read(99) is None
    op("mm", [20], [21])
    op("add", [21, 20])  # position 4: 20 is read at 4 next; 21 never again
    assert plan.position() == 4
    assert plan.next_read(20) == 4 and plan.next_read(21) is None
    op("unknown")  # an op the last step did not run moves nothing
    assert plan.position() == 4


def test_the_unheld_scorer_prices_a_backed_storage_as_the_engine_does():
    """Rule 3 for NOTE [ Unheld storages ]: the scorer that weighs unheld storages against
    the engine's victim prices a backed one at min(copy back, cost) too; it kept the full
    recomputation and evicted an unheld storage 100x dearer to lose (found by review)."""
    ex = Counting()
    core = Core(300, "dtr_eq", ex, backend="torch", link=Link("1GB/s"), ahead=False)
    core.start(CPU)
    core.sync()
    x = _op(core, "x", 100, 1e6)
    u = _op(core, "u", 100, 5.0, inputs=(x,), took=1.0)
    d = _op(core, "d", 100, 5.0, inputs=(u,), took=1.0)
    core.release(u)
    core.evict_all()  # x offloaded, u and d dropped
    core.materialize(d)  # x fetched back (backed), u recomputed while unheld
    core.unlock(d)
    core.set_cost(u, 1e4)
    core.set_cost(d, 1e7)
    assert core.host[x] and core.engine.table.host_cost[core.eslot[x]] == 100
    _op(core, "e", 100, 1e7, took=1.0)
    _op(core, "f", 1, 1.0)  # 400 > 300 before f: one victim, x (its copy is there)
    assert core.offloaded[x] and core.state[u] == RESIDENT and ex.copied == [x]
    core.check_invariants()


def test_a_step_plan_that_never_sees_a_step_end_stays_bounded(monkeypatch):
    """NOTE [ Step plan ] rule 5: no parameter write, no step end; the plan ends one itself
    every MAX_OPS ops, so it keeps at most one step's reads."""
    from tritondtr.core import plan as plans

    monkeypatch.setattr(plans, "MAX_OPS", 8)
    plan = StepPlan()
    for i in range(20):
        plan.read("mm", [i - 1] if i else [])
        plan.made(i)
        plan.ran()
    assert plan.op == 20 % 8 and len(plan.key) == 20 % 8
    assert len(plan.previous[0]) == 8  # the last whole segment is the plan
