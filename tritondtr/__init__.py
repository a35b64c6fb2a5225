"""tritondtr: Dynamic Tensor Rematerialization for PyTorch (Kirisame et al., ICLR 2021).

Device memory is treated as a cache: when a byte budget would be exceeded a tensor chosen by
a heuristic is evicted, and recomputed from its parent op when it is needed again.
"""

__version__ = "0.1.0"

import torch as _torch

if tuple(int(v) for v in _torch.__version__.split(".")[:2]) < (2, 11):
    raise ImportError(
        f"tritondtr needs torch >= 2.11, found {_torch.__version__}: upgrade torch "
        "(README.md, Which torch: tested on 2.11 and 2.13; older versions fail its tests)"
    )

from .engine import Engine, MetadataTable, SlotState
from .policy import (
    Backend,
    CustomHeuristic,
    Heuristic,
    NbhdMode,
    get_heuristic,
    heuristic_names,
    register_heuristic,
)
from .runtime import BudgetError, MemoryTimeline, Session, SessionStats, enable, plot_memory
from .runtime.recording import Recording, trace
from .units import format_bytes, parse_bytes

__all__ = [
    "__version__",
    # the engine (metadata table) and the eviction policy
    "MetadataTable",
    "SlotState",
    "Backend",
    "Engine",
    # heuristics
    "Heuristic",
    "NbhdMode",
    "CustomHeuristic",
    "register_heuristic",
    "get_heuristic",
    "heuristic_names",
    # runtime
    "enable",
    "Session",
    "SessionStats",
    "BudgetError",
    "MemoryTimeline",
    "plot_memory",
    "trace",
    "Recording",
    # units
    "parse_bytes",
    "format_bytes",
]
