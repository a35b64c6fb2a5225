"""The DTR core's anchored storages and outside bytes (NOTE [ Anchored storages ] in
tritondtr/core/anchors.py), driven directly with a counting executor."""

from __future__ import annotations

import pytest
import torch

from tests.core_executor import Counting
from tritondtr.core import BudgetError, Core
from tritondtr.engine.residency import EVICTED, RESIDENT


def chain(budget=None, stress=False, n=4, size=100):
    """``n`` storages, each computed from the previous one."""
    ex = Counting()
    core = Core(budget, "dtr_eq", ex, backend="torch", stress=stress)
    core.start(torch.device("cpu"))
    sids = []
    for i in range(n):
        core.begin(f"op{i}")
        sids.append(core.new(size, 1.0, tuple(sids[-1:]), f"op{i}"))
        core.end()
    return core, ex, sids


def test_anchor_recomputes_pins_and_survives_release():
    core, ex, (_, _, c, _) = chain(stress=True)
    assert core.state[c] == EVICTED
    core.anchor(c)
    assert core.state[c] == RESIDENT and ex.recomputed[-1] == c
    core.evict_all()
    assert core.state[c] == RESIDENT  # rule 1: never evicted
    core.release(c)  # its wrapper died: d's recipe still needs it (rule 2)
    assert core.state[c] == RESIDENT
    core.check_invariants()
    core.unanchor(c)  # rule 3: no wrapper holds it: dropped at once
    assert core.state[c] == EVICTED and ex.freed[-1] == c
    core.check_invariants()


def test_anchors_are_counted_and_a_held_storage_becomes_a_candidate():
    core, _, (*_, d) = chain(stress=True)
    core.anchor(d)
    core.anchor(d)
    core.unanchor(d)
    core.evict_all()
    assert core.state[d] == RESIDENT  # one anchor left
    core.unanchor(d)
    assert core.state[d] == RESIDENT and core.held[d]  # a candidate now, not dropped
    assert core.evict_all() == 1 and core.state[d] == EVICTED


def test_held_descendants():
    core, _, (a, b, c, d) = chain()
    core.release(b)
    core.release(c)
    assert core.held_descendants([b]) == [d]
    assert core.held_descendants([a]) == [a, d]


def test_outside_bytes_count_and_make_room():
    core, _, sids = chain(budget=450)
    assert core.resident == 400
    core.grow_outside(150, "outside")  # 550 > 450: one victim of 100 bytes
    assert core.resident == 450 and core.stats.peak_bytes == 550
    assert sum(core.state[s] == EVICTED for s in sids) == 1
    core.check_invariants()
    core.shrink_outside(150)
    assert core.resident == 300
    core.check_invariants()
    with pytest.raises(BudgetError, match="outside the tracked storages"):
        core.grow_outside(1000, "outside")
