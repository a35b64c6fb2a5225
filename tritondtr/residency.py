"""Residency codes of a slot in the neighbourhood's ``state`` bytearray (one byte per slot).

They are not the table's :class:`~tritondtr.table.SlotState`: locks and pins do not matter
to a neighbourhood, only whether a storage is tracked, resident or evicted.
"""

from __future__ import annotations

__all__ = ["EVICTED", "FREE", "RESIDENT", "STATE_NAMES"]

FREE, RESIDENT, EVICTED = 0, 1, 2
STATE_NAMES = ("free", "resident", "evicted")
