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

import threading

import torch

from .heuristics import CustomHeuristic, Heuristic

__all__ = ["RESIDENT_EVICTABLE", "random_base", "score_torch", "select_torch"]

# NOTE [ Lean twin ]
# The twin is also the CPU path, so it makes few passes over the columns and allocates
# nothing per decision, with the exact results of NOTE [ Scoring rules ]. On CPU, boolean
# masks, ``where`` and ``argmin`` each cost several float multiplies (N = 1e5, one thread,
# 2-core AMD EPYC VM, torch 2.13.0+cpu: where 42 us, a comparison 35-50 us, argmin 55 us;
# mul_ 6 us, amin 5 us), and fresh buffers of this size cost page faults on every call
# (~450 faults, ~700 us per decision before the workspace of rule 5).
# 1. Validity without masks: min(den, 1 - (state - 1)^2) is > 0 exactly where the slot is a
#    candidate with den > 0 (den is a product of two integers rounded to float32: 0, or at
#    least 1 in magnitude, and never overflowing). clamp_min(0), then x / x, make it 1 there
#    and NaN elsewhere; the numerator cost + nbhd_cost * that (or cost * that) is unchanged or
#    NaN, and one nan_to_num after the division turns every NaN, of the division or of the
#    mask, into +inf (rule 4). -inf scores stay -inf.
# 2. The first minimum (rule 7) in two levels on CPU: the minima of rows of _ROW slots
#    (vectorised ``amin``), ``argmin`` of those minima, then ``argmin`` of that one row.
#    ``argmin`` returns the first minimum, so the lowest slot wins ties at both levels. The
#    last row is padded with the worst score. CUDA uses one ``argmin``, fast there.
# 3. Non-candidates score +inf, like a candidate whose score is +inf. If the first minimum is
#    a non-candidate, the minimum is +inf and every candidate ties at +inf: the victim is the
#    first candidate, or none. One host read of the winner's state decides.
# 4. k > 1 on CPU: the k best slots lie in the k rows with the best (row minimum, row) keys
#    (a slot outside them comes after those k rows' minima). Those rows are gathered, cut in
#    sub-rows of _SUB slots, the k best sub-rows chosen the same way and their k * _SUB
#    scores sorted stably. If the k-th is +inf it may tie with non-candidates outside those
#    rows: then the candidates are listed and ranked directly, as on CUDA.
# 5. The CPU buffers (the padded scores, den, and an int64 column whose bytes later hold two
#    float32 columns: 16 bytes per slot) are kept per thread for the last N scored. Nothing
#    returned aliases them.

RESIDENT_EVICTABLE = 1
_M32 = 0xFFFFFFFF
_INT64_MAX = torch.iinfo(torch.int64).max
_INF = float("inf")
_F32 = torch.float32
_ROW = 2048  # slots per row of the two-level minimum (NOTE [ Lean twin ] 2)
_SUB = 64  # slots per sub-row when k > 1 (NOTE [ Lean twin ] 4)
_MAX_K_ROWS = 32  # k up to this takes the row path on CPU: k * _SUB values are sorted
_RATIO = (Heuristic.DTR, Heuristic.DTR_EQ, Heuristic.DTR_LOCAL, Heuristic.MSPS)


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


def _worst(dtype: torch.dtype) -> float | int:
    """The score of a non-candidate: +inf, or int64 max for the integer keys."""
    return _INT64_MAX if dtype == torch.int64 else _INF


def _padding(n: int, device: torch.device) -> int:
    """Slots appended so that the two-level search sees whole rows (0: one ``argmin``)."""
    return (-n) % _ROW if device.type == "cpu" and n > 2 * _ROW else 0


