"""The runtime: ``with tritondtr.enable(budget=...)`` around unmodified eager PyTorch code.

Layers, top down: :mod:`.api` (``enable``) -> :mod:`.session` (the dispatch mode and the
wrapper tensors of :mod:`.tensor`; outputs in :mod:`.outputs`, plain values in
:mod:`.boundary`) -> :class:`tritondtr.core.Core` (every DTR decision: residency, budget,
eviction, rematerialization plan) -> :class:`tritondtr.engine.Engine` (metadata table and
victim choice). The session is the core's executor: it runs the recomputations the core asks
for. Op semantics live in :mod:`.semantics`, recipes and storages in :mod:`.recipe`.
"""

from .api import enable
from .config import RuntimeConfig
from .cost import H100_SXM, AnalyticCost, CostModel, GPUCost
from .errors import BudgetError, CostError, StaleInputError, ThrashError, UnsupportedOpError
from .picture import plot_memory
from .session import Session
from .stats import SessionStats
from .tensor import DTRTensor, is_tracked, unwrap
from .timeline import MemoryTimeline, Phase

__all__ = [
    "enable",
    "RuntimeConfig",
    "CostModel",
    "AnalyticCost",
    "GPUCost",
    "H100_SXM",
    "Session",
    "SessionStats",
    "MemoryTimeline",
    "Phase",
    "plot_memory",
    "DTRTensor",
    "is_tracked",
    "unwrap",
    "BudgetError",
    "CostError",
    "StaleInputError",
    "ThrashError",
    "UnsupportedOpError",
]
