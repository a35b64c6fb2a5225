"""Backward pins of a DTR core: the storages a backward pass creates, pinned while gradients
flow through them, unpinned in stages when nothing else is left to evict, and kept out of the
engine until then (NOTE [ Backward storages ]).

# NOTE [ Backward storages ]
# 1. Storages created while autograd runs a backward pass are pinned when created: gradients
#    flow through them right away, and evicting them mostly causes rematerialization cascades
#    (far fewer rematerializations when they stay; measured: see docs/benchmarks.md,
#    Measurements behind the NOTEs, Backward storages).
# 2. They are the lowest priority, not never: when nothing else can be evicted and the budget
#    is exceeded, they are unpinned and become ordinary candidates, in two stages:
# 3. First only those none of whose inputs is an evicted backward storage: one recomputation
#    brings them back. The others (a gradient whose incoming gradient was released, the
#    running sum of a shared weight's gradient) can only be recomputed by running again the
#    part of the backward pass that led to them, itself recomputing the forward activations
#    it reads: the neighbourhood costs do not tell them apart (they all touch the one large
#    evicted component the released gradients form), and evicting one made single
#    recomputations of over 1,000 rematerializations. Only when the first stage unpins
#    nothing are the others unpinned too. Measured on the twin: see docs/benchmarks.md,
#    Measurements behind the NOTEs, Backward storages.
# 4. Between the two stages, a middle one: those whose recomputation needs at most
#    ``_BW_WALK`` (8) evicted backward storages (a walk up their evicted backward
#    ancestors, stopped at resident ones). A gradient read by one cheap op from a resident
#    gradient (``mm`` of ``mul(g, mask)`` while ``g`` stays) comes back with a few
#    recomputations; the running sum of the residual stream's gradient, whose addends were
#    released, comes back only by running the backward pass again from the loss. Without
#    this stage both were unpinned at once when the first stage found nothing, and TinyGPT
#    at 10 % of its peak evicted the residual gradient and thrashed (11,000 to 13,000
#    rematerializations a step on the twin; measured: docs/history/simulator-log.md, Tight
#    budgets on TinyGPT).
# 5. Until then they stay out of the engine: no table row, no neighbourhood node, no access,
#    lock or release event (``BackwardPins.out``; their last use in the core's ``seen``,
#    their locks in ``BackwardPins.out_locks``). They were most of the engine's storages in
#    a training step (LSTM, GRU loop and TreeLSTM of the benchmarks: 356 of 515, 522 of 808,
#    232 of 375 at 50 %), each a row, an eviction into the evicted classes when released and a
#    release when forgotten, for storages that are never candidates. They enter it
#    (:meth:`Core.admit`, as :meth:`Core.sync` enters a storage: pinned if resident,
#    evicted if not, its last use, its locks, edges from its inputs and to its readers in
#    the engine) when rule 2 first needs them: all of them, in creation order, and every
#    later one as it is made until the step ends (the freeze at the optimizer's first
#    parameter write); one alone when it is recomputed (a released gradient an evicted
#    storage reads) or anchored. Not under ``stress``, which keeps no map of readers (the
#    edges to them). What differs from entering them when made: the evicted
#    classes never hold released backward storages that were not admitted, so a resident
#    storage's neighbourhood cost does not count them, and union-find classes are not
#    merged through them. On the policy sweep's 15 recorded steps every run at 40 to 90 %
#    of the peak is unchanged; 11 of the 45 at 10 to 30 % change, one worse (+1.7 points of
#    extra compute), the others better or within 0.3 points (docs/history/simulator-log.md,
#    Backward storages out of the engine).
"""

from __future__ import annotations

from ..engine.residency import EVICTED, RESIDENT

__all__ = ["BackwardPins"]

_BW_WALK = 8  # rule 4: evicted backward ancestors, at most