class _Workspace(threading.local):
    """CPU buffers of the ratio scores for the last N, one set per thread (NOTE [ Lean twin ]
    5): ``score`` [N + padding] float32 (the padding +inf), ``den`` [N] float32, and ``wide``
    [N] int64 whose bytes are also ``ok`` and ``tmp``, two [N] float32."""

    def __init__(self) -> None:
        self.n = -1

    def get(self, n: int) -> tuple[torch.Tensor, ...]:
        """(score, one, den, wide, ok, tmp) for N = ``n``."""
        if n != self.n:
            self.n = -1  # a failed allocation leaves no half-made set behind
            score = torch.full((n + _padding(n, torch.device("cpu")),), _INF, dtype=_F32)
            wide = torch.empty(n, dtype=torch.int64)
            ok_tmp = wide.view(_F32).view(2, n)
            self.bufs = (score, torch.ones((), dtype=_F32), torch.empty(n, dtype=_F32), wide,
                         *ok_tmp)
            self.n = n
        return self.bufs


_WORKSPACE = _Workspace()


def _ratio_into(h: Heuristic, cost, size, last_access, nbhd_cost, state, now: int,
                out: torch.Tensor, one: torch.Tensor, den: torch.Tensor, wide: torch.Tensor,
                ok: torch.Tensor, tmp: torch.Tensor) -> None:
    """Rules 2-4 into ``out`` [N] float32, non-candidates +inf (NOTE [ Lean twin ] 1).
    ``one`` is a 0-d float32 1; work space: ``den``, ``ok``, ``tmp`` [N] float32 and
    ``wide`` [N] int64 whose bytes may be those of ``ok`` and ``tmp``."""
    den.copy_(size)
    if h is not Heuristic.MSPS:
        torch.sub(last_access, now, out=wide).neg_()  # now - last_access, as int64 wraps
        den.mul_(out.copy_(wide))  # out holds s for now
    ok.copy_(state).sub_(1)
    torch.addcmul(one, ok, ok, value=-1, out=tmp)  # 1 - (state - 1)^2: 1 for candidates, else <= 0
    torch.minimum(den, tmp, out=tmp).clamp_min_(0)
    tmp.div_(tmp)  # 1 for a candidate with den > 0, NaN otherwise
    if h is Heuristic.DTR_LOCAL:
        torch.mul(cost, tmp, out=out)
    else:
        torch.addcmul(cost, nbhd_cost, tmp, out=out)  # cost + nbhd_cost, or NaN
    out.div_(den).nan_to_num_(nan=_INF, posinf=_INF, neginf=-_INF)


def _scores(heuristic: Heuristic | CustomHeuristic, cost, size, last_access, nbhd_cost, state,
            now: int, seed: int, scratch: bool) -> torch.Tensor:
    """The scores of ``score_torch``; with ``scratch``, in a reused padded buffer on CPU."""
    n, device = cost.numel(), cost.device
    h = heuristic if isinstance(heuristic, CustomHeuristic) else Heuristic(heuristic)
    if h in _RATIO:
        if device.type == "cpu":
            out, *work = _WORKSPACE.get(n)
            if not scratch:
                out = torch.empty(n, dtype=_F32)
        else:
            out = torch.empty(n, dtype=_F32, device=device)
            wide = torch.empty(n, dtype=torch.int64, device=device)
            work = [torch.ones((), dtype=_F32, device=device),
                    torch.empty(n, dtype=_F32, device=device), wide, *wide.view(_F32).view(2, n)]
        _ratio_into(h, cost, size, last_access, nbhd_cost, state, now, out[:n], *work)
        return out
    if isinstance(h, CustomHeuristic):
        score = torch.as_tensor(h.fn(cost, size, last_access, nbhd_cost, now), device=device)
        if score.shape != cost.shape:
            raise ValueError(
                f"heuristic {h.name!r} returned scores of shape {tuple(score.shape)}, "
                f"expected {tuple(cost.shape)} (one per slot)"
            )
        score = score.to(torch.float32) if not score.is_floating_point() else score
        score = torch.where(torch.isnan(score), _INF, score)
    elif h is Heuristic.RANDOM:
        slot = torch.arange(n, device=device, dtype=torch.int64)
        r = _mix32((slot ^ random_base(seed, now)) & _M32)
        score = (r >> 8).to(torch.float32) * (1.0 / (1 << 24))
    else:  # rule 5: exact int64 keys
        score = last_access if h is Heuristic.LRU else -size
    worst = _worst(score.dtype)
    score = torch.where(state == RESIDENT_EVICTABLE, score, worst)
    pad = _padding(n, device) if scratch else 0
    return torch.cat([score, score.new_full((pad,), worst)]) if pad else score


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
    return _scores(heuristic, cost, size, last_access, nbhd_cost, state, now, seed, False)


