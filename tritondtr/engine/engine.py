"""The engine: metadata table + neighbourhood maintenance + eviction policy, behind one facade.

Both the simulator and the runtime drive an :class:`Engine`; it owns a
:class:`~tritondtr.engine.table.MetadataTable`, a
:class:`~tritondtr.engine.neighborhood.Neighborhood` and the host-side lock counts and pins,
and keeps the table's ``state`` column equal to::

    free                                        -> FREE
    resident, unlocked, unpinned                -> RESIDENT_EVICTABLE   (a candidate)
    resident, locked (count > 0) or pinned      -> RESIDENT_LOCKED
    evicted                                     -> EVICTED

The victim choice itself (which scoring serves which choice) is a strategy of
:mod:`tritondtr.engine.choice`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import policy
from ..policy.heuristics import CustomHeuristic, Heuristic, NbhdMode, get_heuristic
from .bounded import BOUNDED, BoundedChoice
from .choice import MISS, BatchedChoice, BoundedStrategy, StaleChoice, VictimChoice
from .neighborhood import _STATE_NAMES, EVICTED, FREE, RESIDENT, Neighborhood
from .table import MetadataTable, SlotState

__all__ = ["Engine"]

_EVICTABLE = int(SlotState.RESIDENT_EVICTABLE)
_LOCKED = int(SlotState.RESIDENT_LOCKED)
_EVICTED = int(SlotState.EVICTED)
_F32_MAX = float(np.finfo(np.float32).max)


def _ignore(slot: int) -> None:
    pass


class Engine:
    """Metadata table + neighbourhood maintenance + eviction policy.

    Args:
        heuristic: a :class:`Heuristic`, a registered user heuristic, or its name.
        device: where the table's device columns live (default: CUDA when available).
        backend: ``auto`` / ``triton`` / ``torch`` (see :class:`tritondtr.Backend`).
        seed: seed of the ``random`` heuristic.
        capacity: initial number of slots (grows by doubling).
        batch: victims kept per scoring for :meth:`choose` (NOTE [ Exact batched choice ]);
            the heuristics of NOTE [ Bounded choice ] on CPU tables keep their own list of
            ``bounded.LIST`` (32) instead.
        reuse: clock ticks a scoring may serve choices for, across mutations (NOTE [ Stale
            batched choice ]; 0, the default: exact, every choice is a fresh scoring's).

    Slots are the table's slot ids (ints). Costs are float32 in the caller's unit (ns), sizes
    int bytes, ``now`` an int logical clock. Counters: ``selections`` (scorings run),
    ``cache_hits`` (choices served without scoring), ``evictions``, ``remats``. Read, never
    written, by the victim choice (``choice``): ``residency``, ``locks`` and ``pinned`` per
    slot, and ``epoch``, the count of mutations that can lower a score or add a candidate.
    """

    def __init__(
        self,
        heuristic: Heuristic | CustomHeuristic | str = "dtr_eq",
        *,
        device: torch.device | str | None = None,
        backend: policy.Backend | str = "auto",
        seed: int = 0,
        capacity: int = 1024,
        batch: int = 8,
        reuse: int = 0,
    ) -> None:
        self.heuristic = get_heuristic(heuristic)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if not isinstance(reuse, int) or isinstance(reuse, bool) or reuse < 0:
            raise ValueError(f"reuse must be an int >= 0 (clock ticks), got {reuse!r}")
        self.reuse = reuse
        self.table = MetadataTable(capacity, device)
        self.backend = policy.resolve_backend(backend, self.table.device, self.heuristic)
        self.seed = int(seed)
        mode = self.heuristic.nbhd_mode
        # NOTE [ Exact batched choice ] rule 5
        self.batch = batch if isinstance(self.heuristic, Heuristic) or mode is NbhdMode.NONE else 1
        self.nbhd = Neighborhood(self.table, mode)
        self.residency = self.nbhd.state  # FREE / RESIDENT / EVICTED per slot (shared)
        # NOTE [ Bounded choice ]: None where it does not apply (the batched list serves)
        self._bounded = (
            BoundedChoice(self.table, self.heuristic)
            if self.heuristic in BOUNDED and not reuse and self.table.device.type == "cpu"
            else None
        )
        self._changed = self._bounded.changed if self._bounded is not None else _ignore
        self.nbhd.lowered = self._bounded.dirty if self._bounded is not None else None
        self.choice: VictimChoice = (
            BoundedStrategy(self._bounded)
            if self._bounded is not None
            else StaleChoice()
            if reuse
            else BatchedChoice()
        )
        self.locks: list[int] = [0] * self.table.capacity
        self.pinned = bytearray(self.table.capacity)
        self.epoch = 0  # bumped by every mutation that can lower a score or add a candidate
        self.selections = 0
        self.cache_hits = 0
        self.evictions = 0
        self.remats = 0
        if self.backend is policy.Backend.TRITON and self.table.device.type == "cuda":
            # Compile the selection now, on the empty table, not inside the first eviction
            # (a JIT compile there would land in a training step's decision).
            self.table.select(self.heuristic, 0, self.batch, backend=self.backend, seed=self.seed)
            self.table.device_syncs = 0  # not a decision

    # ------------------------------------------------------------------- events
    def new(
        self,
        cost: float,
        size: int,
        now: int,
        parents: Sequence[int] = (),
        *,
        evictable: bool = True,
    ) -> int:
        """Track a new resident storage produced from ``parents`` (slots); returns its slot.
        ``evictable=False`` pins it (see :meth:`pin`)."""
        if not 0.0 <= cost <= _F32_MAX:
            raise ValueError(f"cost must be a finite float32 >= 0 (compute time), got {cost!r}")
        if size < 0:
            raise ValueError(f"size must be >= 0 bytes, got {size!r}")
        st = self.residency
        for p in parents:
            if not (0 <= p < len(st) and st[p]):
                raise ValueError(
                    f"new: parent {p!r} is not a tracked slot (released or never "
                    "created); pass the slots returned by Engine.new"
                )
        slot = self.table.add(cost, size, now, _EVICTABLE if evictable else _LOCKED)
        if slot >= len(self.locks):
            n = self.table.capacity - len(self.locks)
            self.locks.extend([0] * n)
            self.pinned.extend(bytes(n))
        self.pinned[slot] = not evictable
        self.nbhd.on_new(slot, cost, parents)
        self.epoch += 1
        self._changed(slot)
        return slot

    def add_parents(self, slot: int, parents: Sequence[int]) -> None:
        """Another op also produced (a view of) ``slot`` from ``parents``: add those edges."""
        self._live(slot, "add_parents")
        for p in parents:
            self._live(p, "add_parents (parent)")
        self.nbhd.add_edges(slot, parents)
        self.epoch += 1

    def set_cost(self, slot: int, cost: float) -> None:
        """Set the compute cost of ``slot`` (e.g. once an op's time is measured)."""
        self._live(slot, "set_cost")
        if not 0.0 <= cost <= _F32_MAX:
            raise ValueError(f"cost must be a finite float32 >= 0 (compute time), got {cost!r}")
        self.table.set_cost(slot, cost)
        self.nbhd.on_cost(slot, cost)
        self.epoch += 1
        self._changed(slot)

    def access(self, slot: int, now: int) -> None:
        """Record a use of ``slot`` at logical time ``now`` (last_access = now)."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot]):  # the checks inline: a hot path
            self._live(slot, "access")
        self.table.touch(slot, now)
        self.epoch += 1
        self._changed(slot)

    def lock(self, slot: int) -> None:
        """Take a (re-entrant) lock: a locked slot is never a candidate. Needs a resident slot."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot] == RESIDENT):
            self._resident(slot, "lock")
        c = self.locks[slot]
        self.locks[slot] = c + 1
        if c == 0 and not self.pinned[slot]:
            self.table.set_state(slot, _LOCKED)

    def unlock(self, slot: int) -> None:
        """Release one lock taken by :meth:`lock`."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot] == RESIDENT):
            self._resident(slot, "unlock")
        c = self.locks[slot]
        if c == 0:
            raise ValueError(f"unlock: slot {slot} is not locked (unbalanced lock/unlock)")
        self.locks[slot] = c - 1
        if c == 1 and not self.pinned[slot]:
            self.table.set_state(slot, _EVICTABLE)
            self.epoch += 1
            self._changed(slot)

    def pin(self, slot: int) -> None:
        """Never evict ``slot`` (constants, never-evict ops) until :meth:`unpin`."""
        self._resident(slot, "pin")
        if not self.pinned[slot]:
            self.pinned[slot] = 1
            self.table.set_state(slot, _LOCKED)

    def unpin(self, slot: int) -> None:
        st = self.residency
        if not (0 <= slot < len(st) and st[slot] == RESIDENT):
            self._resident(slot, "unpin")
        if self.pinned[slot]:
            self.pinned[slot] = 0
            if not self.locks[slot]:
                self.table.set_state(slot, _EVICTABLE)
                self.epoch += 1
                self._changed(slot)

    def evict(self, slot: int, unpin: bool = False) -> None:
        """Evict a resident, unlocked, unpinned ``slot``; neighbourhoods are updated.
        ``unpin``: a pinned ``slot`` is unpinned first (it must still be unlocked)."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot] == RESIDENT):
            self._resident(slot, "evict")
        if self.locks[slot] or (self.pinned[slot] and not unpin):
            raise ValueError(
                f"evict: slot {slot} is locked ({self.locks[slot]} locks) or pinned "
                f"({bool(self.pinned[slot])}); only candidates of choose/select can be evicted"
            )
        self.pinned[slot] = 0
        self.table.set_state(slot, _EVICTED)
        self.nbhd.on_evict(slot)
        self.evictions += 1

    def remat(self, slot: int, now: int | None) -> None:
        """An evicted ``slot`` was recomputed: resident again, last_access = now. ``None``
        keeps the last access it had (a recomputation the program did not ask for; NOTE
        [ A recomputation is not a use ] in core/remat.py)."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot] == EVICTED):
            self._live(slot, "remat")
            raise ValueError(f"remat: slot {slot} is resident, not evicted; nothing to redo")
        if now is not None:
            self.table.touch(slot, now)
        self.table.set_state(slot, _EVICTABLE)  # evicted slots hold no locks or pins
        self.nbhd.on_remat(slot)
        self.remats += 1
        self.epoch += 1
        self._changed(slot)

    def release(self, slot: int) -> None:
        """Forget ``slot`` for good (its locks and pins too): the slot is freed, edges dropped."""
        st = self.residency
        if not (0 <= slot < len(st) and st[slot]):  # the checks inline: a hot path
            self._live(slot, "release")
        if st[slot] == EVICTED:
            self.epoch += 1  # others lose an evicted neighbour: their scores may drop
        self.nbhd.on_release(slot)
        self.table.free(slot)
        self.locks[slot] = 0
        self.pinned[slot] = 0

    # ------------------------------------------------------------------ queries
    @property
    def bounded(self) -> bool:
        """Whether :meth:`choose` serves every choice by NOTE [ Bounded choice ]."""
        return isinstance(self.choice, BoundedStrategy)

    def is_resident(self, slot: int) -> bool:
        return 0 <= slot < len(self.residency) and self.residency[slot] == RESIDENT

    def is_evicted(self, slot: int) -> bool:
        return 0 <= slot < len(self.residency) and self.residency[slot] == EVICTED

    def is_candidate(self, slot: int) -> bool:
        """Resident, unlocked and unpinned: :meth:`evict` would accept it."""
        st = self.residency
        return (
            0 <= slot < len(st)
            and st[slot] == RESIDENT
            and not self.locks[slot]
            and not self.pinned[slot]
        )

    def lock_count(self, slot: int) -> int:
        if not 0 <= slot < len(self.locks):  # -1 would read the last slot's count
            raise ValueError(f"lock_count: slot {slot!r} is not a slot of this engine")
        return self.locks[slot]

    def flush(self) -> None:
        """Bring the ``nbhd_cost`` column and the device columns up to date."""
        self.nbhd.flush()
        self.table.flush()

    def select(self, now: int, k: int = 1) -> list[int]:
        """The ``min(k, #candidates)`` best victims from one scoring, best first."""
        self.nbhd.flush()
        self.selections += 1
        ids = self.table.select(self.heuristic, now, k, backend=self.backend, seed=self.seed)
        return ids.tolist()

    def choose(self, now: int) -> int | None:
        """The next victim, exactly as a fresh ``select(now, 1)`` would give it (except under
        ``reuse > 0``); ``None`` if nothing is evictable. Usually served from the last
        scoring, by the strategy of :mod:`tritondtr.engine.choice` the engine was made with."""
        v = self.choice.cached(self, now)
        if v is not MISS:
            self.cache_hits += 1
            return v
        self.selections += 1
        return self.choice.fresh(self, now)

    # ---------------------------------------------------------------- internals
    def _live(self, slot: int, what: str) -> None:
        if not (0 <= slot < len(self.residency) and self.residency[slot] != FREE):
            raise ValueError(f"{what}: slot {slot!r} is not tracked (released or never created)")

    def _resident(self, slot: int, what: str) -> None:
        self._live(slot, what)
        if self.residency[slot] != RESIDENT:
            raise ValueError(
                f"{what}: slot {slot} is {_STATE_NAMES[self.residency[slot]]}, "
                "it must be resident; rematerialize it first"
            )

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first violated invariant of the table, the
        neighbourhood (see :meth:`Neighborhood.check_invariants`) or the state mapping."""
        self.table.check_invariants()
        self.nbhd.check_invariants()
        n = self.table.capacity
        st = np.frombuffer(bytes(self.residency[:n]), np.uint8)
        locked = (np.asarray(self.locks[:n]) > 0) | (
            np.frombuffer(bytes(self.pinned[:n]), np.uint8) > 0
        )
        want = np.zeros(n, np.int8)
        want[st == RESIDENT] = _EVICTABLE
        want[(st == RESIDENT) & locked] = _LOCKED
        want[st == EVICTED] = _EVICTED
        bad = np.flatnonzero(want != self.table.host_state)
        assert bad.size == 0, f"slot {bad[:5].tolist()}: table state disagrees with the engine"
        assert not (locked & (st != RESIDENT)).any(), "a non-resident slot is locked or pinned"
