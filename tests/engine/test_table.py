"""MetadataTable: invariants under random add / update / free / growth, and host staging."""

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tritondtr import MetadataTable, SlotState

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40)),
        st.tuples(st.just("free"), st.integers(0, 10_000)),
        st.tuples(st.just("update"), st.integers(0, 10_000)),
        st.tuples(st.just("state"), st.integers(0, 10_000)),
        st.tuples(st.just("resize"), st.integers(0, 10_000)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, capacity=st.integers(1, 8))
def test_invariants_under_random_add_free_grow(ops, capacity):
    rng = np.random.default_rng(0)
    table = MetadataTable(capacity, device="cpu")
    live: dict[int, tuple] = {}  # independent model: slot -> (cost, size, last_access)
    for op, n in ops:
        if op == "add":
            cost = rng.random(n).astype(np.float32)
            size = rng.integers(0, 1 << 40, n)
            last = rng.integers(0, 1000, n)
            slots = table.add_many(cost, size, last)
            assert len(set(slots.tolist()) & set(live)) == 0, "a live slot was handed out again"
            for i, s in enumerate(slots.tolist()):
                live[s] = (cost[i], size[i], last[i])
        elif live and op == "free":
            victims = sorted(live)[n % len(live) :: 3]
            table.free_many(np.array(victims))
            for s in victims:
                del live[s]
        elif live and op == "update":
            s = sorted(live)[n % len(live)]
            table.touch(s, 5000 + n)
            live[s] = (live[s][0], live[s][1], 5000 + n)
        elif live and op == "state":  # there and back: the derived column follows
            s = sorted(live)[n % len(live)]
            table.set_state(s, SlotState(n % 4 or 1))
            table.check_invariants()
            table.set_state(s, SlotState.RESIDENT_EVICTABLE)
        elif live and op == "resize":
            s = np.array(sorted(live)[n % len(live) :: 2])
            size = rng.integers(0, 1 << 62, s.size)
            table.update_many(s, size=size, state=SlotState.EVICTED)
            table.check_invariants()
            table.update_many(s, state=SlotState.RESIDENT_EVICTABLE)
            for i, slot in enumerate(s.tolist()):
                live[slot] = (live[slot][0], size[i], live[slot][2])
        table.check_invariants()
        assert len(table) == len(live)
        assert table.capacity >= len(live)
    for s, (cost, size, last) in live.items():
        assert table.host_cost[s] == cost
        assert table.host_size[s] == size
        assert table.host_last_access[s] == last
        assert table.host_state[s] == SlotState.RESIDENT_EVICTABLE


def test_growth_doubles_and_keeps_content():
    table = MetadataTable(2, device="cpu")
    a = table.add(1.0, 10, 3)
    b = table.add(2.0, 20, 4)
    c = table.add(3.0, 30, 5)
    assert table.capacity == 4
    assert (a, b, c) == (0, 1, 2)
    assert table.columns()["size"][:3].tolist() == [10, 20, 30]
    table.check_invariants()


def test_freed_slot_is_zeroed_and_reused():
    table = MetadataTable(4, device="cpu")
    s = table.add(5.0, 100, 7, nbhd_cost=2.0)
    table.free(s)
    assert table.host_cost[s] == 0 and table.host_size[s] == 0
    assert table.add(1.0, 1, 1) == s
    t = table.add(1.0, 1, 1)
    table.free(t)
    with pytest.raises(ValueError, match="already free"):
        table.free(t)


# Sizes whose float32 differs when rounded through float64 first (2**62 + 2**38 + 1: float64
# rounds to the halfway point, float32 then to even) and at float32's integer limit.
AWKWARD_SIZES = [2**62 + 2**38 + 1, 2**24 + 1, 2**63 - 1, 0, 1]


