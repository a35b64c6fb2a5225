"""Sampled victim selection: the heuristic applied to a random sqrt(N) subset of candidates.

The DTR prototype (and production systems after it) do not scan every candidate: they score
a random sample of about sqrt(N) of the N candidates and evict the best of the sample. This
module offers that shortcut as an engine for the simulator, so that benchmarks can compare
it with the exact full scan in speed and in the overhead it leads to
(benchmarks/bench_sim_sampling.py)::

    simulate(trace, "dtr_eq", ratio=0.5,
             engine_factory=lambda h: SampledEngine(h, capacity=2 * trace.num_tensors))

# NOTE [ Sampled selection ]
# 1. Candidates are the slots whose ``state`` column is RESIDENT_EVICTABLE (one numpy scan
#    of the host column; NOTE [ Scoring rules ] 1). ``k = ceil(fraction(N))`` of them are
#    drawn uniformly without replacement (``numpy.random.Generator``, seeded); with k >= N
#    all are taken and the choice is the exact one.
# 2. The sample's rows of the table's host columns are scored by the heuristic's torch twin
#    (:func:`tritondtr.policy.select`, torch backend): same formulas, ties to the lowest slot
#    id of the sample. ``random`` hashes the position in the sample, not the slot id.
# 3. Every choice re-samples and re-scores (no cache): this is the cost being measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .. import policy
from ..engine.engine import Engine
from ..engine.table import SlotState

__all__ = ["SampledEngine"]

_EVICTABLE = int(SlotState.RESIDENT_EVICTABLE)


class SampledEngine(Engine):
    """An :class:`~tritondtr.engine.Engine` whose :meth:`choose` picks the best of a random
    sample of the candidates (NOTE [ Sampled selection ]).

    Args (beyond the engine's): ``fraction`` maps the number of candidates N to the sample
    size (default ``math.sqrt``); ``sample_seed`` seeds the draws.
    """

    def __init__(
        self,
        heuristic="dtr_eq",
        *,
        fraction: Callable[[int], float] = math.sqrt,
        sample_seed: int = 0,
        **kwargs,
    ) -> None:
        kwargs.setdefault("device", "cpu")
        super().__init__(heuristic, **kwargs)
        self.fraction = fraction
        self.rng = np.random.default_rng(sample_seed)
        self.sampled = 0  # candidates scored, summed over choices

    def choose(self, now: int) -> int | None:
        self.nbhd.flush()
        self.selections += 1
        t = self.table
        cand = np.flatnonzero(t.host_state == _EVICTABLE)
        if cand.size == 0:
            return None
        k = max(1, math.ceil(self.fraction(cand.size)))
        if k < cand.size:
            cand = np.sort(self.rng.choice(cand, size=k, replace=False))
        self.sampled += cand.size
        cols = {name: torch.from_numpy(getattr(t, "host_" + name)[cand]) for name in t.COLUMNS}
        best = policy.select(self.heuristic, cols, now, k=1, backend="torch", seed=self.seed)
        return int(cand[int(best[0])])
