"""Engine calls of a replay, deferred until the first eviction (NOTE [ Lazy replay ]).

# NOTE [ Lazy replay ]
# 1. Nothing is evicted by the heuristic while ``memory + op bytes <= budget``, so until then
#    the engine's per-event work (table rows, neighbourhoods, locks, access times) cannot
#    change a decision. A replay starts *lazy*: it calls no engine method. A new storage gets
#    a placeholder slot; the calls that build the engine's state (new, set_cost, add_parents,
#    pin, evict, remat) are appended to a log in order, with the arguments they would have
#    had; last access times live in ``last`` only; no lock is taken.
# 2. The first op that needs room *syncs* the replay before any victim is asked for: the log
#    is replayed on the engine in order (the same calls with the same arguments, so the table,
#    the neighbourhoods and the eqclass forest come out as an eager replay leaves them), then
#    every storage whose last access is newer than what its new / remat set gets one
#    ``access``, then the locks held at that point (the inputs of the op in flight and of the
#    rematerializations under way) are taken. From then on every call goes to the engine at
#    once. A replay that never needs room (e.g. ratio 1.0 of a trace without transient
#    copies) never touches the engine.
# 3. What the sync leaves out cannot matter: ``access`` only sets ``last_access`` (the last
#    value wins, and ``last`` holds it) and touches no neighbourhood; a lock taken and
#    released before the sync leaves the state it found; the engine's choice cache starts
#    empty. The slots the engine hands out replace the placeholders.
# 4. ``ties="simrd"`` replays synced from the start (its pool reads the engine's locks);
#    ``lazy=False`` does the same, for tests that compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass

# The deferred calls, by storage id: (LOG_NEW, storage, op, now), (LOG_COST, storage, cost),
# (LOG_EDGES, storage, parent storages), (LOG_PIN, storage), (LOG_EVICT, storage),
# (LOG_REMAT, storage, now).
LOG_NEW, LOG_COST, LOG_EDGES, LOG_PIN, LOG_EVICT, LOG_REMAT = range(6)
UNSYNCED = 1 << 62  # the placeholder slot of a storage created while lazy (not a real slot)

__all__ = ["EngineCalls", "Frame", "held_storages"]


class EngineCalls:
    """The engine calls of a replay (``tritondtr.sim.replay``'s ``_Run`` derives from it),
    made at once or, while ``lazy``, logged (NOTE [ Lazy replay ]).

    Uses the replay's ``p`` (program), ``e`` (engine), ``slot``, ``sid_of_slot``, ``last``,
    ``cost``, ``pinned``, ``lazy`` and ``log``; every method takes a storage id.
    """

    def _new(self, s: int, o: int, cost: float, now: float) -> None:
        """Storage ``s`` is created by the first run of op ``o``, at ``now``."""
        self.cost[s] = cost
        self.last[s] = now
        if self.lazy:
            self.slot[s] = UNSYNCED
            self.log.append((LOG_NEW, s, o, now))
        else:
            slot = self.slot
            v = self.e.new(
                cost, self.p.st_size[s], now, [slot[q] for q in self.p.op_new_parents[o]]
            )
            slot[s] = v
            self.sid_of_slot[v] = s

    def _set_cost(self, s: int) -> None:
        if self.lazy:
            self.log.append((LOG_COST, s, self.cost[s]))
        else:
            self.e.set_cost(self.slot[s], self.cost[s])

    def _add_parents(self, s: int, parents: list[int]) -> None:
        if self.lazy:
            self.log.append((LOG_EDGES, s, parents))
        else:
            slot = self.slot
            self.e.add_parents(slot[s], [slot[q] for q in parents])

    def _remat(self, s: int) -> None:
        if self.lazy:
            self.log.append((LOG_REMAT, s, self.last[s]))
        else:
            self.e.remat(self.slot[s], self.last[s])

    def _evict_slot(self, s: int) -> None:
        if self.lazy:
            self.log.append((LOG_EVICT, s))
        else:
            self.e.evict(self.slot[s])

    def _pin(self, s: int) -> None:
        if self.pinned[s]:
            return
        self.pinned[s] = 1
        if self.lazy:
            self.log.append((LOG_PIN, s))
        else:
            self.e.pin(self.slot[s])

    def _lock(self, s: int) -> None:
        if not self.lazy:
            self.e.lock(self.slot[s])

    def _unlock(self, s: int) -> None:
        if not self.lazy:
            self.e.unlock(self.slot[s])

    def _sync(self, held: list[int]) -> None:
        """Rule 2: replay the log on the engine, then the newer accesses, then lock the
        storages in ``held`` (with multiplicity); calls go to the engine from now on."""
        p, e, slot, last = self.p, self.e, self.slot, self.last
        stamped = {}  # storage -> the last access its new / remat gave the engine
        for entry in self.log:  # the layouts: the LOG_* codes above
            k, s = entry[0], entry[1]
            if k == LOG_NEW:
                _, _, o, now = entry
                v = e.new(p.op_cost[o], p.st_size[s], now, [slot[q] for q in p.op_new_parents[o]])
                slot[s] = v
                self.sid_of_slot[v] = s
                stamped[s] = now
            elif k == LOG_EVICT:
                e.evict(slot[s])
            elif k == LOG_REMAT:
                _, _, now = entry
                e.remat(slot[s], now)
                stamped[s] = now
            elif k == LOG_COST:
                _, _, cost = entry
                e.set_cost(slot[s], cost)
            elif k == LOG_EDGES:
                _, _, parents = entry
                e.add_parents(slot[s], [slot[q] for q in parents])
            else:
                e.pin(slot[s])
        for s, now in stamped.items():
            if last[s] != now:
                e.access(slot[s], last[s])
        for s in held:
            e.lock(slot[s])
        self.log = []
        self.lazy = False


@dataclass(slots=True)
class Frame:
    """One tensor the replay's ``_materialize`` is making defined (its explicit stack)."""

    tensor: int
    remat: bool  # a rematerialization, not the program's first computation
    inputs: list[int]  # the tensors its op reads
    missing: list[int]  # those that were not defined when the frame began
    next: int  # missing[:next] are defined (and locked) by now


def held_storages(stack: list[Frame], sid: list) -> list[int]:
    """The storages locked by the frames of the replay's ``_materialize`` stack, with
    multiplicity: each frame's inputs but its missing ones not yet computed (rule 2)."""
    held = []
    for frame in stack:
        pending = frame.missing[frame.next :]
        for q in frame.inputs:
            if q in pending:
                pending.remove(q)
            else:
                held.append(sid[q])
    return held
