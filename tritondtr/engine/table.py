"""The metadata table: per-storage DTR metadata as a struct of arrays on one device."""

from __future__ import annotations

import contextlib
import enum

import numpy as np
import torch

from .. import policy
from ..policy.heuristics import CustomHeuristic, Heuristic
from ..policy.scoring import random_base
from . import residency

__all__ = ["MetadataTable", "SlotState"]


class SlotState(enum.IntEnum):
    """The ``state`` column. Only ``RESIDENT_EVICTABLE`` slots are eviction candidates. The
    values are the residency codes of :mod:`tritondtr.engine.residency` (one home)."""

    FREE = residency.FREE
    RESIDENT_EVICTABLE = residency.RESIDENT
    EVICTED = residency.EVICTED
    RESIDENT_LOCKED = residency.RESIDENT_LOCKED  # resident and pinned or locked


_FREE = int(SlotState.FREE)
_EVICTABLE = int(SlotState.RESIDENT_EVICTABLE)
_NAN = np.float32(np.nan)

# NOTE [ Host staging ]
# 1. The host arrays (numpy) are the authority. Every per-op update (a new tensor, an access,
#    an eviction) writes them and, when the device is not the CPU, appends the slot id to a
#    dirty list: no kernel launch and no host-device synchronisation per op.
# 2. ``flush()`` applies all staged rows to the device columns in one host-to-device copy (the
#    dirty rows packed into one [n, 6] int64 buffer, unpacked by index_copy_ on the device),
#    or in one full copy per column when most of the table is dirty or it has grown.
# 3. Every selection flushes first, so a kernel always reads the current metadata.
# 4. On a CPU table the device columns *are* the host arrays (zero-copy torch views), so
#    there is nothing to stage and flush is free.
# 5. Device bytes per slot: cost 4 + size 8 + last_access 8 + nbhd_cost 4 + state 1, plus the
#    derived evictable_size 4 (NOTE [ Evictable size ]) = 29.

# NOTE [ Private stream ]
# 1. A CUDA table does all its device work (full copies, flushes, scorings, selections) on a
#    stream of its own, made with the table at high priority (its small kernels start ahead
#    of queued ones), under the device guard of its device. Nothing of it waits for the
#    kernels the program queued on its streams (but see rule 5).
# 2. Its columns are allocated while that stream is current, so the caching allocator hands
#    their blocks out again only after the stream's work that used them.
# 3. A selection copies its victims into a pinned host buffer the table keeps (grown by
#    doubling) and then waits for the private stream alone: one device synchronization per
#    selection, counted in ``device_syncs`` (NOTE [ Decisions on the host ] rule 2 in
#    core/core.py).
# 4. A flush packs the dirty rows into a pinned staging buffer the table keeps (no pinned
#    allocation per flush); the host writes it again only after the copy from it has
#    completed (an event recorded after the copy).
# 5. What the table hands the caller on the device (``columns``, ``score``) is made safe on
#    the caller's current stream: that stream waits for the private one (on the device, the
#    host does not block), and a tensor made on the private stream is recorded as used by the
#    caller's stream, so its memory is not reused under it. After ``columns`` handed the
#    columns out, the next device work of the table first waits for the caller's stream
#    (its reads must end before a flush rewrites them); the runtime's decisions never take
#    the columns, so they never wait for the program's kernels.

# NOTE [ Evictable size ]
# 1. ``evictable_size`` is derived, never written by a caller: float32(size) where state is
#    RESIDENT_EVICTABLE, NaN everywhere else (free slots included), the int64 -> float32
#    rounding of the scoring rules (NOTE [ Scoring rules ] 3).
# 2. size and state change only through this table's methods, so the column is rewritten there,
#    for the slots written, on the host; it is staged and flushed like the others.
# 3. Why: it holds both the candidate test and the float32 size that every ratio score needs,
#    so a decision reads 4 bytes per slot instead of size's 8 and state's 1 and does not convert
#    int64 -> float32, which is not vectorised on CPU (measured: docs/benchmarks.md,
#    Measurements behind the NOTEs, Evictable size and Clock bounds). The cost moves
#    to the writes of size and state: one more float per slot written.
# 4. The Triton kernels read size and state as before (the twin is the specification; both
#    give the same victims).