def _k_smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``min(k, M)`` smallest values of ``x`` [M] (no NaN), ordered by
    (value, position)."""
    if k >= x.numel():
        return torch.sort(x, stable=True).indices  # stable: ascending positions among ties
    kth = torch.kthvalue(x.cpu(), k).values.to(x.device)
    below = (x < kth).nonzero().squeeze(1)
    ties = (x == kth).nonzero().squeeze(1)[: k - below.numel()]
    chosen = torch.cat([below, ties]).sort().values
    return chosen[torch.sort(x[chosen], stable=True).indices]


def _rows(score: torch.Tensor) -> torch.Tensor | None:
    """The padded ``score`` as [rows, _ROW] for the two-level search, or None."""
    if score.device.type != "cpu" or score.numel() <= 2 * _ROW:
        return None
    return score.view(-1, _ROW)


def _best_rows(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k rows of ``rows`` [R, C] (no NaN) with the smallest (row minimum,
    row) keys, ascending."""
    mins = rows.amin(1)
    if mins.numel() <= _ROW:  # a stable sort of a short vector is cheap on CPU
        best = torch.sort(mins, stable=True).indices[:k]
    else:
        best = _k_smallest(mins, k)
    return best.sort().values


def _first_min(score: torch.Tensor) -> torch.Tensor:
    """Position of the first minimum of ``score`` [M] (no NaN), a 0-d int64 tensor."""
    rows = _rows(score)
    if rows is None:
        return torch.argmin(score)
    r = int(torch.argmin(rows.amin(1)))
    return torch.argmin(rows[r]).add_(r * _ROW)


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
    device, ordered by (score, slot id); see NOTE [ Scoring rules ] and [ Lean twin ]."""
    if cost.numel() == 0 or k <= 0:
        return torch.empty(0, dtype=torch.int64, device=cost.device)
    score = _scores(heuristic, cost, size, last_access, nbhd_cost, state, now, seed, True)
    if k == 1:
        i = _first_min(score)
        if state[i] == RESIDENT_EVICTABLE:  # one host read (NOTE [ Lean twin ] 3)
            return i.reshape(1)
        return (state == RESIDENT_EVICTABLE).nonzero()[:1].reshape(-1)
    rows = _rows(score)
    if rows is not None and k <= _MAX_K_ROWS and 2 * k * _ROW <= score.numel():
        best = _best_rows(rows, k)  # NOTE [ Lean twin ] 4
        sub = rows[best].view(-1, _SUB)  # [k * _ROW / _SUB, _SUB], ascending slots
        best_sub = _best_rows(sub, k)
        pos = torch.sort(sub[best_sub].reshape(-1), stable=True).indices[:k]
        rows_, subs, per = best.tolist(), best_sub.tolist(), _ROW // _SUB  # k ints: on the host
        ids = [rows_[subs[q // _SUB] // per] * _ROW + subs[q // _SUB] % per * _SUB + q % _SUB
               for q in pos.tolist()]
        if score[ids[-1]] < _worst(score.dtype):  # the k-th is finite: all k are candidates
            return torch.tensor(ids, dtype=torch.int64)
    cand = (state == RESIDENT_EVICTABLE).nonzero().squeeze(1)
    return cand[_k_smallest(score[cand], k)]
