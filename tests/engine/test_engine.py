"""Engine: exact batched choice (NOTE [ Exact batched choice ]), state mapping, errors."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tritondtr
from tritondtr.engine.bounded import LIST, BoundedChoice
from tritondtr.engine.engine import Engine
from tritondtr.engine.table import MetadataTable, SlotState
from tritondtr.policy.heuristics import Heuristic, unregister_heuristic

BUILTINS = [h.value for h in tritondtr.Heuristic]


class Twin:
    """Feeds the same operations to an engine that uses ``choose`` and one that re-scores
    everything (``select(now, 1)``) before every eviction."""

    def __init__(self, heuristic: str, batch: int = 8, device: str = "cpu") -> None:
        self.a = Engine(heuristic, device=device, batch=batch, capacity=2, seed=3)
        self.b = Engine(heuristic, device="cpu", batch=batch, capacity=2, seed=3)
        self.victims: list[int | None] = []

    def __getattr__(self, name):
        def both(*args, **kwargs):
            ra = getattr(self.a, name)(*args, **kwargs)
            rb = getattr(self.b, name)(*args, **kwargs)
            assert ra == rb
            return ra

        return both

    def evict_one(self, now: int) -> int | None:
        v = self.a.choose(now)
        ref = self.b.select(now, 1)
        assert v == (ref[0] if ref else None), f"choose gave {v}, full re-selection {ref}"
        if v is not None:
            self.a.evict(v)
            self.b.evict(v)
        self.victims.append(v)
        return v


def run_twin(
    heuristic: str, seed: int, n_steps: int = 300, batch: int = 8, spread: bool = False
) -> Twin:
    """Random workloads with eviction loops; small integer costs and sizes make ties common.
    ``spread``: float costs and sizes over four orders of magnitude and longer clock steps
    instead, where scores rarely tie and NOTE [ Bounded choice ]'s bounds decide."""
    rng = random.Random(seed)
    tw = Twin(heuristic, batch=batch)
    slots: list[int] = []
    now = 0
    cost = (lambda: rng.uniform(0, 1e4)) if spread else (lambda: float(rng.randint(0, 4)))
    size = (lambda: rng.randint(1, 1 << 16)) if spread else (lambda: rng.randint(0, 3))
    for _ in range(n_steps):
        now += rng.randint(0, 6 if spread else 2)
        res = [s for s in slots if tw.a.is_resident(s)]
        ev = [s for s in slots if tw.a.is_evicted(s)]
        op = rng.random()
        if op < 0.3 or not slots:
            parents = rng.sample(slots[-10:], min(len(slots[-10:]), rng.randint(0, 3)))
            slots.append(
                tw.new(
                    cost(),
                    size(),
                    now,
                    parents,
                    evictable=rng.random() > 0.05,
                )
            )
        elif op < 0.45 and res:
            tw.access(rng.choice(res), now)
        elif op < 0.55 and ev:
            tw.remat(rng.choice(ev), now)
        elif op < 0.6 and res:
            tw.lock(rng.choice(res))
        elif op < 0.65:
            locked = [s for s in res if tw.a.lock_count(s)]
            if locked:
                tw.unlock(rng.choice(locked))
        elif op < 0.66 and res:
            tw.pin(rng.choice(res))
        elif op < 0.68 and res:
            tw.unpin(rng.choice(res))
        elif op < 0.72:
            t = rng.choice(slots)
            slots.remove(t)
            tw.release(t)
        elif op < 0.75:
            tw.set_cost(rng.choice(slots), cost())
        else:  # an eviction loop at a fixed clock, sometimes with a lock or release inside
            for _ in range(rng.randint(1, 12)):
                if tw.evict_one(now) is None:
                    break
                res = [s for s in slots if tw.a.is_resident(s)]
                if res and rng.random() < 0.15:
                    tw.lock(rng.choice(res))
                elif slots and rng.random() < 0.1:
                    tw.set_cost(rng.choice(slots), cost())
                elif rng.random() < 0.15:  # a resident one only removes a candidate,
                    t = rng.choice(slots)  # an evicted one lowers its neighbours' scores
                    slots.remove(t)
                    tw.release(t)
    tw.a.check_invariants()
    tw.b.check_invariants()
    return tw