# NOTE [ Clock bounds ]
# 1. The table keeps host ints lo <= hi with every last_access in [lo, hi]: each write of
#    last_access widens them; nothing narrows them (a freed slot's 0 lies inside: they start
#    at (0, 0)). With a monotonic clock they are (0, the last now written).
# 2. select and score pass them to the torch twin, which takes the int32 clock path (NOTE
#    [ Lean twin ] 3) when they lie in [0, 2**31): two int compares per touch, instead of two
#    reductions of last_access per decision, which cost most of what the int32 path saves
#    (measured: docs/benchmarks.md, Measurements behind the NOTEs, Evictable size and
#    Clock bounds).


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

    and one derived column, kept by the table (NOTE [ Evictable size ]), read by the torch twin:

    ==============  ========  ====================================================
    evictable_size  float32   float32(size) if state is RESIDENT_EVICTABLE, else NaN
    ==============  ========  ====================================================

    Invariants (checked by :meth:`check_invariants`):

    1. A slot is ``FREE`` if and only if it is on the free list, exactly once.
    2. ``len(table)`` equals the number of non-free slots.
    3. Non-free slots have ``size >= 0``, ``cost >= 0`` and ``nbhd_cost >= 0`` (NaN excluded).
    4. Free slots hold zeros in every column, so stale metadata never leaks into a new slot.
    5. After :meth:`flush`, the device columns equal the host arrays (NOTE [ Host staging ]).
    6. ``evictable_size`` is float32(size) where state is ``RESIDENT_EVICTABLE`` and NaN
       elsewhere, bit for bit (invariant 4 does not apply to it: a free slot holds NaN).
    7. Every last_access lies in :attr:`clock_bounds` (NOTE [ Clock bounds ]).

    Slots come from a free list (a stack: the last freed slot is reused first); when it runs
    dry the capacity doubles (amortized O(1) per add).
    Device memory is 29 bytes per slot (25 written, 4 derived).
    """

    COLUMNS = ("cost", "size", "last_access", "nbhd_cost", "state")
    DERIVED = ("evictable_size",)
    BYTES_PER_SLOT = 29

    def __init__(self, capacity: int = 1024, device: torch.device | str | None = None) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._zero_copy = self.device.type == "cpu"
        # rules of NOTE [ Private stream ]
        self._stream = (
            torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        )
        self._lent = False  # rule 5: columns handed out since the last device work
        self._staging: torch.Tensor | None = None  # pinned [n, 6] int64 (rule 4)
        self._staged: torch.cuda.Event | None = None  # the last copy from it
        self._victims: torch.Tensor | None = None  # pinned int64 (rule 3)
        self._selections: dict = {}  # (heuristic, k, backend) -> prepared selection or None
        self.device_syncs = 0
        self.capacity = 0
        self._free: list[int] = []
        self._dirty: list[int] = []
        self._grown = False
        self._clock_lo = self._clock_hi = 0  # NOTE [ Clock bounds ]
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
            "evictable_size": np.full(capacity, np.nan, np.float32),
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

    def _on_stream(self):
        """The context of the table's device work (NOTE [ Private stream ] rule 1)."""
        return _PrivateStream(self)

    def _sync_device_full(self) -> None:
        if self._stream is not None:
            with self._on_stream():
                self._sync_device_full_here()
            return
        self._sync_device_full_here()

    def _sync_device_full_here(self) -> None:
        grown = self._grown or not self._dev
        for name in self.COLUMNS + self.DERIVED:
            host = torch.from_numpy(getattr(self, "host_" + name))
            if self._zero_copy:
                self._dev[name] = host
            elif grown:
                self._dev[name] = host.to(self.device)
            else:  # the same storage: prepared selections keep their addresses
                self._dev[name].copy_(host)
        if grown:
            self._selections.clear()  # they hold the old columns
        self._dirty.clear()
        self._grown = False

    def __len__(self) -> int:
        return self.capacity - len(self._free)

    @property
    def clock_bounds(self) -> tuple[int, int]:
        """(lo, hi): every last_access lies in [lo, hi] (NOTE [ Clock bounds ])."""
        return self._clock_lo, self._clock_hi

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
        if last_access > self._clock_hi:
            self._clock_hi = int(last_access)
        elif last_access < self._clock_lo:
            self._clock_lo = int(last_access)
        self.host_nbhd_cost[slot] = nbhd_cost
        self.host_state[slot] = state
        # NOTE [ Evictable size ], written out: a hot path
        if state == _EVICTABLE:  # int64 -> float32, as torch and the kernels round it
            self.host_evictable_size[slot] = self.host_size[slot]
        else:
            self.host_evictable_size[slot] = _NAN
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
        self._write(
            slots, cost=cost, size=size, last_access=last_access, state=state, nbhd_cost=nbhd_cost
        )
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
        if "size" in columns or "state" in columns:
            self._derive_many(slots)
        if "last_access" in columns and slots.size:
            written = self.host_last_access[slots]
            self._clock_lo = min(self._clock_lo, int(written.min()))
            self._clock_hi = max(self._clock_hi, int(written.max()))
        if not self._zero_copy:
            self._dirty.extend(slots.tolist())

    def touch(self, slot: int, now: int) -> None:
        """Record an access of ``slot`` at logical time ``now``."""
        self.host_last_access[slot] = now
        if now > self._clock_hi:
            self._clock_hi = int(now)
        elif now < self._clock_lo:
            self._clock_lo = int(now)
        if not self._zero_copy:
            self._dirty.append(slot)

    def set_state(self, slot: int, state: SlotState) -> None:
        self.host_state[slot] = state
        # NOTE [ Evictable size ], written out: a hot path
        if state == _EVICTABLE:
            self.host_evictable_size[slot] = self.host_size[slot]
        else:
            self.host_evictable_size[slot] = _NAN
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

    def set_nbhd_costs(self, slots: list[int], nbhd_costs: list[float]) -> None:
        """``set_nbhd_cost`` for many live slots, from host lists (the neighbourhood's flush;
        not checked, unlike :meth:`update_many`, whose checks cost ~10 us a call)."""
        self.host_nbhd_cost.put(slots, nbhd_costs)
        if not self._zero_copy:
            self._dirty.extend(slots)

    def free(self, slot: int) -> None:
        """Stop tracking ``slot``; it returns to the free list with zeroed columns."""
        if self.host_state[slot] == _FREE:  # a plain int: == an IntEnum takes ~3 us
            raise ValueError(f"slot {slot} is already free (double free is a bug of the caller)")
        self.host_cost[slot] = 0  # every column of COLUMNS, written out: no getattr per call
        self.host_size[slot] = 0
        self.host_last_access[slot] = 0
        self.host_nbhd_cost[slot] = 0
        self.host_state[slot] = 0
        self.host_evictable_size[slot] = _NAN
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
        self.host_evictable_size[slots] = _NAN
        self._free.extend(slots.tolist())
        if not self._zero_copy:
            self._dirty.extend(slots.tolist())

    def _derive_many(self, slots: np.ndarray) -> None:
        size = self.host_size[slots].astype(np.float32)
        cand = self.host_state[slots] == _EVICTABLE
        self.host_evictable_size[slots] = np.where(cand, size, _NAN)

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
        with self._on_stream():
            self._flush_rows(idx)

    def _flush_rows(self, idx: np.ndarray) -> None:
        """NOTE [ Host staging ] rule 2, on the private stream (NOTE [ Private stream ] 4)."""
        if self._staged is not None:
            self._staged.synchronize()  # the last copy from the staging buffer is done
        if self._staging is None or self._staging.shape[0] < idx.size:
            rows = max(idx.size, 2 * (0 if self._staging is None else self._staging.shape[0]))
            self._staging = torch.empty((rows, 6), dtype=torch.int64, pin_memory=True)
        staging = self._staging[: idx.size]
        packed = staging.numpy()
        packed[:, 0] = idx
        packed[:, 1] = self.host_size[idx]
        packed[:, 2] = self.host_last_access[idx]
        floats = np.zeros((idx.size, 4), dtype=np.float32)  # two float32 per int64 lane
        floats[:, 0] = self.host_cost[idx]
        floats[:, 1] = self.host_nbhd_cost[idx]
        floats[:, 2] = self.host_evictable_size[idx]
        packed[:, 3:5] = floats.view(np.int64)
        packed[:, 5] = self.host_state[idx]
        dev = staging.to(self.device, non_blocking=True)
        self._staged = torch.cuda.Event()
        self._staged.record()
        didx = dev[:, 0]
        f = dev[:, 3:5].contiguous().view(torch.float32)  # [n, 4]
        self._dev["size"].index_copy_(0, didx, dev[:, 1])
        self._dev["last_access"].index_copy_(0, didx, dev[:, 2])
        self._dev["cost"].index_copy_(0, didx, f[:, 0].contiguous())
        self._dev["nbhd_cost"].index_copy_(0, didx, f[:, 1].contiguous())
        self._dev["evictable_size"].index_copy_(0, didx, f[:, 2].contiguous())
        self._dev["state"].index_copy_(0, didx, dev[:, 5].to(torch.int8))

    def columns(self) -> dict[str, torch.Tensor]:
        """The device columns after a flush, the derived one included: name -> [capacity]
        tensor on ``device``, usable on the caller's current stream (NOTE [ Private stream ] 5)."""
        self.flush()
        if self._stream is not None:
            _handed_over(self._stream, self._dev.values())
            self._lent = True
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
        kw = dict(backend=backend, seed=seed, clock_bounds=(self._clock_lo, self._clock_hi))
        if self._stream is None:
            return policy.score(heuristic, self._dev, now, **kw)
        with self._on_stream():
            scores = policy.score(heuristic, self._dev, now, **kw)
        _handed_over(self._stream, [scores])
        return scores

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

        One device-to-host read, on a CUDA table a wait for the table's own stream only (NOTE
        [ Private stream ] rule 3). Ties go to the lowest slot id; see NOTE [ Scoring rules ].
        """
        self.flush()
        on_device = self._stream is not None  # rule 2: a selection's workspace is made there
        with self._on_stream() if on_device else contextlib.nullcontext():
            sel = self._selection(heuristic, k, backend)
            if sel is not None:  # prepared (NOTE [ One-launch selection ] rule 7)
                now = policy.check_now(now)
                ids = sel.victims(now, random_base(seed, now))
        if sel is not None:
            self.device_syncs += on_device
            return torch.tensor(ids, dtype=torch.int64)
        kw = dict(backend=backend, seed=seed, clock_bounds=(self._clock_lo, self._clock_hi))
        if self._stream is None:
            return policy.select(heuristic, self._dev, now, k=k, **kw)
        with self._on_stream():
            ids = policy.select(heuristic, self._dev, now, k=k, host=False, **kw)
            n = ids.numel()
            if self._victims is None or self._victims.numel() < n:
                self._victims = torch.empty(max(n, 64), dtype=torch.int64, pin_memory=True)
            out = self._victims[:n]
            out.copy_(ids, non_blocking=True)
            self._stream.synchronize()
        self.device_syncs += 1
        out = out.clone()
        return out[out >= 0]

    def _selection(self, heuristic, k: int, backend: str):
        """The prepared Triton selection of (heuristic, k, backend), or None for the twin."""
        key = (heuristic, k, backend)  # names, enums and user heuristics all hash
        sel = self._selections.get(key, self)
        if sel is self:
            sel = self._selections[key] = policy.selection(
                heuristic, self._dev, k=k, backend=backend
            )
        return sel

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
        la = self.host_last_access
        lo, hi = self.clock_bounds
        assert lo <= la.min() and la.max() <= hi, f"invariant 7: last_access outside {lo, hi}"
        cand = self.host_state == SlotState.RESIDENT_EVICTABLE
        want = np.where(cand, self.host_size.astype(np.float32), np.float32(np.nan))
        assert np.array_equal(want.view(np.int32), self.host_evictable_size.view(np.int32)), (
            "invariant 6: evictable_size is not float32(size) for candidates and NaN elsewhere"
        )
        if not self._dirty and not self._grown:
            if self._stream is not None:  # NOTE [ Private stream ]: its writes are done
                self._stream.synchronize()
            for name in self.COLUMNS + self.DERIVED:
                host, dev = torch.from_numpy(getattr(self, "host_" + name)), self._dev[name].cpu()
                if name in self.DERIVED:  # bit for bit: its NaNs are not equal to themselves
                    host, dev = host.view(torch.int32), dev.view(torch.int32)
                assert torch.equal(dev, host), f"invariant 5: device {name}"


def _host(values, dtype) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


class _PrivateStream:
    """``with``: the table's device guard and private stream current (NOTE [ Private stream ])."""

    __slots__ = ("_guard", "_stream")

    def __init__(self, table: MetadataTable) -> None:
        self._guard = torch.cuda.device(table.device)
        self._stream = torch.cuda.stream(table._stream)
        if table._lent:  # rule 5: the caller may still read the columns it was handed
            table._lent = False
            table._stream.wait_stream(torch.cuda.current_stream(table.device))

    def __enter__(self) -> None:
        self._guard.__enter__()
        self._stream.__enter__()

    def __exit__(self, *exc) -> None:
        try:
            self._stream.__exit__(*exc)
        finally:
            self._guard.__exit__(*exc)


def _handed_over(stream: torch.cuda.Stream, tensors) -> None:
    """NOTE [ Private stream ] rule 5: the caller's stream waits for ``stream`` and is recorded
    as a user of ``tensors``."""
    caller = torch.cuda.current_stream(stream.device)
    if caller == stream:
        return
    caller.wait_stream(stream)
    for t in tensors:
        t.record_stream(caller)
