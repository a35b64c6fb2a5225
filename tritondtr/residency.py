"""Residency codes: the one home of "where is this storage". One byte per storage in the
neighbourhood's ``state`` (per engine slot) and in the DTR core's ``state`` (per core id).

They are not the table's :class:`~tritondtr.table.SlotState`, which also says whether a
resident slot is a candidate (locks and pins): a neighbourhood needs only whether a storage is
tracked, resident or evicted. ``EXTERNAL`` is the core's alone: a storage that left the engine
for good but keeps its buffer (NOTE [ Parameter writes ]); no engine slot ever holds it.
"""

from __future__ import annotations

__all__ = ["EVICTED", "EXTERNAL", "FREE", "RESIDENT", "STATE_NAMES"]

FREE, RESIDENT, EVICTED, EXTERNAL = 0, 1, 2, 3
STATE_NAMES = ("free", "resident", "evicted", "external")