def test_evictable_size_is_torch_float32_of_size_for_candidates():
    table = MetadataTable(2, device="cpu")
    slots = [table.add(1.0, size, 0) for size in AWKWARD_SIZES]
    table.add_many(np.ones(5), np.array(AWKWARD_SIZES), 0)
    table.set_state(slots[1], SlotState.RESIDENT_LOCKED)
    table.free(slots[2])
    table.check_invariants()
    cols = table.columns()
    want = torch.where(
        cols["state"] == SlotState.RESIDENT_EVICTABLE,
        cols["size"].to(torch.float32),
        torch.tensor(float("nan")),
    )
    assert torch.equal(cols["evictable_size"].view(torch.int32), want.view(torch.int32))
    awkward = torch.tensor(AWKWARD_SIZES)[[0, 3, 4]].float()
    assert torch.equal(cols["evictable_size"][[0, 3, 4]], awkward)


@pytest.mark.parametrize("clock", [0, -20, 2**31 - 8], ids=["int32", "negative", "int64"])
@pytest.mark.parametrize("h", ["dtr", "dtr_eq", "dtr_local", "msps", "lru", "size", "random"])
def test_select_from_the_table_equals_select_from_bare_columns(h, clock):
    """The table passes evictable_size and its clock bounds to the twin; bare columns make
    the first per call and go without the second (NOTE [ Evictable size ], [ Clock bounds ])."""
    from tritondtr import policy

    rng = np.random.default_rng(3)
    table = MetadataTable(16, device="cpu")
    n = 9000
    slots = table.add_many(
        rng.random(n) * 10,
        rng.integers(0, 4, n) * 256,
        clock + rng.integers(0, 12, n),
        nbhd_cost=np.where(rng.random(n) < 0.5, rng.random(n), 0),
    )
    table.update_many(slots[::3], state=SlotState.EVICTED)
    table.free_many(slots[1::7])
    table.touch(int(slots[2]), clock + 13)  # after now: s < 0
    table.check_invariants()
    now = clock + 11
    assert table.clock_bounds == (min(0, clock), max(0, clock + 13))
    bare = {k: v for k, v in table.columns().items() if k in MetadataTable.COLUMNS}
    for k in (1, 8):
        got = table.select(h, now, k=k, backend="torch", seed=2)
        assert got.tolist() == policy.select(h, bare, now, k=k, backend="torch", seed=2).tolist()
        assert torch.equal(
            table.score(h, now, backend="torch", seed=2),
            policy.score(h, bare, now, backend="torch", seed=2),
        )


def test_cpu_columns_are_zero_copy_views_of_host():
    table = MetadataTable(8, device="cpu")
    s = table.add(1.0, 8, 0)
    table.touch(s, 42)
    assert table.columns()["last_access"][s] == 42  # no flush needed on CPU


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="capacity"):
        MetadataTable(0)
    table = MetadataTable(4, device="cpu")
    with pytest.raises(ValueError, match="unknown column"):
        table.update_many(np.array([0]), colour=1)
    with pytest.raises(ValueError, match="free"):
        table.update_many(np.array([0]), cost=1.0)
    with pytest.raises(ValueError, match=r"slot ids must lie in \[0, 4\)"):
        table.update_many(np.array([9]), cost=1.0)


def test_select_reads_current_metadata():
    table = MetadataTable(4, device="cpu")
    a = table.add(1.0, 100, 0)
    b = table.add(1.0, 100, 0)
    assert table.select("lru", now=10).tolist() == [a]  # tie -> lowest slot
    table.touch(a, 5)
    assert table.select("lru", now=10).tolist() == [b]
    table.set_state(b, SlotState.RESIDENT_LOCKED)
    assert table.select("lru", now=10).tolist() == [a]
    table.set_state(a, SlotState.EVICTED)
    assert table.select("lru", now=10, k=3).tolist() == []


def test_set_nbhd_costs_rounds_like_set_nbhd_cost():
    """The flush's batched write gives the float32 that one slot at a time gives: ties to
    even, subnormals, and inf past float32's maximum (with numpy's overflow warning)."""
    f32max = float(np.finfo(np.float32).max)
    values = [0.0, 0.1, 1 + 2**-24, 1 + 3 * 2**-24, 2**-149, 3 * 2**-150, f32max, 2 * f32max]
    one, many = MetadataTable(4, device="cpu"), MetadataTable(4, device="cpu")
    slots = [one.add(1.0, 8, 0) for _ in values]
    assert [many.add(1.0, 8, 0) for _ in values] == slots
    with pytest.warns(RuntimeWarning, match="overflow"):
        for s, v in zip(slots, values):
            one.set_nbhd_cost(s, v)
    with pytest.warns(RuntimeWarning, match="overflow"):
        many.set_nbhd_costs(slots, values)
    assert np.array_equal(one.host_nbhd_cost.view(np.int32), many.host_nbhd_cost.view(np.int32))
    assert many.host_nbhd_cost[slots[-1]] == np.inf