@pytest.mark.parametrize("heuristic", BUILTINS)
def test_choose_equals_full_reselection(heuristic):
    hits = 0
    for seed in range(4):
        tw = run_twin(heuristic, seed)
        hits += tw.a.cache_hits
        assert tw.a.selections + tw.a.cache_hits >= len(tw.victims)
    assert hits > 0, "the batched path was never taken: the test does not test it"


@pytest.mark.parametrize("heuristic", ["dtr", "dtr_eq", "dtr_local", "msps"])
def test_bounded_choice_equals_full_reselection(heuristic):
    """NOTE [ Bounded choice ]: across clock steps and mutations, every choice equals a full
    re-scoring, and most choices are served from the bounds."""
    hits = misses = 0
    for seed in range(6):
        tw = run_twin(heuristic, seed, n_steps=400, spread=True)
        hits, misses = hits + tw.a.choice.bounded.hits, misses + tw.a.choice.bounded.misses
    assert hits > misses > 0, (hits, misses)  # both paths taken


@pytest.mark.parametrize("heuristic", ["dtr", "dtr_eq", "dtr_local", "msps"])
def test_bounded_scores_are_the_torch_twins_bit_for_bit(heuristic):
    """The numpy scores NOTE [ Bounded choice ] decides with (its pools, and every full
    scoring of a CPU table) are the torch twin's, bit for bit: every state, free slots,
    staleness 0 and negative, size 0, costs and clocks over many orders of magnitude."""
    rng = np.random.default_rng(7)
    table = MetadataTable(4096, "cpu")
    n = 3000
    cost = (rng.random(n) * 10.0 ** rng.integers(-3, 12, n)).astype(np.float32)
    cost[:20] = 0
    size = rng.integers(0, 1 << 40, n) >> rng.integers(0, 40, n)
    size[20:40] = 0
    last = rng.integers(0, 2**40, n) >> rng.integers(0, 40, n)
    nbhd = (rng.random(n) * 10.0 ** rng.integers(-3, 12, n)).astype(np.float32)
    state = rng.choice([1, 1, 1, 2, 3], n).astype(np.int8)
    slots = table.add_many(cost, size, last, state=state, nbhd_cost=nbhd)
    for s in rng.choice(slots, 100, replace=False).tolist():
        table.free(s)
    choice = BoundedChoice(table, Heuristic(heuristic))
    top = int(last.max())
    for now in (top, top + 1, int(np.median(last)), 0, 2**41, 2**62):
        ref = table.score(heuristic, now, backend="torch").numpy()
        got = choice.scores(now)
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), now
        idx = np.sort(rng.choice(table.capacity, 500, replace=False))
        assert np.array_equal(choice.scores(now, idx).view(np.uint32), ref[idx].view(np.uint32))


def test_bounded_choice_sees_a_listed_score_rise():
    """NOTE [ Bounded choice ] rules 3-5 in an eviction loop: evicting ``a`` raises the
    listed ``b`` (its evicted neighbour's cost joins its own) above the unlisted ``c``, so the
    next victim is ``c``, which only the bound of rule 3 (min score, at d = 0) reveals."""
    eng = Engine("dtr_eq", device="cpu", batch=2)
    a = eng.new(5.0, 5, 0)  # 5 / (5 * 10) = 0.1
    b = eng.new(1.0, 1, 0, [a])  # 1 / (1 * 10) = 0.1, then (1 + 5) / 10 = 0.6
    c = [eng.new(1.5, 1, 0) for _ in range(3)]  # 0.15 each
    assert eng.choose(10) == a
    eng.evict(a)
    assert eng.choose(10) == c[0] != b
    eng.evict(c[0])
    assert eng.choose(10) == c[1]
    assert eng.choose(10) == eng.select(10, 1)[0]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    heuristic=st.sampled_from(["dtr", "dtr_eq", "msps"]),
    batch=st.sampled_from([1, 2, 8, 64]),
)
def test_choose_equals_full_reselection_hypothesis(seed, heuristic, batch):
    run_twin(heuristic, seed, n_steps=120, batch=batch)


