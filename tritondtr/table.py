"""The metadata table: per-storage DTR metadata as a struct of arrays on one device."""

from __future__ import annotations

import enum

import numpy as np
import torch

from . import policy
from .heuristics import CustomHeuristic, Heuristic

__all__ = ["MetadataTable", "SlotState"]


class SlotState(enum.IntEnum):
    """The ``state`` column. Only ``RESIDENT_EVICTABLE`` slots are eviction candidates."""

    FREE = 0
    RESIDENT_EVICTABLE = 1
    RESIDENT_LOCKED = 2  # resident and pinned or locked: never a candidate
    EVICTED = 3


# NOTE [ Host staging ]
# 1. The host arrays (numpy) are the authority. Every per-op update (a new tensor, an access,
#    an eviction) writes them and, when the device is not the CPU, appends the slot id to a
#    dirty list: no kernel launch and no host-device synchronisation per op.
# 2. ``flush()`` applies all staged rows to the device columns in one host-to-device copy (the
#    dirty rows packed into one [n, 5] int64 buffer, unpacked by index_copy_ on the device),
#    or in one full copy per column when most of the table is dirty or it has grown.
# 3. Every selection flushes first, so a kernel always reads the current metadata.
# 4. On a CPU table the device columns *are* the host arrays (zero-copy torch views), so
#    there is nothing to stage and flush is free.
# 5. Device bytes per slot: cost 4 + size 8 + last_access 8 + nbhd_cost 4 + state 1 = 25.