@pytest.mark.gpu
def test_cuda_staging_matches_host():
    table = MetadataTable(16, device="cuda")
    rng = np.random.default_rng(1)
    slots = table.add_many(rng.random(100), rng.integers(1, 1000, 100), rng.integers(0, 50, 100))
    for s in slots[::7].tolist():
        table.touch(int(s), 99)
        table.set_nbhd_cost(int(s), 3.5)
    table.set_nbhd_costs(slots[3::11].tolist(), [0.1] * len(slots[3::11]))
    table.free_many(slots[1::5])
    table.flush()
    table.check_invariants()
    for name in MetadataTable.COLUMNS + MetadataTable.DERIVED:
        host = torch.from_numpy(getattr(table, "host_" + name)).view(torch.uint8)
        assert torch.equal(table.columns()[name].cpu().view(torch.uint8), host)
    assert torch.equal(
        table.select("dtr", 100, k=5), table.select("dtr", 100, k=5, backend="torch")
    )


@pytest.mark.gpu
def test_cuda_select_keeps_its_prepared_kernel_until_the_table_grows():
    """NOTE [ One-launch selection ] rule 7: a CUDA table prepares one selection per
    (heuristic, k, backend) and drops them when growing replaces its columns."""
    table = MetadataTable(8, device="cuda")
    rng = np.random.default_rng(2)
    table.add_many(rng.random(6), rng.integers(1, 1000, 6), rng.integers(0, 50, 6))
    for k in (1, 3):
        assert torch.equal(
            table.select("dtr", 60, k=k), table.select("dtr", 60, k=k, backend="torch")
        )
    assert len([s for s in table._selections.values() if s is not None]) == 2
    table.add_many(rng.random(100), rng.integers(1, 1000, 100), rng.integers(0, 50, 100))
    for now in (60, 60.0, 2**31 + 60, 2**40):  # each integer type of `now` compiles once
        got, want = table.select("msps", now, k=4), table.select("msps", now, k=4, backend="torch")
        assert torch.equal(got, want)
    assert table.capacity >= 106 and len(table._selections) == 2  # msps x (auto, torch)


def test_policy_selection_is_none_where_the_twin_selects():
    from tritondtr import policy

    table = MetadataTable(4, device="cpu")
    assert policy.selection("dtr", table.columns(), k=1) is None
    with pytest.raises(ValueError, match="k must be a positive int"):
        policy.selection("dtr", table.columns(), k=0)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the kernels on CPU need the interpreter"
)
def test_triton_select_prepares_once_and_takes_any_clock():
    """The prepared selection (NOTE [ One-launch selection ] rule 7) on the interpreter's CPU
    table: the victims of the torch twin, for a clock the simulator gives as a float too,
    one selection per (heuristic, k, backend), dropped when the table grows."""
    table = MetadataTable(8, device="cpu")
    rng = np.random.default_rng(3)
    table.add_many(rng.random(8), rng.integers(1, 1000, 8), rng.integers(0, 50, 8))
    for now in (60, 60.0, 2**31 + 60):
        got = table.select("dtr", now, k=3, backend="triton")
        assert torch.equal(got, table.select("dtr", now, k=3, backend="torch"))
    first = table._selections[("dtr", 3, "triton")]
    assert table.select("dtr", 61, k=3, backend="triton") is not None
    assert table._selections[("dtr", 3, "triton")] is first
    table.add_many(rng.random(20), rng.integers(1, 1000, 20), rng.integers(0, 50, 20))
    got = table.select("dtr", 70, k=3, backend="triton")
    assert torch.equal(got, table.select("dtr", 70, k=3, backend="torch"))
    assert table._selections[("dtr", 3, "triton")] is not first
