"""The engine: per-storage metadata, evicted neighbourhoods and the victim choice.

Below the DTR core, above the policy: ``table`` (the struct-of-arrays metadata table),
``residency`` (the codes of where a storage is), ``neighborhood`` with ``regions`` and
``eqclass`` (the evicted-neighbourhood costs), ``bounded`` (the bounded choice) and ``engine``
(the :class:`Engine` facade that the core drives).
"""

from .engine import Engine
from .table import MetadataTable, SlotState

__all__ = ["Engine", "MetadataTable", "SlotState"]
