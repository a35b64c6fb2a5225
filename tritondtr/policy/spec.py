"""The scoring rules, one slot at a time: the readable specification of the policy.

Plain Python and numpy float32 scalars, no vectorisation and no shortcuts: the oracle that
the torch twins (``scoring.py``, the CPU path) and the Triton kernels (``tritondtr.kernels``)
are tested against (tests of the policy), never used to decide at run time.

# NOTE [ Scoring rules ]
# 1. Candidates are the slots whose state is ``RESIDENT_EVICTABLE`` (1); no other slot is
#    ever selected, whatever its score.
# 2. s = now - last_access, computed in int64 and then rounded to float32.
# 3. Ratio scores are computed in float32 in this exact order, so that a kernel can match
#    them bit for bit: num = cost + nbhd_cost (or cost), den = float32(size) * s (or
#    float32(size)), score = num / den (IEEE round-to-nearest division).
# 4. A non-positive denominator gives +inf; NaN gives +inf. A candidate with score +inf can
#    still be selected: it only loses to every finite score.
# 5. ``lru`` and ``size`` rank by exact int64 keys (last_access, and -size) so that large
#    clocks and sizes never tie by rounding.
# 6. ``random`` scores are a 32-bit integer hash (lowbias32) of (seed + now) mixed with the
#    slot id, scaled to [0, 1) with 24 bits: reproducible from the seed, different per
#    decision, identical on every backend.
# 7. Ties go to the lowest slot id. Selection returns min(k, #candidates) ids, ordered by
#    (score, slot id) ascending; nothing evictable gives an empty result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .heuristics import Heuristic

__all__ = ["random_base", "score", "select"]

_F32 = np.float32
_M32 = 0xFFFFFFFF


def _f32_of_int64(x: int) -> np.float32:
    """float32 of ``x`` wrapped to int64 as int64 arithmetic wraps it, rounded once."""
    return np.array([(x + 2**63) % 2**64 - 2**63], dtype=np.int64).astype(_F32)[0]


def _lowbias32(x: int) -> int:
    """Chris Wellons' 32-bit integer hash (rule 6)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def random_base(seed: int, now: int) -> int:
    """The per-decision base of the ``random`` heuristic (rule 6): a hash of seed + now."""
    return _lowbias32((seed & _M32) + (now & _M32))


def score(
    h: Heuristic,
    *,
    cost: float,
    size: int,
    last_access: int,
    nbhd_cost: float,
    now: int,
    slot: int,
    seed: int = 0,
) -> float | int:
    """The score of candidate ``slot`` (lower is evicted first): a float for the ratio and
    ``random`` heuristics, an exact int key for ``lru`` and ``size`` (rule 5). ``cost`` and
    ``nbhd_cost`` are float32 values (ns), ``size`` bytes, ``last_access`` and ``now``
    clocks (int64)."""
    if h is Heuristic.LRU:
        return int(last_access)
    if h is Heuristic.SIZE:
        return -int(size)
    if h is Heuristic.RANDOM:
        x = _lowbias32(slot ^ random_base(seed, now))
        return float(_F32(x >> 8) * _F32(2.0**-24))
    staleness = _f32_of_int64(now - last_access)  # rule 2
    if h is Heuristic.MSPS:
        num, den = _F32(cost) + _F32(nbhd_cost), _f32_of_int64(size)
    elif h is Heuristic.DTR_LOCAL:
        num, den = _F32(cost), _f32_of_int64(size) * staleness
    else:  # dtr, dtr_eq: the neighbourhood cost is kept per heuristic, the formula is one
        num, den = _F32(cost) + _F32(nbhd_cost), _f32_of_int64(size) * staleness
    if not den > 0:  # rule 4
        return math.inf
    with np.errstate(all="ignore"):
        v = float(_F32(num) / den)  # rule 3: one float32 division
    return math.inf if math.isnan(v) else v


def select(
    h: Heuristic,
    *,
    cost: Sequence[float],
    size: Sequence[int],
    last_access: Sequence[int],
    nbhd_cost: Sequence[float],
    state: Sequence[int],
    now: int,
    k: int,
    seed: int = 0,
) -> list[int]:
    """The first ``min(k, #candidates)`` candidates in (score, slot) order (rules 1 and 7);
    the columns are per slot, ``state`` 1 for a candidate (``RESIDENT_EVICTABLE``)."""
    keyed = [
        (
            score(
                h,
                cost=cost[i],
                size=size[i],
                last_access=last_access[i],
                nbhd_cost=nbhd_cost[i],
                now=now,
                slot=i,
                seed=seed,
            ),
            i,
        )
        for i in range(len(state))
        if state[i] == 1
    ]
    return [i for _, i in sorted(keyed)[:k]]