def test_choose_saves_scorings_in_an_eviction_loop():
    """Independent chains: evicting one storage changes nobody else's score."""
    eng = Engine("dtr", device="cpu", batch=8)
    assert eng.bounded and LIST == 32  # NOTE [ Bounded choice ] rule 6: not the batch of 8
    for i in range(40):
        eng.new(float(i + 1), 1, 0)
    order = []
    while (v := eng.choose(10)) is not None:
        eng.evict(v)
        order.append(v)
    assert order == list(range(40))
    # a scoring's list of 32 serves 32 victims, the next one the last 8; the 3rd finds none
    assert eng.selections == 3 and eng.cache_hits == 38


def test_mutations_between_choices_drop_the_cache():
    eng = Engine("dtr_eq", device="cpu", batch=4)
    slots = [eng.new(float(i + 1), 1, 0) for i in range(10)]
    assert eng.choose(5) == slots[0]
    eng.evict(slots[0])
    eng.set_cost(slots[9], 0.0)  # was last, now the cheapest
    assert eng.choose(5) == slots[9]
    eng.evict(slots[9])
    eng.remat(slots[0], 5)  # staleness 0: never chosen at clock 5 before the others
    assert eng.choose(5) == slots[1]
    eng.access(slots[1], 5)
    assert eng.choose(5) == slots[2]
    eng.lock(slots[2])
    assert eng.choose(5) == slots[3]
    eng.unlock(slots[2])
    assert eng.choose(5) == slots[2]
    assert eng.choose(6) == slots[2]  # slot 0: 1 / (1 * 1), slot 2: 3 / (1 * 6)
    assert eng.select(6, 1) == [slots[2]]


@pytest.mark.parametrize("mode", ["exact", "none"])
def test_user_heuristics(mode):
    name = f"per_byte_{mode}"
    tritondtr.register_heuristic(
        name, lambda cost, size, last, nbhd, now: (cost + nbhd) / size.float(), nbhd_mode=mode
    )
    try:
        tw = run_twin(name, seed=1)
        # a user heuristic with a neighbourhood may not be monotone in it: no batching
        assert tw.a.batch == (1 if mode == "exact" else 8)
    finally:
        unregister_heuristic(name)


def expected_state(resident: bool, evicted: bool, locks: int, pinned: bool) -> int:
    if evicted:
        return SlotState.EVICTED
    if not resident:
        return SlotState.FREE
    return SlotState.RESIDENT_LOCKED if locks or pinned else SlotState.RESIDENT_EVICTABLE


