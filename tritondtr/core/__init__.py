"""The DTR core: one implementation of DTR's decisions, shared by the runtime and the simulator.

:class:`Core` is driven by events (new storage, use, release, forget, op begin/end, freeze)
and holds ids, sizes, costs and flags, never a tensor; its :class:`Executor` (the runtime's
real ops, or the simulator's counting) does what it decides. Design: docs/design.md.
"""

from .core import Core, Executor
from .errors import BudgetError, ThrashError
from .remat import Frame
from .stats import CoreStats

__all__ = ["Core", "Executor", "CoreStats", "Frame", "BudgetError", "ThrashError"]
