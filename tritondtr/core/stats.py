"""Counters of a DTR run, kept by the core (:class:`~tritondtr.core.Core`) as it decides."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CoreStats"]


@dataclass
class CoreStats:
    """What the core did. Bytes are of the tracked storages (NOTE [ Budget accounting ]).

    Attributes:
        evictions: storages evicted to meet the budget (not counting buffers freed because
            their last tensor died, see ``freed``).
        rematerializations: storages recomputed.
        select_s: seconds spent choosing victims: wall clock, or the time of the clock the
            runtime gives the core (``Core.clock``: device time on CUDA, NOTE [ Device time ]
            in runtime/events.py).
        peak_bytes: the most bytes resident at once.
        resident_bytes: bytes resident now.
        freed: buffers freed because their last tensor died.
        backward_unpins: times the storages of the backward pass had to be made evictable.
        budget_errors: :class:`~tritondtr.core.BudgetError` raised (ThrashError included).
        relaxations: times a recomputation did not fit beside the inputs held for the
            recomputations waiting on it, and those were made evictable again (NOTE [
            Iterative rematerialization ] rule 5 in core/remat.py).
        max_op_out_bytes: the most bytes one op (or one recomputation) added at once; the
            peak never exceeds ``budget + max_op_out_bytes`` (NOTE [ Budget accounting ]).
        device_syncs: times a decision waited for the device (a selection on a device table
            reading its victims back: NOTE [ Decisions on the host ]); 0 on a host table.
        backend: where decisions were made, ``"<backend> on <table device>"`` (``"torch on
            cpu"``: the host path), once the engine exists; ``""`` before.
        offloads: storages copied to the host, as victims or ahead of the budget (NOTE [
            Offload ] in core/core.py, NOTE [ Asynchronous offload ] in core/offload.py; 0
            without a link); ``offloaded_bytes`` their bytes.
        fetches: offloaded storages copied back when read; ``prefetches``: copied back
            before (NOTE [ Asynchronous offload ] rule 5 in core/offload.py);
            ``fetched_bytes`` the bytes of both.
        link_wait_ns: device time the ops waited for copies (out, to free room; back, to
            read), ns of the core's device time (NOTE [ Offload link ] rule 2).
        link_busy_ns: device time the link spent copying, both directions, ns.
        copy_scale: what a copy's price is multiplied by for the next decisions (NOTE [ Copy
            price scale ] in core/tuning.py; 1 until it is chosen).
        refused_copies: copies to the host the executor refused (no host memory: the victim
            was dropped) and prefetches the allocator refused (given up) (NOTE [
            Asynchronous offload ] rule 7 in core/offload.py).
    """

    evictions: int = 0
    rematerializations: int = 0
    select_s: float = 0.0
    peak_bytes: int = 0
    resident_bytes: int = 0
    freed: int = 0
    backward_unpins: int = 0
    budget_errors: int = 0
    relaxations: int = 0
    max_op_out_bytes: int = 0
    device_syncs: int = 0
    backend: str = ""
    offloads: int = 0
    offloaded_bytes: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    prefetches: int = 0
    link_wait_ns: float = 0.0
    link_busy_ns: float = 0.0
    copy_scale: float = 1.0
    refused_copies: int = 0
