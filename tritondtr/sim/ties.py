"""The reference simulator's tie order, for reproducing its numbers (``ties="simrd"``).

# NOTE [ Tie order ]
# 1. The engine breaks score ties by the lowest slot id (NOTE [ Scoring rules ] 7); slots
#    are handed out in creation order, so the oldest storage wins a tie. That is the default.
# 2. simrd scans its candidate list with ``<=`` and keeps the last minimum; the list is in
#    the order storages last became evictable (created, rematerialized, or unlocked after
#    serving as an input), so the storage that became evictable most recently wins. A float
#    score of exactly 0 stops the scan at once: the earliest such storage wins.
# 3. ``ties="simrd"`` reproduces 2 on top of the engine's own scores: the simulator stamps
#    storages when they become evictable and, among the candidates that share the engine's
#    minimum score, takes the latest stamp (the earliest for a float score of 0). The
#    scores, the neighbourhoods and the candidate set all stay the engine's.
# 4. Heuristics with many exact ties (``size``: equal tensor sizes are common) depend on
#    this choice; docs/simulator.md gives the measured effect on the Figure 2 logs.
"""

from __future__ import annotations

import numpy as np

from ..policy.scoring import RESIDENT_EVICTABLE

__all__ = ["PoolOrder"]


class PoolOrder:
    """Stamps of when each slot last became evictable, and the simrd-order choice."""

    def __init__(self, capacity: int = 1024) -> None:
        self.stamps = np.zeros(capacity, dtype=np.int64)
        self.counter = 0

    def stamp(self, slot: int) -> None:
        """``slot`` just became evictable (NOTE [ Tie order ] 2)."""
        if slot >= self.stamps.shape[0]:
            grown = np.zeros(max(2 * self.stamps.shape[0], slot + 1), dtype=np.int64)
            grown[: self.stamps.shape[0]] = self.stamps
            self.stamps = grown
        self.counter += 1
        self.stamps[slot] = self.counter

    def choose(self, engine, now: int) -> int | None:
        """The victim under NOTE [ Tie order ] 3, from one full scoring by ``engine``."""
        engine.flush()
        table = engine.table
        cand = np.flatnonzero(table.host_state == RESIDENT_EVICTABLE)
        if cand.size == 0:
            return None
        scores = (
            table.score(engine.heuristic, int(now), backend=engine.backend, seed=engine.seed)
            .cpu()
            .numpy()[cand]
        )
        if scores.dtype.kind == "f":
            scores = np.where(np.isnan(scores), np.inf, scores)
        best = scores.min()
        tied = cand[scores == best]
        stamps = (
            self.stamps[tied]
            if tied.max() < self.stamps.shape[0]
            else np.array([self.stamps[s] if s < self.stamps.shape[0] else 0 for s in tied])
        )
        if scores.dtype.kind == "f" and best == 0:
            return int(tied[np.argmin(stamps)])
        return int(tied[np.argmax(stamps)])
