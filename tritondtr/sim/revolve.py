"""The optimum for chains: Griewank's binomial checkpointing (revolve).

Reversing a chain x_0 -> x_1 -> ... -> x_n (``n`` forward steps F_1..F_n, then their adjoints
in reverse order) with ``s`` checkpoint slots needs at least ``t(n, s)`` forward steps
(Griewank 1992; Griewank & Walther, "Algorithm 799: revolve", ACM TOMS 2000). This module
gives that number in closed form and by the dynamic program it solves, and maps it to the
uniform chain of :func:`tritondtr.sim.generators.chain` so that DTR's extra operations can be
read against the optimum (NOTE [ Revolve and the simulator's chain ]).

# NOTE [ Revolve conventions ]
# 1. ``s`` counts every slot that holds a state, x_0 included; the state being advanced and
#    the adjoint live outside them (revolve's own convention).
# 2. The adjoint of step i needs x_{i-1}; it re-runs F_i itself (the "taped" step), which is
#    not counted. Hence reversing one step costs 0 forward steps, and with s >= n slots the
#    cost is n - 1 (one sweep F_1..F_{n-1}).
# 3. beta(s, r) = C(s + r, s) is the longest chain reversible with s slots if no step is run
#    more than r times. For beta(s, r-1) < n <= beta(s, r): t(n, s) = r*n - beta(s+1, r-1).
# 4. The dynamic program: t(1, s) = 0; t(n, 1) = n(n-1)/2; and for s >= 2
#    t(n, s) = min over 1 <= m < n of  m + t(n - m, s - 1) + t(m, s)
#    (advance m steps, checkpoint x_m, reverse the tail with one slot fewer, then the head).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "CHAIN_WORK_SLOTS",
    "binomial_reach",
    "chain_optimum_extra",
    "revolve_extra",
    "revolve_forward_steps",
    "revolve_forward_steps_dp",
]


def _check(n: int, s: int) -> None:
    for name, v in (("n (chain length)", n), ("s (checkpoint slots)", s)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def binomial_reach(s: int, r: int) -> int:
    """beta(s, r) = C(s + r, s): the longest chain reversible with ``s`` slots and at most
    ``r`` runs of each step (NOTE [ Revolve conventions ] 3). beta(s, -1) = 0."""
    if r < 0:
        return 0
    return math.comb(s + r, s)


def revolve_forward_steps(n: int, s: int) -> int:
    """t(n, s): the least number of forward steps that reverses a chain of ``n`` steps with
    ``s`` checkpoint slots (closed form, NOTE [ Revolve conventions ] 3). Exact (Python int)."""
    _check(n, s)
    r, reach = 0, 1  # beta(s, 0) = 1
    while reach < n:
        r += 1
        reach = reach * (s + r) // r  # beta(s, r) from beta(s, r - 1)
    return r * n - binomial_reach(s + 1, r - 1)


def revolve_forward_steps_dp(n_max: int, s_max: int) -> np.ndarray:
    """The dynamic program of NOTE [ Revolve conventions ] 4 for every n <= ``n_max`` and
    s <= ``s_max``: an [n_max + 1, s_max + 1] int64 table, t[n, s] (row 0 and column 0 are
    unused and hold -1). O(n_max^2 s_max): the brute-force check of the closed form."""
    _check(n_max, s_max)
    t = np.full((n_max + 1, s_max + 1), -1, dtype=np.int64)
    ls = np.arange(1, n_max + 1, dtype=np.int64)
    t[1:, 1] = ls * (ls - 1) // 2
    t[1, 1:] = 0
    for s in range(2, s_max + 1):
        for n in range(2, n_max + 1):
            m = np.arange(1, n)
            t[n, s] = (m + t[n - m, s - 1] + t[m, s]).min()
    return t


def revolve_extra(n: int, s: int) -> int:
    """Forward steps beyond the single sweep: t(n, s) - (n - 1) (NOTE [ Revolve conventions ] 2)."""
    return revolve_forward_steps(n, s) - (n - 1)


# NOTE [ Revolve and the simulator's chain ]
# 1. The uniform chain of ``generators.chain(n)`` is a_0 (a constant) -> f_1 -> ... -> f_n,
#    then loss(a_n) -> g_n and b_i(g_i, a_{i-1}) -> g_{i-1} for i = n..1, every tensor of
#    size 1 and every op of cost 1. b_i needing a_{i-1} is revolve's adjoint of step i, and
#    loss + b_n are the adjoint of the last step, so the chain is revolve's with the same n.
# 2. Beyond revolve's s slots (x_0 = a_0 among them) the simulator needs CHAIN_WORK_SLOTS
#    = 3 units: revolve's current state and adjoint are g_i and the state being advanced,
#    and the simulator's ops are out of place, so an advance holds x_k and x_{k+1} at once
#    (and b_i holds g_i and g_{i-1}). A budget of B units thus allows s = B - 3 slots.
# 3. Rule 2 is not an assumption: tests/sim/test_optimum.py checks
#    chain_optimum_extra(n, B) against the Checkmate integer program and a brute-force
#    search of every eviction schedule of the simulator's semantics on small chains.
CHAIN_WORK_SLOTS = 3


def chain_optimum_extra(n_layers: int, budget: int) -> int | None:
    """The least extra operations (recomputations beyond the baseline's one run of every op)
    of any schedule of ``generators.chain(n_layers)`` under ``budget`` units of memory
    (NOTE [ Revolve and the simulator's chain ]); ``None`` when no schedule fits."""
    _check(n_layers, 1)
    s = int(budget) - CHAIN_WORK_SLOTS
    if s < 1:
        return None
    return revolve_extra(n_layers, min(s, n_layers))
