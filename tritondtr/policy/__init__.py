"""The eviction policy: heuristics, their scoring rules and the backend that runs them.

Imports only ``tritondtr.kernels`` (and torch): ``heuristics`` (the built-in names and the
registry of user heuristics), ``scoring`` (the torch twins of the kernels: the CPU path and the
kernels' test oracle) and ``backend`` (which of the two runs, and the one call each makes).
"""

from .backend import (
    Backend,
    check_now,
    resolve_backend,
    score,
    select,
    selection,
    triton_available,
)
from .heuristics import (
    CustomHeuristic,
    Heuristic,
    NbhdMode,
    ScoreFn,
    get_heuristic,
    heuristic_names,
    register_heuristic,
    unregister_heuristic,
)

__all__ = [
    # backend dispatch
    "Backend",
    "check_now",
    "resolve_backend",
    "score",
    "select",
    "selection",
    "triton_available",
    # heuristics
    "CustomHeuristic",
    "Heuristic",
    "NbhdMode",
    "ScoreFn",
    "get_heuristic",
    "heuristic_names",
    "register_heuristic",
    "unregister_heuristic",
]