class BackwardPins:
    """NOTE [ Backward storages ] for one core, the one writer of its state: ``bw``, the
    backward storages still pinned (rule 2), with ``in_bw`` per storage (listed there);
    ``out``, those kept out of the engine (rule 5, creation order) and ``out_locks``, their
    locks; ``admitted``, whether they were let in this step; ``forced``, whether the budget
    unpinned some this step (NOTE [ Unheld storages ] rule 5 in unheld.py). Reads the core's
    per-storage lists, given at construction (appended to, never replaced)."""

    def __init__(self, state, pinned, backward, inputs, stats) -> None:
        self.state, self.pinned, self.backward, self.inputs = state, pinned, backward, inputs
        self.stats = stats
        self.bw: list[int] = []
        self.in_bw = bytearray()
        self.out: dict[int, None] = {}
        self.out_locks: dict[int, int] = {}
        self.admitted = False
        self.forced = False

    # ------------------------------------------------------------ storages
    def grow(self) -> None:
        """A new storage id (the core's lists grew by one)."""
        self.in_bw.append(0)

    def keeps_out(self, readers: bool) -> bool:
        """Rule 5: are new backward storages kept out of the engine? Not once let in this
        step, and not without the core's map of readers (``readers``; none under
        ``stress``), which letting one in needs for the edges to the storages reading it."""
        return not self.admitted and readers

    def keep_out(self, sid: int, resident: bool) -> None:
        """Rule 5: ``sid``, pinned by rule 1, stays out of the engine."""
        self.out[sid] = None
        if resident:
            self.bw.append(sid)
            self.in_bw[sid] = 1

    def pin(self, sid: int) -> None:
        """Rule 1: ``sid`` entered the engine pinned as a backward storage."""
        self.bw.append(sid)
        self.in_bw[sid] = 1

    def let_in(self, sid: int) -> int:
        """Rule 5: ``sid`` enters the engine; returns the locks it holds there."""
        del self.out[sid]
        return self.out_locks.pop(sid, 0)

    def let_all_in(self) -> list[int]:
        """Rule 5: every storage kept out enters the engine, in creation order, and later
        ones as they are made until the step ends."""
        self.admitted = True
        return list(self.out)

    def step_ended(self) -> None:
        """The step ended (the freeze at the optimizer's first parameter write)."""
        self.forced = False
        self.admitted = False

    # --------------------------------------------------------------- locks
    def lock(self, sid: int) -> None:
        """Lock ``sid``, kept out of the engine: counted until it is let in."""
        if sid not in self.out:
            raise AssertionError(f"bug of tritondtr: locking storage {sid}, not in the engine")
        self.out_locks[sid] = self.out_locks.get(sid, 0) + 1

    def unlock(self, sid: int) -> None:
        n = self.out_locks.get(sid, 0) - 1
        if n < 0:
            raise ValueError(f"unlock: storage {sid} is not locked (unbalanced lock/unlock)")
        if n:
            self.out_locks[sid] = n
        else:
            del self.out_locks[sid]

    # ------------------------------------------------------------- leaving
    def externalize(self, sid: int) -> None:
        """``sid``, kept out of the engine, became external."""
        if sid in self.out_locks:
            raise AssertionError(f"bug of tritondtr: externalizing locked storage {sid}")
        self.out.pop(sid, None)

    def forget(self, sid: int, kept_out: bool) -> None:
        """``sid`` left the core; ``kept_out``: out of the engine, whose locks go too (as the
        engine's release drops a slot's locks)."""
        if kept_out:
            self.out.pop(sid, None)
            self.out_locks.pop(sid, None)
        self.in_bw[sid] = 0

    # ------------------------------------------------------------- unpinning
    def unpin(self, engine, eslot, anchored) -> bool:
        """Rules 2 to 4, once every storage kept out is in the engine (rule 5: the core lets
        them in first); False if nothing was unpinned. Anchored storages stay pinned (NOTE [
        Anchored storages ] rule 4 in anchors.py)."""
        state, pinned, in_bw = self.state, self.pinned, self.in_bw
        live = []
        for sid in self.bw:
            if in_bw[sid] and state[sid] == RESIDENT and not pinned[sid] and sid not in anchored:
                live.append(sid)
            else:
                in_bw[sid] = 0
        backward, inputs = self.backward, self.inputs
        cheap = [
            sid for sid in live if not any(state[i] == EVICTED and backward[i] for i in inputs[sid])
        ]
        if not cheap:  # rule 4
            cheap = [sid for sid in live if self._few_ancestors(sid)]
        if cheap:  # rule 3
            keep = set(cheap)
            self.bw = [sid for sid in live if sid not in keep]
        else:
            cheap, self.bw = live, []
        for sid in cheap:
            engine.unpin(eslot[sid])
            in_bw[sid] = 0
        self.stats.backward_unpins += bool(cheap)
        self.forced = self.forced or bool(cheap)  # NOTE [ Unheld storages ] rule 5
        return bool(cheap)

    def _few_ancestors(self, sid: int) -> bool:
        """Rule 4: does recomputing ``sid`` need at most ``_BW_WALK`` evicted backward
        storages?"""
        state, backward, inputs = self.state, self.backward, self.inputs
        seen, todo = set(), [sid]
        while todo:
            for i in inputs[todo.pop()]:
                if state[i] == EVICTED and backward[i] and i not in seen:
                    if len(seen) == _BW_WALK:
                        return False
                    seen.add(i)
                    todo.append(i)
        return True