class MetadataTable:
    """Per-storage DTR metadata, one slot per tracked storage, as a struct of arrays.

    Columns (all of length ``capacity``, on ``device``; host mirrors in ``host_*``):

    ============  ========  ======================================================
    column        dtype     meaning
    ============  ========  ======================================================
    cost          float32   compute cost c0 of the storage (unit of the caller, ns)
    size          int64     bytes of the storage
    last_access   int64     logical clock of the last access (creation or use)
    nbhd_cost     float32   evicted-neighbourhood cost, kept by :class:`Neighborhood`
    state         int8      a :class:`SlotState`
    ============  ========  ======================================================

    Invariants (checked by :meth:`check_invariants`):

    1. A slot is ``FREE`` if and only if it is on the free list, exactly once.
    2. ``len(table)`` equals the number of non-free slots.
    3. Non-free slots have ``size >= 0``, ``cost >= 0`` and ``nbhd_cost >= 0`` (NaN excluded).
    4. Free slots hold zeros in every column, so stale metadata never leaks into a new slot.
    5. After :meth:`flush`, the device columns equal the host arrays (NOTE [ Host staging ]).

    Slots come from a free list (a stack: the last freed slot is reused first); when it runs
    dry the capacity doubles (amortized O(1) per add).
    Device memory is 25 bytes per slot.
    """

    COLUMNS = ("cost", "size", "last_access", "nbhd_cost", "state")
    BYTES_PER_SLOT = 25

    def __init__(self, capacity: int = 1024, device: torch.device | str | None = None) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._zero_copy = self.device.type == "cpu"
        self.capacity = 0
        self._free: list[int] = []
        self._dirty: list[int] = []
        self._grown = False
        self._alloc_host(int(capacity))
        self._dev: dict[str, torch.Tensor] = {}
        self._sync_device_full()

    # ----------------------------------------------------------------- storage
    def _alloc_host(self, capacity: int) -> None:
        old = self.capacity
        new = {
            "cost": np.zeros(capacity, np.float32),
            "size": np.zeros(capacity, np.int64),
            "last_access": np.zeros(capacity, np.int64),
            "nbhd_cost": np.zeros(capacity, np.float32),
            "state": np.zeros(capacity, np.int8),
        }
        for name, arr in new.items():
            if old:
                arr[:old] = getattr(self, "host_" + name)
            setattr(self, "host_" + name, arr)
        # The free list is a stack: freed slots are reused first, then new ones lowest id first.
        self._free[:0] = range(capacity - 1, old - 1, -1)
        self.capacity = capacity
        self._grown = True

    def _ensure_free(self, n: int) -> None:
        if len(self._free) >= n:
            return
        need = self.capacity - len(self._free) + n
        cap = self.capacity
        while cap < need:
            cap *= 2
        self._alloc_host(cap)

    def _sync_device_full(self) -> None:
        for name in self.COLUMNS:
            host = torch.from_numpy(getattr(self, "host_" + name))
            self._dev[name] = host if self._zero_copy else host.to(self.device)
        self._dirty.clear()
        self._grown = False

    def __len__(self) -> int:
        return self.capacity - len(self._free)

    # ------------------------------------------------------------ per-op updates
    def add(
        self,
        cost: float,
        size: int,
        last_access: int,
        state: SlotState = SlotState.RESIDENT_EVICTABLE,
        nbhd_cost: float = 0.0,
    ) -> int:
        """Track a new storage; returns its slot id. Host-only (NOTE [ Host staging ])."""
        if not self._free:
            self._ensure_free(1)
        slot = self._free.pop()
        self.host_cost[slot] = cost
        self.host_size[slot] = size
        self.host_last_access[slot] = last_access
        self.host_nbhd_cost[slot] = nbhd_cost
        self.host_state[slot] = state
        if not self._zero_copy:
            self._dirty.append(slot)
        return slot

    def add_many(
        self,
        cost: np.ndarray | torch.Tensor,
        size: np.ndarray | torch.Tensor,
        last_access: np.ndarray | torch.Tensor | int,
        state: np.ndarray | torch.Tensor | int = SlotState.RESIDENT_EVICTABLE,
        nbhd_cost: np.ndarray | torch.Tensor | float = 0.0,
    ) -> np.ndarray:
        """Track many storages at once from host arrays [N]; returns their slots, [N] int64."""
        cost = _host(cost, np.float32)
        n = cost.shape[0]
        self._ensure_free(n)
        slots = np.array([self._free.pop() for _ in range(n)], dtype=np.int64)
        self._write(slots, cost=cost, size=size, last_access=last_access, state=state,
                    nbhd_cost=nbhd_cost)
        return slots

    def update_many(self, slots: np.ndarray | torch.Tensor, **columns) -> None:
        """Set columns of many slots from host arrays or scalars, e.g.
        ``update_many(slots, last_access=now, state=SlotState.EVICTED)``."""
        slots = _host(slots, np.int64)
        bad = [c for c in columns if c not in self.COLUMNS]
        if bad:
            raise ValueError(f"unknown column(s) {bad}; columns are {list(self.COLUMNS)}")
        self._check_live(slots)
        self._write(slots, **columns)

    def _write(self, slots: np.ndarray, **columns) -> None:
        for name, values in columns.items():
            arr = getattr(self, "host_" + name)
            arr[slots] = _host(values, arr.dtype) if not np.isscalar(values) else values
        if not self._zero_copy:
            self._dirty.extend(slots.tolist())

    def touch(self, slot: int, now: int) -> None:
        """Record an access of ``slot`` at logical time ``now``."""
        self.host_last_access[slot] = now
        if not self._zero_copy:
            self._dirty.append(slot)

    def set_state(self, slot: int, state: SlotState) -> None:
        self.host_state[slot] = state
        if not self._zero_copy:
            self._dirty.append(slot)

    def set_cost(self, slot: int, cost: float) -> None:
        self.host_cost[slot] = cost
        if not self._zero_copy:
            self._dirty.append(slot)

    def set_nbhd_cost(self, slot: int, nbhd_cost: float) -> None:
        self.host_nbhd_cost[slot] = nbhd_cost
        if not self._zero_copy:
            self._dirty.append(slot)

    def free(self, slot: int) -> None:
        """Stop tracking ``slot``; it returns to the free list with zeroed columns."""
        if self.host_state[slot] == SlotState.FREE:
            raise ValueError(f"slot {slot} is already free (double free is a bug of the caller)")
        for name in self.COLUMNS:
            getattr(self, "host_" + name)[slot] = 0
        self._free.append(slot)
        if not self._zero_copy:
            self._dirty.append(slot)

    def free_many(self, slots: np.ndarray | torch.Tensor) -> None:
        slots = _host(slots, np.int64)
        self._check_live(slots)
        if np.unique(slots).size != slots.size:
            raise ValueError("free_many got the same slot twice")
        for name in self.COLUMNS:
            getattr(self, "host_" + name)[slots] = 0
        self._free.extend(slots.tolist())
        if not self._zero_copy:
            self._dirty.extend(slots.tolist())

    def _check_live(self, slots: np.ndarray) -> None:
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(
                f"slot ids must lie in [0, {self.capacity}), got {slots.min()}..{slots.max()}"
            )
        if slots.size and (self.host_state[slots] == SlotState.FREE).any():
            raise ValueError("some of the given slots are free (not tracked)")

    # --------------------------------------------------------------- device side
    def flush(self) -> None:
        """Apply all staged host updates to the device columns (NOTE [ Host staging ])."""
        if self._zero_copy:
            if self._grown:
                self._sync_device_full()
            return
        if self._grown or len(self._dirty) > self.capacity // 4:
            self._sync_device_full()
            return
        if not self._dirty:
            return
        idx = np.unique(np.asarray(self._dirty, dtype=np.int64))
        self._dirty.clear()
        packed = np.empty((idx.size, 5), dtype=np.int64)
        packed[:, 0] = idx
        packed[:, 1] = self.host_size[idx]
        packed[:, 2] = self.host_last_access[idx]
        both = np.empty((idx.size, 2), dtype=np.float32)
        both[:, 0] = self.host_cost[idx]
        both[:, 1] = self.host_nbhd_cost[idx]
        packed[:, 3] = both.view(np.int64)[:, 0]  # cost and nbhd_cost share one int64 lane
        packed[:, 4] = self.host_state[idx]
        dev = torch.from_numpy(packed).pin_memory().to(self.device, non_blocking=True)
        didx = dev[:, 0]
        f = dev[:, 3].contiguous().view(torch.float32).view(-1, 2)
        self._dev["size"].index_copy_(0, didx, dev[:, 1])
        self._dev["last_access"].index_copy_(0, didx, dev[:, 2])
        self._dev["cost"].index_copy_(0, didx, f[:, 0].contiguous())
        self._dev["nbhd_cost"].index_copy_(0, didx, f[:, 1].contiguous())
        self._dev["state"].index_copy_(0, didx, dev[:, 4].to(torch.int8))

    def columns(self) -> dict[str, torch.Tensor]:
        """The device columns after a flush: name -> [capacity] tensor on ``device``."""
        self.flush()
        return dict(self._dev)

    def score(
        self,
        heuristic: Heuristic | CustomHeuristic | str,
        now: int,
        *,
        backend: str = "auto",
        seed: int = 0,
    ) -> torch.Tensor:
        """Scores of every slot, [capacity] on ``device`` (lowest is evicted first); the dtype
        is ``heuristic.score_dtype``. Non-candidates score +inf (or int64 max)."""
        self.flush()
        return policy.score(heuristic, self._dev, now, backend=backend, seed=seed)

    def select(
        self,
        heuristic: Heuristic | CustomHeuristic | str,
        now: int,
        k: int = 1,
        *,
        backend: str = "auto",
        seed: int = 0,
    ) -> torch.Tensor:
        """The ``min(k, #candidates)`` victim slots, [k'] int64 on the host, best first.

        One device-to-host read. Ties go to the lowest slot id; see NOTE [ Scoring rules ].
        """
        self.flush()
        return policy.select(heuristic, self._dev, now, k=k, backend=backend, seed=seed)

    # ---------------------------------------------------------------- debugging
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first violated invariant (see class docstring)."""
        free = np.asarray(self._free, dtype=np.int64)
        assert np.unique(free).size == free.size, "invariant 1: a slot is on the free list twice"
        is_free = self.host_state == SlotState.FREE
        on_list = np.zeros(self.capacity, dtype=bool)
        on_list[free] = True
        assert (is_free == on_list).all(), "invariant 1: FREE state and free list disagree"
        assert len(self) == int((~is_free).sum()), "invariant 2: len() is wrong"
        states = set(np.unique(self.host_state).tolist())
        assert states <= {int(s) for s in SlotState}, f"unknown state values {states}"
        used = ~is_free
        assert (self.host_size[used] >= 0).all(), "invariant 3: negative size"
        assert (self.host_cost[used] >= 0).all(), "invariant 3: negative or NaN cost"
        assert (self.host_nbhd_cost[used] >= 0).all(), "invariant 3: negative or NaN nbhd_cost"
        for name in self.COLUMNS:
            assert not getattr(self, "host_" + name)[is_free].any(), f"invariant 4: free {name}"
        if not self._dirty and not self._grown:
            for name in self.COLUMNS:
                host = torch.from_numpy(getattr(self, "host_" + name))
                assert torch.equal(self._dev[name].cpu(), host), f"invariant 5: device {name}"


def _host(values, dtype) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)
