"""Torch twins of the scoring kernels: the CPU path, and the kernels' test oracle.

The rules are NOTE [ Scoring rules ] in spec.py, the readable specification that this
file, the CPU path, and the kernels are tested against.
"""

from __future__ import annotations

import functools
import threading

import torch

from .heuristics import CustomHeuristic, Heuristic

__all__ = ["RESIDENT_EVICTABLE", "random_base", "score_torch", "select_torch"]

# NOTE [ Lean twin ]
# The twin is also the CPU path, so it makes few passes over the columns and allocates
# nothing per decision, with the exact results of NOTE [ Scoring rules ]. On CPU, boolean
# masks, ``where`` and ``argmin`` each cost several float multiplies, converting int64 to
# float32 costs several times converting int32, and fresh buffers of this size cost page
# faults on every call (before the workspace of rule 7). Measured: see docs/benchmarks.md,
# Measurements behind the NOTEs, Lean twin.
# 1. Candidates without masks: ``evictable_size`` is float32(size) for candidates and NaN
#    elsewhere; a table keeps it (NOTE [ Evictable size ]); for bare columns it is made here:
#    clamp_min(1 - (state - 1)^2, 0) is 1 for candidates and 0 elsewhere, divided by itself
#    1 or NaN, times float32(size). den = s * evictable_size is NaN for every non-candidate.
#    Exact scores (``score_torch``): f = clamp_min(den, 0) / itself is 1 where the slot is a
#    candidate with den > 0 and NaN elsewhere (0 / 0); the numerator cost + nbhd_cost * f (or
#    cost * f) is unchanged or NaN, and one nan_to_num after the division turns every NaN into
#    +inf (rule 4). -inf scores stay -inf.
# 2. Lean scores (selection on CPU): num / clamp_min(den, 0), then NaN -> +inf. Where den > 0
#    it is the exact score; where den <= 0 it is a division by +-0: +inf, NaN (-> +inf), or
#    -inf, and only -inf is wrong. So if the minimum found is not -inf, every score equals the
#    exact one; if it is -inf (some numerator is negative, or -inf), the exact scores are
#    computed and searched again. In the common case this saves the factor f (a pass to
#    make it, a division) and addcmul's third operand.
# 3. s without int64 -> float32 conversion: when 0 <= now < 2**31 and the caller knows that
#    every last_access lies in [0, 2**31) (``clock_bounds``; a table keeps them, NOTE [ Clock
#    bounds ]), now - last_access is an int32 without overflow, so the column is narrowed to
#    int32, subtracted and converted from int32: the same float32 as rule 2, and cheaper.
#    Otherwise int64, as written there. Checking the bounds on the column instead (int64
#    amax, and amin of its int32 words: int64 amin is not vectorised) cost most of that
#    saving. Measured: see docs/benchmarks.md, Measurements behind the NOTEs, Evictable size
#    and Clock bounds.
# 4. The first minimum (rule 7) in two levels on CPU: the minima of rows of _ROW slots
#    (vectorised ``amin``), ``argmin`` of those minima, then ``argmin`` of that one row.
#    ``argmin`` returns the first minimum, so the lowest slot wins ties at both levels. The
#    last row is padded with the worst score. CUDA uses one ``argmin``, fast there.
# 5. Non-candidates score +inf, like a candidate whose score is +inf. If the first minimum is
#    a non-candidate, the minimum is +inf and every candidate ties at +inf: the victim is the
#    first candidate, or none. One host read of the winner's state decides.
# 6. k > 1 on CPU: the k best slots lie in the k rows with the best (row minimum, row) keys
#    (a slot outside them comes after those k rows' minima). Those rows are gathered, cut in
#    sub-rows of _SUB slots, the k best sub-rows chosen the same way and their k * _SUB
#    scores sorted stably. If the k-th is +inf it may tie with non-candidates outside those
#    rows: then the candidates are listed and ranked directly, as on CUDA.
# 7. The CPU buffers (the padded scores, den, evictable_size when it is not given, and an
#    int64 column whose bytes also hold two float32 or one int32 column: 20 bytes per slot;
#    16 more for lru, size and random) are kept per thread for the last N scored. Nothing
#    returned aliases them.
# 8. lru, size and random use no fresh buffer either; random masks non-candidates with a
#    factor (1 or NaN, from evictable_size or from state as in rule 1), not with ``where``,
#    whose data-dependent branches are slow on random masks; int64 row minima are ~amax(~x)
#    (int64 amin is not vectorised). Measured: see docs/benchmarks.md, Measurements behind
#    the NOTEs, Lean twin.

