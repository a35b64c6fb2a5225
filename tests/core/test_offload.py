"""NOTE [ Offload ] in tritondtr/core/core.py: a victim is dropped or copied to the host,
whichever is priced lower; an offloaded storage is fetched where it would be recomputed."""

from __future__ import annotations

import pytest
import torch

from tests import zoo
from tests.core_executor import Counting
from tritondtr.core import Core
from tritondtr.core.link import Link
from tritondtr.engine.residency import EVICTED, RESIDENT
from tritondtr.sim.simulate import runtime_peak
from tritondtr.sim.twin import replay_runtime

CPU = torch.device("cpu")
GBPS = Link("1GB/s")  # one byte per ns


def _core(
    budget: int, link: Link | None, heuristic: str = "lru", ahead: bool = False
) -> tuple[Core, Counting]:
    """``ahead`` False: every copy for room, as NOTE [ Offload ] rule 3 alone has them."""
    ex = Counting()
    core = Core(budget, heuristic, ex, backend="torch", link=link, ahead=ahead)
    core.start(CPU)
    core.sync()
    return core, ex


def _op(core: Core, name: str, size: int, cost: float, inputs=()) -> int:
    core.enter(name, list(inputs))
    core.release_inputs()
    sid = core.new(size, cost, tuple(inputs), name)
    core.end(cost)
    return sid


def _use(core: Core, sid: int) -> None:
    core.enter("read", [sid])
    core.release_inputs()
    core.end(1.0)


def test_an_expensive_victim_is_offloaded_and_fetched_back_not_recomputed():
    core, ex = _core(250, Link("1GB/s"))
    a = _op(core, "a", 100, 1e6)  # 1 ms to recompute, 200 ns to copy out and back
    b = _op(core, "b", 100, 10.0)
    c = _op(core, "c", 100, 10.0)
    t = core.elapsed
    _op(core, "d", 100, 10.0)  # 300 > 250 before it: lru's victim is a, the oldest
    assert ex.copied == [a] and ex.freed == [a]
    assert core.offloaded[a] and core.state[a] == EVICTED and core.resident == 300
    assert core.elapsed == pytest.approx(t + 100 + 10)  # the op waited for the copy out
    st = core.stats
    assert (st.offloads, st.offloaded_bytes, st.link_wait_ns) == (1, 100, pytest.approx(100))
    assert core.engine.table.host_cost[core.eslot[a]] == pytest.approx(100)  # its copy back
    _use(core, a)  # room for a: lru's next victims are b and c, cheap: dropped
    assert ex.fetched == [a] and ex.recomputed == [] and ex.freed == [a, b, c]
    assert core.state[a] == RESIDENT and not core.offloaded[a] and core.host[a]
    assert (st.fetches, st.fetched_bytes, st.rematerializations) == (1, 100, 0)
    # NOTE [ Asynchronous offload ] rules 1 and 3: back, and backed: priced at its copy back
    assert core.engine.table.host_cost[core.eslot[a]] == pytest.approx(100)
    core.check_invariants()


def test_a_cheap_victim_is_dropped_and_no_link_drops_everything():
    for link in (Link("1GB/s"), None):
        core, ex = _core(250, link)
        a = _op(core, "a", 100, 50.0)  # 50 ns to recompute < 200 ns over the link
        b = _op(core, "b", 100, 1e6)
        c = _op(core, "c", 100, 1e6)
        _op(core, "d", 100, 1e6)
        assert ex.freed == [a] and ex.copied == [] and core.stats.offloads == 0
        _use(core, a)  # room: b and c go, offloaded over a link, dropped without
        assert ex.recomputed == [a] and ex.fetched == []
        assert ex.copied == ([b, c] if link else []) and ex.freed[1:] == [b, c]
        core.check_invariants()


def test_a_recomputation_fetches_its_offloaded_input():
    """``c = f(a)``: ``a`` offloaded, ``c`` dropped; reading ``c`` recomputes it from ``a``
    fetched back (rule 4: a fetch is a leaf of the plan)."""
    core, ex = _core(200, Link("1GB/s"))
    a = _op(core, "a", 100, 1e6)
    c = _op(core, "c", 100, 5.0, inputs=(a,))
    _op(core, "x", 100, 1e6)
    _op(core, "y", 100, 1e6)  # lru: a goes (its last use ties c's birth, the lower slot)
    _op(core, "z", 100, 1e6)  # then c
    assert core.offloaded[a] and core.state[c] == EVICTED and not core.offloaded[c]
    _use(core, c)
    assert ex.fetched == [a] and ex.recomputed == [c]
    core.check_invariants()


