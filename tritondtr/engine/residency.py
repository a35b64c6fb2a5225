"""Residency codes: the one home of "where is this storage", one byte per storage.

Codes 0 to 2 mean the same wherever they appear: the neighbourhood's ``state`` (per engine
slot), the DTR core's ``state`` (per core id) and the metadata table's ``state`` column
(:class:`~tritondtr.engine.table.SlotState`, whose values are these). Each adds what only it needs:
the table splits resident slots into candidates (``RESIDENT``, i.e. RESIDENT_EVICTABLE) and
``RESIDENT_LOCKED`` (locked or pinned: never a candidate); the core has ``EXTERNAL``, a storage
that left the engine for good but keeps its buffer (NOTE [ Parameter writes ]), which no
engine slot ever holds.
"""

from __future__ import annotations

__all__ = ["EVICTED", "EXTERNAL", "FREE", "RESIDENT", "RESIDENT_LOCKED", "STATE_NAMES"]

FREE, RESIDENT, EVICTED = 0, 1, 2
RESIDENT_LOCKED = 3  # the table's only
EXTERNAL = 4  # the core's only
STATE_NAMES = ("free", "resident", "evicted", "resident (locked)", "external")