RESIDENT_EVICTABLE = 1
_M32 = 0xFFFFFFFF
_INT64_MAX = torch.iinfo(torch.int64).max
_INF = float("inf")
_F32 = torch.float32
_ROW = 2048  # slots per row of the two-level minimum (NOTE [ Lean twin ] 4)
_SUB = 64  # slots per sub-row when k > 1 (NOTE [ Lean twin ] 6)
_MAX_K_ROWS = 32  # k up to this takes the row path on CPU: k * _SUB values are sorted
_CLOCK32 = 2**31  # clocks below this may take the int32 path of NOTE [ Lean twin ] 3
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


class _Work:
    """Work buffers of the scores of N slots (NOTE [ Lean twin ] 7): ``score`` [N + padding]
    float32 (the padding +inf), ``den`` and ``evs`` [N] float32, ``wide`` [N] int64, whose bytes
    are also ``ok`` and ``tmp`` ([N] float32) or ``narrow`` ([N] int32); for ``lru``, ``size``
    and ``random``, ``key`` [N + padding] int64 (the padding int64 max) and ``spare``."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.score = torch.full((n + _padding(n, device),), _INF, dtype=_F32, device=device)
        self.den = torch.empty(n, dtype=_F32, device=device)
        self.evs = torch.empty(n, dtype=_F32, device=device)
        self.wide = torch.empty(n, dtype=torch.int64, device=device)
        self.ok, self.tmp = self.wide.view(_F32).view(2, n)
        self.narrow = self.wide.view(torch.int32)[:n]
        self.one = torch.ones((), dtype=_F32, device=device)
        self.now32 = torch.zeros((), dtype=torch.int32, device=device)
        self.key_max = torch.tensor(_INT64_MAX, device=device)

    @functools.cached_property
    def key(self) -> torch.Tensor:
        return torch.full_like(self.score, _INT64_MAX, dtype=torch.int64)

    @functools.cached_property
    def spare(self) -> torch.Tensor:
        """Room for ``~key`` (``_row_minima``)."""
        return torch.empty_like(self.key)


class _Workspace(threading.local):
    """The CPU ``_Work`` of the last N, one per thread (NOTE [ Lean twin ] 7)."""

    def __init__(self) -> None:
        self.n, self.work = -1, None

    def get(self, n: int) -> _Work:
        if n != self.n:
            self.n, self.work = -1, None  # a failed allocation leaves nothing half made
            self.work = _Work(n, torch.device("cpu"))
            self.n = n
        return self.work


_WORKSPACE = _Workspace()


def _candidate_factor_into(state, w: _Work) -> torch.Tensor:
    """1 for candidates and NaN elsewhere, [N] float32 in ``w.tmp`` (NOTE [ Lean twin ] 1)."""
    w.ok.copy_(state).sub_(1)
    torch.addcmul(w.one, w.ok, w.ok, value=-1, out=w.tmp)  # 1 - (state - 1)^2: 1 for candidates
    return w.tmp.clamp_min_(0).div_(w.tmp)  # 1 for candidates, 0 / 0 = NaN elsewhere


def _evictable_size_into(size, state, w: _Work) -> torch.Tensor:
    """float32(size) for candidates, NaN elsewhere, into ``w.evs`` (NOTE [ Lean twin ] 1)."""
    return w.evs.copy_(size).mul_(_candidate_factor_into(state, w))


def _staleness_into(
    last_access, now: int, clock_bounds: tuple[int, int] | None, w: _Work
) -> torch.Tensor:
    """float32(now - last_access) (rule 2) into ``w.den``; NOTE [ Lean twin ] 3."""
    lo, hi = clock_bounds if clock_bounds is not None else (-1, _CLOCK32)  # None: int64
    if lo >= 0 and hi < _CLOCK32 and 0 <= now < _CLOCK32:
        w.narrow.copy_(last_access)
        torch.sub(w.now32.fill_(now), w.narrow, out=w.narrow)
        return w.den.copy_(w.narrow)
    torch.sub(last_access, now, out=w.wide).neg_()  # now - last_access, as int64 wraps
    return w.den.copy_(w.wide)


def _ratio_into(
    h: Heuristic, cost, last_access, nbhd_cost, evs, now: int, clock_bounds, w: _Work, exact: bool
) -> torch.Tensor:
    """Rules 2-4 into ``w.score[:N]``, non-candidates +inf; ``evs`` is the evictable size.
    ``exact``: NOTE [ Lean twin ] 1, else 2 (only -inf scores may differ from the exact)."""
    out = w.score[: cost.numel()]
    if h is Heuristic.MSPS:
        den = evs
    else:
        den = _staleness_into(last_access, now, clock_bounds, w).mul_(evs)
    if exact:
        f = torch.clamp_min(den, 0, out=w.tmp).div_(w.tmp)  # 1, or NaN where den <= 0 or NaN
        if h is Heuristic.DTR_LOCAL:
            torch.mul(cost, f, out=out)
        else:
            torch.addcmul(cost, nbhd_cost, f, out=out)
        out.div_(den)
    else:
        den = torch.clamp_min(den, 0, out=w.den)
        if h is Heuristic.DTR_LOCAL:
            torch.div(cost, den, out=out)
        else:
            torch.add(cost, nbhd_cost, out=out).div_(den)
    return out.nan_to_num_(nan=_INF, posinf=_INF, neginf=-_INF)


def _random_into(n: int, base: int, state, evs, w: _Work) -> torch.Tensor:
    """Rule 6 into ``w.score[:N]``, non-candidates +inf, without ``where`` (its data-dependent
    branches make it slow on CPU); the hash runs in ``w.wide`` and ``w.key``."""
    x, t = w.wide, w.key[:n]
    torch.arange(n, out=x).bitwise_xor_(base).bitwise_and_(_M32)
    for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, 0)):  # _mix32, in place
        x.bitwise_xor_(torch.bitwise_right_shift(x, shift, out=t))
        if mul:
            x.mul_(mul).bitwise_and_(_M32)
    out = w.score[:n].copy_(torch.bitwise_right_shift(x, 8, out=t)).mul_(1.0 / (1 << 24))
    # 1 for candidates, NaN elsewhere; made after the hash: its bytes are those of w.wide
    f = _candidate_factor_into(state, w) if evs is None else torch.mul(evs, 0, out=w.den).add_(1)
    return out.mul_(f).nan_to_num_(nan=_INF)


def _scores(
    heuristic: Heuristic | CustomHeuristic,
    cost,
    size,
    last_access,
    nbhd_cost,
    state,
    now: int,
    seed: int,
    evictable_size,
    clock_bounds,
    scratch: bool,
    exact: bool,
) -> torch.Tensor:
    """The scores of ``score_torch``; with ``scratch``, in a reused padded buffer on CPU;
    ratio scores lean unless ``exact`` (NOTE [ Lean twin ] 2)."""
    n, device = cost.numel(), cost.device
    h = heuristic if isinstance(heuristic, CustomHeuristic) else Heuristic(heuristic)
    if isinstance(h, CustomHeuristic):
        score = torch.as_tensor(h.fn(cost, size, last_access, nbhd_cost, now), device=device)
        if score.shape != cost.shape:
            raise ValueError(
                f"heuristic {h.name!r} returned scores of shape {tuple(score.shape)}, "
                f"expected {tuple(cost.shape)} (one per slot)"
            )
        score = score.to(torch.float32) if not score.is_floating_point() else score
        score = torch.where(torch.isnan(score), _INF, score)
        score = torch.where(state == RESIDENT_EVICTABLE, score, _INF)
        pad = _padding(n, device) if scratch else 0
        return torch.cat([score, score.new_full((pad,), _INF)]) if pad else score
    cpu = device.type == "cpu"
    w = _WORKSPACE.get(n) if cpu else _Work(n, device)
    if h in _RATIO:
        evs = evictable_size
        if evs is None:
            evs = _evictable_size_into(size, state, w)
        _ratio_into(h, cost, last_access, nbhd_cost, evs, now, clock_bounds, w, exact)
        padded = w.score
    elif h is Heuristic.RANDOM:
        _random_into(n, random_base(seed, now), state, evictable_size, w)
        padded = w.score
    else:  # rule 5: exact int64 keys; where(..., out=) writes no fresh buffer
        cand = state == RESIDENT_EVICTABLE
        if h is Heuristic.LRU:
            torch.where(cand, last_access, w.key_max, out=w.key[:n])
        else:
            torch.where(cand, size, -w.key_max, out=w.key[:n]).neg_()
        padded = w.key
    if scratch:
        return padded
    return padded[:n].clone() if cpu else padded[:n]


def score_torch(
    heuristic: Heuristic | CustomHeuristic,
    cost: torch.Tensor,
    size: torch.Tensor,
    last_access: torch.Tensor,
    nbhd_cost: torch.Tensor,
    state: torch.Tensor,
    now: int,
    seed: int = 0,
    evictable_size: torch.Tensor | None = None,
    clock_bounds: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Scores of all slots per NOTE [ Scoring rules ].

    Args: ``cost`` [N] float32, ``size`` [N] int64 bytes, ``last_access`` [N] int64,
    ``nbhd_cost`` [N] float32, ``state`` [N] int8, ``now`` int (logical clock);
    ``evictable_size`` [N] float32, optional: float32(size) where state is 1 and NaN elsewhere,
    as a table keeps it (NOTE [ Evictable size ]); made from size and state when None;
    ``clock_bounds`` (lo, hi), optional: every last_access lies in [lo, hi], as a table knows
    (NOTE [ Clock bounds ]). Both are trusted, not checked: they change no result if true.
    Returns [N] ``heuristic.score_dtype``; non-candidates hold +inf (float) or int64 max.
    """
    return _scores(
        heuristic,
        cost,
        size,
        last_access,
        nbhd_cost,
        state,
        now,
        seed,
        evictable_size,
        clock_bounds,
        scratch=False,
        exact=True,
    )


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


