"""Heuristic scores of every slot: the per-tile scoring shared by all kernels, the ``score``
kernel and the argument checks of every launcher.

The formulas reproduce NOTE [ Scoring rules ] (``tritondtr/policy/spec.py``, the specification)
bit for bit, as the torch twins in ``tritondtr/policy/scoring.py`` do; this module only imports
torch and triton.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

__all__ = ["HEURISTIC_IDS", "check_columns", "key_dtype", "score"]

# Heuristic ids, the HEURISTIC meta-parameter. dtr and dtr_eq share the formula: their
# nbhd_cost columns differ upstream.
_DTR = tl.constexpr(0)
_DTR_LOCAL = tl.constexpr(1)
_MSPS = tl.constexpr(2)
_LRU = tl.constexpr(3)
_SIZE = tl.constexpr(4)
_RANDOM = tl.constexpr(5)
HEURISTIC_IDS = {
    "dtr": 0,
    "dtr_eq": 0,
    "dtr_local": 1,
    "msps": 2,
    "lru": 3,
    "size": 4,
    "random": 5,
}
_INT_KEYED = ("lru", "size")

_RESIDENT_EVICTABLE = tl.constexpr(1)
_INT64_MAX = tl.constexpr(2**63 - 1)
_INV_2_24 = tl.constexpr(1.0 / (1 << 24))
# lowbias32 multipliers. The second does not fit in int32, so it is written as its int32
# twin (minus 2**32): both give the same low 32 bits of the product, which is all the hash
# keeps, and no unsigned constant enters the int64 arithmetic.
_MUL1 = tl.constexpr(0x7FEB352D)
_MUL2 = tl.constexpr(0x846CA68B - (1 << 32))

# Launched under the interpreter, the kernels run on CPU tensors; it is read once, at import,
# exactly as triton reads it when it decorates the kernels.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _tile_keys(
    # pointers to the columns, [N] each
    cost_ptr,
    size_ptr,
    last_access_ptr,
    nbhd_cost_ptr,
    state_ptr,
    # slot ids of the tile, [BLOCK] int64, and which of them are < N
    offs,
    in_range,
    # scalars
    now,
    rand_base,
    # meta-parameters
    HEURISTIC: tl.constexpr,
):
    """Keys of one tile: [BLOCK] float32 (int64 for lru and size), and the candidate mask.

    Non-candidates (and slots past N) hold the sentinel: +inf, or int64 max. Only the columns
    the heuristic reads are loaded (dtr: 25 bytes per slot, lru: 9).
    """
    state = tl.load(state_ptr + offs, mask=in_range, other=0)
    cand = state == _RESIDENT_EVICTABLE
    if HEURISTIC == _LRU:
        last = tl.load(last_access_ptr + offs, mask=in_range, other=0)
        key = tl.where(cand, last, _INT64_MAX)
    elif HEURISTIC == _SIZE:
        size = tl.load(size_ptr + offs, mask=in_range, other=0)
        key = tl.where(cand, -size, _INT64_MAX)
    elif HEURISTIC == _RANDOM:
        # lowbias32 in int64 (rule 6); wraparound of the products is harmless: only the low
        # 32 bits are kept.
        m32 = tl.full([1], 0xFFFFFFFF, tl.int64)
        x = (offs ^ rand_base) & m32
        x = x ^ (x >> 16)
        x = (x * _MUL1) & m32
        x = x ^ (x >> 15)
        x = (x * _MUL2) & m32
        x = x ^ (x >> 16)
        score = (x >> 8).to(tl.float32) * _INV_2_24
        key = tl.where(cand, score, float("inf"))
    else:
        # Rule 3: num, den and the division are separate roundings in this order; there is
        # no a * b + c here, so no FMA contraction can change a bit.
        cost = tl.load(cost_ptr + offs, mask=in_range, other=0.0)
        if HEURISTIC == _DTR_LOCAL:
            num = cost
        else:
            num = cost + tl.load(nbhd_cost_ptr + offs, mask=in_range, other=0.0)
        size_f = tl.load(size_ptr + offs, mask=in_range, other=0).to(tl.float32)
        if HEURISTIC == _MSPS:
            den = size_f
        else:
            last = tl.load(last_access_ptr + offs, mask=in_range, other=0)
            den = size_f * (now - last).to(tl.float32)  # s in int64, then one rounding
        # IEEE round-to-nearest division, as torch's `/` (plain `/` may be approximate on GPU).
        score = tl.math.div_rn(num, den)
        score = tl.where(den > 0, score, float("inf"))  # rule 4
        score = tl.where(score != score, float("inf"), score)  # NaN -> +inf
        key = tl.where(cand, score, float("inf"))
    return key, cand


@triton.jit(do_not_specialize=["now", "rand_base"])
def _score_kernel(
    # pointers: the columns [N] and the output [N] (float32, or int64 for lru and size)
    cost_ptr,
    size_ptr,
    last_access_ptr,
    nbhd_cost_ptr,
    state_ptr,
    out_ptr,
    # sizes
    N,
    # scalars
    now,
    rand_base,
    # meta-parameters
    HEURISTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One tile of BLOCK slots per program: out[i] = key of slot i."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < N
    key, _ = _tile_keys(
        cost_ptr,
        size_ptr,
        last_access_ptr,
        nbhd_cost_ptr,
        state_ptr,
        offs,
        in_range,
        now,
        rand_base,
        HEURISTIC,
    )
    tl.store(out_ptr + offs, key, mask=in_range)


_COLUMNS = (
    ("cost", torch.float32),
    ("size", torch.int64),
    ("last_access", torch.int64),
    ("nbhd_cost", torch.float32),
    ("state", torch.int8),
)


def key_dtype(name: str) -> torch.dtype:
    """Dtype of the scores of heuristic ``name``: int64 for lru and size, else float32."""
    return torch.int64 if name in _INT_KEYED else torch.float32


def check_columns(name: str, cols: tuple[torch.Tensor, ...], now: int, rand_base: int) -> int:
    """Validate a launcher's arguments; returns N. Raises ValueError saying what was wrong."""
    if name not in HEURISTIC_IDS:
        raise ValueError(
            f"no Triton kernel for heuristic {name!r}; built-ins are {sorted(HEURISTIC_IDS)} "
            "(user heuristics run on the torch backend)"
        )
    n = None
    device = None
    for (col, dtype), t in zip(_COLUMNS, cols):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{col} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise ValueError(f"{col} must be {dtype}, got {t.dtype}; convert it with .to({dtype})")
        if t.dim() != 1:
            raise ValueError(f"{col} must be 1-D [N], got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{col} must be contiguous; call .contiguous() first")
        if n is None:
            n, device = t.numel(), t.device
        elif t.numel() != n:
            raise ValueError(f"{col} has {t.numel()} slots but cost has {n}; all columns are [N]")
        elif t.device != device:
            raise ValueError(f"{col} is on {t.device} but cost is on {device}; use one device")
    if device.type != "cuda" and not _INTERPRETED:
        raise ValueError(
            f"the Triton kernels got {device.type} tensors: they need CUDA tensors, or "
            "TRITON_INTERPRET=1 set before tritondtr.kernels is imported"
        )
    for arg, value in (("now", now), ("rand_base", rand_base)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{arg} must be a Python int, got {value!r}")
    if not 0 <= rand_base < 2**32:
        raise ValueError(f"rand_base must lie in [0, 2**32), got {rand_base}")
    return n


def _block(n: int, device: torch.device) -> int:
    """Slots per tile: a power of two, at most the next one above n, at least 128.

    CUDA: 1024 slots over 4 warps is 8 slots per thread, 64 to 128 registers (ptxas -v for
    sm_90, no spills), so several programs share an SM and keep loads in flight; an estimate
    for an H100 from register counts, not a timing (no GPU was at hand). The interpreter runs
    programs and tiles one after another in Python: few, large tiles.
    """
    cap = 1024 if device.type == "cuda" else 4096
    return max(128, min(cap, triton.next_power_of_2(max(n, 1))))


def score(
    name: str,
    cost: torch.Tensor,
    size: torch.Tensor,
    last_access: torch.Tensor,
    nbhd_cost: torch.Tensor,
    state: torch.Tensor,
    *,
    now: int,
    rand_base: int,
) -> torch.Tensor:
    """Scores of all slots, [N] float32 (int64 for ``lru`` and ``size``) on the input device.

    Args: ``cost`` [N] float32, ``size`` [N] int64 bytes, ``last_access`` [N] int64,
    ``nbhd_cost`` [N] float32, ``state`` [N] int8 (candidates: state == 1), all contiguous on
    one device; ``now`` the logical clock; ``rand_base`` in [0, 2**32) (``random`` only).
    Non-candidates hold +inf (int64 max for int keys). Same values as ``score_torch``.
    """
    cols = (cost, size, last_access, nbhd_cost, state)
    n = check_columns(name, cols, now, rand_base)
    out = torch.empty(n, dtype=key_dtype(name), device=cost.device)
    if n == 0:
        return out
    block = _block(n, out.device)
    grid = (triton.cdiv(n, block),)
    guard = torch.cuda.device(out.device) if out.is_cuda else contextlib.nullcontext()
    with guard:  # the launch goes to the tensors' device (and its stream)
        _score_kernel[grid](
            *cols,
            out,
            n,
            now,
            rand_base,
            HEURISTIC=HEURISTIC_IDS[name],
            BLOCK=block,
            num_warps=4,
            enable_fp_fusion=False,
        )
    return out
