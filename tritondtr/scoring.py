"""Torch twins of the scoring kernels: the specification, the CPU path and the test oracle.

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

import torch

from .heuristics import CustomHeuristic, Heuristic

__all__ = ["RESIDENT_EVICTABLE", "random_base", "score_torch", "select_torch"]

RESIDENT_EVICTABLE = 1
_M32 = 0xFFFFFFFF
_INT64_MAX = torch.iinfo(torch.int64).max


def _mix32(x: torch.Tensor | int) -> torch.Tensor | int:
    """lowbias32 (Chris Wellons' 32-bit hash) on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def random_base(seed: int, now: int) -> int:
    """Per-decision hash base of the ``random`` heuristic (rule 6), a host-side int."""
    return int(_mix32(((seed & _M32) + (now & _M32)) & _M32))


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    score = num / den
    score = torch.where(den > 0, score, torch.full_like(score, float("inf")))
    return torch.where(torch.isnan(score), torch.full_like(score, float("inf")), score)


def score_torch(
    heuristic: Heuristic | CustomHeuristic,
    cost: torch.Tensor,
    size: torch.Tensor,
    last_access: torch.Tensor,
    nbhd_cost: torch.Tensor,
    state: torch.Tensor,
    now: int,
    seed: int = 0,
) -> torch.Tensor:
    """Scores of all slots per NOTE [ Scoring rules ].

    Args: ``cost`` [N] float32, ``size`` [N] int64 bytes, ``last_access`` [N] int64,
    ``nbhd_cost`` [N] float32, ``state`` [N] int8, ``now`` int (logical clock).
    Returns [N] ``heuristic.score_dtype``; non-candidates hold +inf (float) or int64 max.
    """
    cand = state == RESIDENT_EVICTABLE
    if isinstance(heuristic, CustomHeuristic):
        score = heuristic.fn(cost, size, last_access, nbhd_cost, now)
        score = torch.as_tensor(score, device=cost.device)
        if score.shape != cost.shape:
            raise ValueError(
                f"heuristic {heuristic.name!r} returned scores of shape {tuple(score.shape)}, "
                f"expected {tuple(cost.shape)} (one per slot)"
            )
        score = score.to(torch.float32) if not score.is_floating_point() else score
        score = torch.where(torch.isnan(score), torch.full_like(score, float("inf")), score)
        return torch.where(cand, score, torch.full_like(score, float("inf")))
    h = Heuristic(heuristic)
    if h is Heuristic.LRU:
        key = last_access
    elif h is Heuristic.SIZE:
        key = -size
    if h in (Heuristic.LRU, Heuristic.SIZE):
        return torch.where(cand, key, torch.full_like(key, _INT64_MAX))
    if h is Heuristic.RANDOM:
        slot = torch.arange(cost.numel(), device=cost.device, dtype=torch.int64)
        r = _mix32((slot ^ random_base(seed, now)) & _M32)
        score = (r >> 8).to(torch.float32) * (1.0 / (1 << 24))
    else:
        s = (now - last_access).to(torch.float32)
        size_f = size.to(torch.float32)
        if h in (Heuristic.DTR, Heuristic.DTR_EQ):
            score = _ratio(cost + nbhd_cost, size_f * s)
        elif h is Heuristic.DTR_LOCAL:
            score = _ratio(cost, size_f * s)
        else:  # MSPS
            score = _ratio(cost + nbhd_cost, size_f)
    return torch.where(cand, score, torch.full_like(score, float("inf")))


def select_torch(
    heuristic: Heuristic | CustomHeuristic,
    cost: torch.Tensor,
    size: torch.Tensor,
    last_access: torch.Tensor,
    nbhd_cost: torch.Tensor,
    state: torch.Tensor,
    now: int,
    k: int = 1,
    seed: int = 0,
) -> torch.Tensor:
    """The ``min(k, #candidates)`` lowest-scoring candidate slots, [k'] int64 on the input's
    device, ordered by (score, slot id); see NOTE [ Scoring rules ]."""
    score = score_torch(heuristic, cost, size, last_access, nbhd_cost, state, now, seed)
    cand = (state == RESIDENT_EVICTABLE).nonzero().squeeze(1)
    if cand.numel() == 0 or k <= 0:
        return cand[:0]
    key = score[cand]
    if k == 1:
        # argmin returns the first minimum, i.e. the lowest slot id among ties.
        return cand[torch.argmin(key)].reshape(1)
    if k >= cand.numel():
        # A stable sort keeps ascending slot ids among equal scores.
        return cand[torch.sort(key, stable=True).indices]
    kth = torch.kthvalue(key.cpu(), k).values.to(key.device)
    below = cand[key < kth]
    ties = cand[key == kth][: k - below.numel()]
    chosen = torch.cat([below, ties])
    chosen = chosen.sort().values
    return chosen[torch.sort(score[chosen], stable=True).indices]