@pytest.mark.parametrize("heuristic", ["dtr_eq", "lru"])
def test_state_column_follows_locks_and_pins(heuristic):
    rng = random.Random(5)
    eng = Engine(heuristic, device="cpu", capacity=1)
    model: dict[int, dict] = {}
    for now in range(400):
        op = rng.random()
        live = list(model)
        res = [s for s in live if model[s]["res"]]
        if op < 0.25 or not live:
            s = eng.new(1.0, 4, now, rng.sample(live, min(2, len(live))))
            model[s] = {"res": True, "locks": 0, "pin": False}
        elif op < 0.4 and res:
            s = rng.choice(res)
            eng.lock(s)
            model[s]["locks"] += 1
        elif op < 0.55 and res:
            s = rng.choice(res)
            if model[s]["locks"]:
                eng.unlock(s)
                model[s]["locks"] -= 1
        elif op < 0.6 and res:
            s = rng.choice(res)
            eng.pin(s)
            model[s]["pin"] = True
        elif op < 0.65 and res:
            s = rng.choice(res)
            eng.unpin(s)
            model[s]["pin"] = False
        elif op < 0.8:
            cand = [s for s in res if not model[s]["locks"] and not model[s]["pin"]]
            if cand:
                eng.evict(s := rng.choice(cand))
                model[s]["res"] = False
        elif op < 0.9:
            ev = [s for s in live if not model[s]["res"]]
            if ev:
                eng.remat(s := rng.choice(ev), now)
                model[s]["res"] = True
        else:
            s = rng.choice(live)
            eng.release(s)
            del model[s]
        want = np.zeros(eng.table.capacity, np.int8)
        for s, m in model.items():
            want[s] = expected_state(m["res"], not m["res"], m["locks"], m["pin"])
        assert np.array_equal(eng.table.host_state, want)
        if now % 50 == 0:
            eng.check_invariants()
    eng.check_invariants()


def test_nothing_evictable_gives_none():
    eng = Engine("dtr_eq", device="cpu")
    assert eng.choose(0) is None and eng.select(0, 4) == []
    a = eng.new(1.0, 1, 0)
    b = eng.new(1.0, 1, 0, [a], evictable=False)
    eng.lock(a)
    assert eng.choose(5) is None
    eng.unlock(a)
    assert eng.choose(5) == a
    eng.evict(a)
    assert eng.choose(5) is None
    eng.unpin(b)
    assert eng.choose(5) == b


def test_errors_say_what_to_do():
    eng = Engine("dtr", device="cpu")
    a = eng.new(1.0, 8, 0)
    eng.lock(a)
    with pytest.raises(ValueError, match="locked"):
        eng.evict(a)
    eng.unlock(a)
    with pytest.raises(ValueError, match="unbalanced"):
        eng.unlock(a)
    with pytest.raises(ValueError, match="not evicted"):
        eng.remat(a, 1)
    eng.evict(a)
    with pytest.raises(ValueError, match="rematerialize it first"):
        eng.lock(a)
    with pytest.raises(ValueError, match="not a tracked slot"):
        eng.new(1.0, 8, 0, [a + 100])
    with pytest.raises(ValueError, match="cost must be"):
        eng.new(float("nan"), 8, 0)
    with pytest.raises(ValueError, match="cost must be"):
        eng.set_cost(a, -1.0)
    eng.release(a)
    with pytest.raises(ValueError, match="not tracked"):
        eng.access(a, 3)
    with pytest.raises(ValueError, match="batch"):
        Engine("dtr", batch=0)
    with pytest.raises(ValueError, match="unknown heuristic"):
        Engine("nope")


def test_capacity_grows_and_slots_are_reused():
    eng = Engine("dtr_eq", device="cpu", capacity=1)
    slots = [eng.new(1.0, 1, 0, [])]
    for i in range(1, 100):
        slots.append(eng.new(1.0, 1, i, slots[-1:]))
    assert eng.table.capacity == 128
    for s in slots[::2]:
        eng.evict(s)
    for s in slots[10:20]:
        eng.release(s)
    again = eng.new(2.0, 1, 200, [slots[0]])
    assert again in slots[10:20]
    eng.check_invariants()


@pytest.mark.gpu
@pytest.mark.parametrize("heuristic", BUILTINS)
def test_choose_on_cuda_matches_cpu(heuristic):
    tw = Twin(heuristic, device="cuda")
    rng = random.Random(0)
    slots: list[int] = []
    for now in range(200):
        parents = rng.sample(slots[-6:], min(len(slots[-6:]), 2))
        slots.append(tw.new(float(rng.randint(0, 4)), rng.randint(1, 3), now, parents))
        if now % 10 == 9:
            for _ in range(5):
                tw.evict_one(now)
    assert torch.device(tw.a.table.device).type == "cuda"
    tw.a.check_invariants()
