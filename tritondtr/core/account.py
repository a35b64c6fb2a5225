"""The byte account of a DTR core: what counts against the budget (NOTE [ Budget accounting ]
in core.py), its peaks, and whether the budget is exceeded."""

from __future__ import annotations

from .stats import CoreStats

__all__ = ["ByteAccount"]


class ByteAccount:
    """The bytes a :class:`~tritondtr.core.Core` counts: ``resident`` (tracked storages
    resident plus ``outside`` bytes, NOTE [ Anchored storages ] rule 5 in anchors.py) against
    ``budget`` (None: never exceeded), and ``op_bytes``, what the op in flight added. The one
    writer of these fields and of the counters ``peak_bytes``, ``resident_bytes`` and
    ``max_op_out_bytes`` of ``stats``."""

    __slots__ = ("budget", "op_bytes", "outside", "resident", "stats")

    def __init__(self, budget: int | None, stats: CoreStats) -> None:
        self.budget = budget
        self.resident = 0
        self.op_bytes = 0
        self.outside = 0
        self.stats = stats

    def set_budget(self, budget: int | None) -> None:
        """A budget known only once the session has a device (``budget="auto"``)."""
        self.budget = budget

    def over(self) -> bool:
        """Whether the resident bytes exceed the budget."""
        budget = self.budget
        return budget is not None and self.resident > budget

    def new_op(self) -> None:
        """An op or a recomputation starts: its outputs are counted from zero."""
        self.op_bytes = 0

    def grow(self, nbytes: int) -> None:
        """Count ``nbytes`` more resident (a new or recomputed buffer); peaks follow."""
        r = self.resident = self.resident + nbytes
        st = self.stats
        b = self.op_bytes = self.op_bytes + nbytes
        if b > st.max_op_out_bytes:
            st.max_op_out_bytes = b
        st.resident_bytes = r
        if r > st.peak_bytes:
            st.peak_bytes = r

    def arrive(self, nbytes: int) -> None:
        """Count ``nbytes`` more resident between ops (a prefetch: NOTE [ Asynchronous
        offload ] rule 5 in offload.py), no op's output; peaks follow."""
        r = self.resident = self.resident + nbytes
        st = self.stats
        st.resident_bytes = r
        if r > st.peak_bytes:
            st.peak_bytes = r

    def shrink(self, nbytes: int) -> None:
        """Count ``nbytes`` fewer resident (a buffer dropped, handed out or made external)."""
        r = self.resident = self.resident - nbytes
        self.stats.resident_bytes = r

    def grow_outside(self, nbytes: int) -> None:
        """The rank holds ``nbytes`` more outside the tracked storages, counted like a new
        op's output (NOTE [ Anchored storages ] rule 5)."""
        self.outside += nbytes
        self.op_bytes = 0
        self.grow(nbytes)

    def shrink_outside(self, nbytes: int) -> None:
        self.outside -= nbytes
        self.shrink(nbytes)