def _row_minima(rows: torch.Tensor) -> torch.Tensor:
    """``rows.amin(1)``; int64 as ~amax(~rows), the same values: int64 ``amin`` is not
    vectorised on CPU (140 us against 35 us at [49, 2048], 2-core AMD EPYC VM, one thread,
    torch 2.13.0+cpu); ~x reverses the int64 order without overflow."""
    if rows.dtype != torch.int64:
        return rows.amin(1)
    w = _WORKSPACE.work
    spare = (
        w.spare.view_as(rows) if w is not None and w.key.shape == rows.reshape(-1).shape else None
    )
    return torch.bitwise_not(rows, out=spare).amax(1).bitwise_not_()


def _best_rows(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k rows of ``rows`` [R, C] (no NaN) with the smallest (row minimum,
    row) keys, ascending."""
    mins = _row_minima(rows)
    if mins.numel() <= _ROW:  # a stable sort of a short vector is cheap on CPU
        best = torch.sort(mins, stable=True).indices[:k]
    else:
        best = _k_smallest(mins, k)
    return best.sort().values


def _first_min(score: torch.Tensor) -> tuple[int | torch.Tensor, float | torch.Tensor]:
    """Position of the first minimum of ``score`` [M] (no NaN) and that minimum: Python
    numbers from the row search, 0-d tensors otherwise (no host read on CUDA)."""
    rows = _rows(score)
    if rows is None:
        i = torch.argmin(score)
        return i, score[i]
    mins = _row_minima(rows)
    r = int(torch.argmin(mins))
    return r * _ROW + int(torch.argmin(rows[r])), mins[r].item()


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
    evictable_size: torch.Tensor | None = None,
    clock_bounds: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The ``min(k, #candidates)`` lowest-scoring candidate slots, [k'] int64 on the input's
    device, ordered by (score, slot id); see NOTE [ Scoring rules ] and [ Lean twin ].
    Arguments as for :func:`score_torch`."""
    if cost.numel() == 0 or k <= 0:
        return torch.empty(0, dtype=torch.int64, device=cost.device)
    cols = (
        heuristic,
        cost,
        size,
        last_access,
        nbhd_cost,
        state,
        now,
        seed,
        evictable_size,
        clock_bounds,
    )
    lean = cost.device.type == "cpu" and heuristic in _RATIO  # NOTE [ Lean twin ] 2
    score = _scores(*cols, scratch=True, exact=not lean)
    if k == 1:
        i, low = _first_min(score)
        if lean and float(low) == -_INF:  # a lean score may be wrong: use the exact ones
            i, low = _first_min(_scores(*cols, scratch=True, exact=True))
        if state[i].item() == RESIDENT_EVICTABLE:  # one host read (NOTE [ Lean twin ] 5)
            return i.reshape(1) if isinstance(i, torch.Tensor) else torch.tensor([i])
        return (state == RESIDENT_EVICTABLE).nonzero()[:1].reshape(-1)
    if lean and score.amin().item() == -_INF:
        score = _scores(*cols, scratch=True, exact=True)
    rows = _rows(score)
    if rows is not None and k <= _MAX_K_ROWS and 2 * k * _ROW <= score.numel():
        best = _best_rows(rows, k)  # NOTE [ Lean twin ] 6
        sub = rows[best].view(-1, _SUB)  # [k * _ROW / _SUB, _SUB], ascending slots
        best_sub = _best_rows(sub, k)
        pos = torch.sort(sub[best_sub].reshape(-1), stable=True).indices[:k]
        rows_, subs, per = best.tolist(), best_sub.tolist(), _ROW // _SUB  # k ints: on the host
        ids = [
            rows_[subs[q // _SUB] // per] * _ROW + subs[q // _SUB] % per * _SUB + q % _SUB
            for q in pos.tolist()
        ]
        if score[ids[-1]].item() < _worst(score.dtype):  # the k-th is finite: all k are candidates
            return torch.tensor(ids, dtype=torch.int64)
    cand = (state == RESIDENT_EVICTABLE).nonzero().squeeze(1)
    return cand[_k_smallest(score[cand], k)]