def test_a_forgotten_offloaded_storage_drops_its_host_copy_and_costs_stay_its_own():
    core, ex = _core(50, Link("1GB/s"))
    a = _op(core, "a", 100, 1e6)
    _op(core, "b", 100, 1e6)
    assert core.offloaded[a]
    core.set_cost(a, 2e6)  # a measurement arriving while it is away (NOTE rule 2)
    assert core.cost[a] == 2e6 and core.engine.table.host_cost[core.eslot[a]] == 100
    core.set_cost(a, 50.0)  # now cheaper than its copy back
    assert core.engine.table.host_cost[core.eslot[a]] == 50
    core.release(a)
    core.forget(a)
    assert ex.discarded == [a] and not core.offloaded[a]
    core.check_invariants()


def test_copies_out_queue_and_the_op_waits_for_all_of_them():
    core, ex = _core(50, Link("1GB/s"))
    core.enter("two", [])
    core.release_inputs()
    a, b = core.new(100, 1e6, (), "two"), core.new(100, 1e6, (), "two")
    core.end(5.0)
    t = core.elapsed
    _op(core, "next", 10, 1.0)  # 200 > 50: both go, the second copy behind the first
    assert ex.copied == [a, b]
    assert core.elapsed == pytest.approx(t + 200 + 1)
    assert core.stats.link_wait_ns == pytest.approx(200)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_the_twin_with_a_useless_link_decides_as_without_and_a_free_one_never_recomputes(name):
    """A link too slow to pay never offloads: the run is the one without a link, decision
    for decision. A link that costs nothing offloads every victim: nothing is recomputed."""
    case = zoo.make(name, seed=0, scale=2)
    from tritondtr.runtime.recording import trace

    with trace(None, cost="analytic") as rec:
        zoo.train_step(case, torch.optim.SGD(case.model.parameters(), lr=1e-3))
    tr = rec.trace
    budget = int(0.4 * runtime_peak(tr))
    plain, _ = replay_runtime(tr, "dtr_eq", budget)
    slow, core1 = replay_runtime(tr, "dtr_eq", budget, link=Link(1.0))  # 1 byte per second
    assert plain.evictions > 0 and core1.stats.offloads == 0
    assert (slow.evictions, slow.remats, slow.peak_bytes, slow.clock) == (
        plain.evictions,
        plain.remats,
        plain.peak_bytes,
        pytest.approx(plain.clock),
    )
    fast, core2 = replay_runtime(tr, "dtr_eq", budget, link=Link(1e18))
    st = core2.stats
    assert fast.status == "ok" and fast.remats == 0 and st.offloads >= fast.evictions > 0
    assert st.fetches > 0 and st.fetched_bytes <= st.offloaded_bytes
    assert fast.peak_bytes <= budget + core2.stats.max_op_out_bytes
    core2.check_invariants()


def test_releasing_a_storage_does_not_fetch_its_offloaded_readers():
    """NOTE [ Offload ] rule 7: NOTE [ Readers before release ] recomputes an evicted
    reader while its input is still here; an offloaded reader's host copy needs nothing
    (found by a reviewer helper: the release fetched it back for nothing)."""
    core, ex = _core(250, Link("1GB/s"))
    a = _op(core, "a", 100, 10.0)
    d = _op(core, "d", 100, 1e6, inputs=(a,))  # expensive: offloaded when chosen
    b = _op(core, "b", 100, 10.0)
    _use(core, a)  # a used: d is lru's oldest now
    _op(core, "c", 100, 10.0)
    assert ex.copied == [d]
    core.release(b)
    core.release(a)
    assert ex.fetched == [] and core.stats.fetches == 0 and core.offloaded[d]
    core.check_invariants()


def test_a_copy_the_executor_cannot_make_drops_the_victim_instead():
    class NoHost(Counting):
        def copy_out(self, sid: int) -> None:
            raise RuntimeError("no pinned memory left")

    ex = NoHost()
    core = Core(50, "lru", ex, backend="torch", link=Link("1GB/s"))
    core.start(CPU)
    core.sync()
    a = _op(core, "a", 100, 1e6)
    _op(core, "b", 100, 1e6)
    assert ex.freed == [a] and not core.offloaded[a] and core.stats.offloads == 0
    assert core.elapsed == pytest.approx(1e6 + 1e6)  # no copy was booked
    core.check_invariants()
