"""Random programs driven straight into the DTR core, every invariant checked after every
step: the core's own (residency, bytes, the kept ancestor sums of NOTE [ Unheld storages ]
rule 6), the engine's, the neighbourhood's and the eqclass's (which compare every resident
slot's value with its definition), and no lock left between ops (NOTE [ Deferred locks ]).
A pre-existing eqclass bug (a class whose pending change came back to 0, NOTE [ Incremental
class values ] rule 4) was found by a program like these; its minimal case is in
tests/engine/test_neighborhood.py."""

from __future__ import annotations

import random

import pytest
import torch

from tests.core_executor import Counting
from tritondtr.core import BudgetError, Core
from tritondtr.engine.residency import EVICTED, EXTERNAL, RESIDENT


def _program(seed: int, heuristic: str, steps: int = 250) -> Core:
    """Ops with 0-3 inputs (sometimes one twice, sometimes writing one in place, sometimes in
    a backward pass or pinned), releases, forgets of storages nothing needs, program reads of
    evicted storages, anchors, outside bytes and freezes, in random order."""
    rng = random.Random(seed)
    stress = rng.random() < 0.15
    core = Core(
        None if stress else rng.randint(10, 40) * 100,
        heuristic,
        Counting(),
        backend="torch",
        stress=stress,
    )
    core.start(torch.device("cpu"))
    held: set[int] = set()  # storages the program holds a tensor of
    live: set[int] = set()  # storages not forgotten
    anchors: list[int] = []
    outside = 0
    for _ in range(steps):
        r = rng.random()
        try:
            if r < 0.45 or not held:
                can = sorted(s for s in held if core.state[s] != EXTERNAL)
                ins = rng.sample(can, rng.randint(0, min(3, len(can))))
                if ins and rng.random() < 0.2:
                    ins.append(ins[0])
                core.prepare()
                try:
                    for s in ins:
                        core.use(s)
                    core.check_invariants(ops_in_flight=True)
                    core.begin("op")
                    core.check_invariants(ops_in_flight=True)
                finally:
                    core.release_inputs()
                writes = -1
                if ins and rng.random() < 0.2 and core.state[ins[0]] == RESIDENT:
                    writes = ins[0]
                    core.hand_out(writes)
                    held.discard(writes)
                    core.check_invariants(ops_in_flight=True)
                s = core.new(
                    rng.choice([50, 100, 100, 200, 300]),
                    rng.choice([1.0, 5.0, 10.0, 100.0, 1000.0]),
                    tuple(dict.fromkeys(ins)),
                    "op",
                    pinned=rng.random() < 0.05,
                    backward=rng.random() < 0.2,
                    writes=writes,
                )
                held.add(s)
                live.add(s)
                core.end()
            elif r < 0.68:
                s = rng.choice(sorted(held))
                held.discard(s)
                if core.state[s] != EXTERNAL:
                    core.release(s)
            elif r < 0.75:
                needed = {i for o in live for i in core.inputs[o]}
                for s in sorted(live - held - needed):
                    if rng.random() < 0.7:
                        core.forget(s)
                        live.discard(s)
                        anchors = [a for a in anchors if a != s]
            elif r < 0.82:
                evicted = sorted(s for s in held if core.state[s] == EVICTED)
                if evicted:
                    s = rng.choice(evicted)
                    core.materialize(s)
                    core.unlock(s)
                    if rng.random() < 0.5:  # read, then handed out as a plain tensor
                        core.hand_out(s)
                        held.discard(s)
            elif r < 0.86:
                can = sorted(s for s in live if core.state[s] in (RESIDENT, EVICTED))
                if can:
                    s = rng.choice(can)
                    core.anchor(s)
                    anchors.append(s)
            elif r < 0.90:
                if anchors:
                    core.unanchor(anchors.pop(rng.randrange(len(anchors))))
            elif r < 0.94:
                n = rng.choice([50, 100])
                core.grow_outside(n, "x")
                outside += n
            elif r < 0.97:
                if outside:
                    core.shrink_outside(outside)
                    outside = 0
            elif rng.random() < 0.3:
                core.freeze()
                anchors = []
                held = {s for s in held if core.state[s] != EXTERNAL}
        except BudgetError:
            break  # the budget cannot hold an op's working set: a valid end
        core.check_invariants()
        assert not (core.recomputed or core.deferred or core.input_locks), "locks left"
    return core


@pytest.mark.parametrize("heuristic", ["dtr_eq", "dtr", "msps", "lru"])
@pytest.mark.parametrize("seed", range(4))
def test_random_programs_keep_every_invariant(heuristic, seed):
    core = _program(seed, heuristic)
    assert core.now > 0


@pytest.mark.parametrize("seed", [51, 133])
def test_programs_that_caught_the_eqclass_pending_bug(seed):
    """Of 200 seeds, these two failed before 509d49b (a frontier member's stale value after a
    union whose pending change came back to 0)."""
    core = _program(seed, "dtr_eq")
    assert core.stats.evictions > 0
