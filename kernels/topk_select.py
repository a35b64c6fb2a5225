"""Victim selection in one launch: score every slot and reduce to the k lowest (score, slot).

# NOTE [ One-launch selection ]
# 1. Order: pairs (key, slot) compare lexicographically, so ties go to the lowest slot id.
#    Non-candidates carry (sentinel, int64 max): a candidate whose score is +inf (or int64
#    max) still beats every non-candidate, and a sentinel pair is never a result (-1).
# 2. Each program strides over tiles of BLOCK slots (persistent grid) and keeps its best K
#    pairs: for K == 1 one running pair per lane, reduced once at the end; for K > 1 a sorted
#    list, merged with a tile only when some slot of the tile beats the list's K-th pair.
#    Loops with runtime bounds are ``while`` loops: Triton 3.6's interpreter cannot take a
#    runtime value (an argument, a program id, a sum) as a ``range`` bound under numpy >= 2.4
#    (triton-lang/triton#9171). On a GPU a program runs a few tiles (``programs`` is a
#    multiple of the SM count), so the software pipelining a ``for`` loop would allow has
#    little to overlap.
# 3. A lexicographic min is two built-in reductions (min of the keys, then min of the slots
#    holding that key) rather than one tl.reduce with a tuple combine function. The
#    interpreter calls a custom combine function once per element in Python, so a tile took
#    far longer than with the two built-ins (measured: see docs/benchmarks.md, Measurements
#    behind the NOTEs, One-launch selection). On a GPU it is two reduction trees instead of
#    one (not measured).
# 4. Every program writes its K pairs to the partials, then takes a ticket from a counter
#    (barrier first, acq_rel atomic): the program that draws the last ticket reads all the
#    partials (bypassing L1: .cg), reduces them to the final K, writes the slot ids and
#    resets the counter to 0 for the next launch. No program ever waits for another.
# 5. The counter is one int32 per (device, stream), allocated zeroed once and cached: no
#    memset launch per call. Launches on one stream are ordered, so a launch always finds 0.
# 6. k up to MAX_K is one launch. A larger k uses the score kernel and two stable sorts.
# 7. A decision is a few microseconds of GPU work, so its host cost is what a caller waits
#    for. A Selection validates its columns and allocates its workspace once; on CUDA it
#    keeps the compiled kernel of its first launch and calls it directly afterwards,
#    skipping Triton's per-call argument binding and cache lookup. What that kernel was
#    specialised on is fixed for a Selection (its tensors, N, k, the tiling), except the
#    integer type Triton gives ``now`` and ``rand_base`` (i32 inside int32's range, i64
#    outside it: ``do_not_specialize`` leaves the type): one compiled kernel per pair of
#    types. The direct call passes the launcher every argument in signature order, the
#    constexprs included, as Triton's own launch does (Triton 3.6 and 3.9 alike), and the
#    tensors as their addresses: the launcher then neither calls ``data_ptr()`` nor asks
#    the driver about each pointer. So a Selection's tensors must keep their storage: the
#    selection holds them alive; a CUDA table drops its selections when it reallocates its
#    columns. The host-side costs per decision, measured on a GPU: docs/benchmarks.md,
#    "Decision cost".
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from .heuristic_scores import HEURISTIC_IDS, _block, _tile_keys, check_columns, key_dtype
from .heuristic_scores import score as score_all

__all__ = ["MAX_K", "Selection", "select"]

MAX_K = 64  # the [K, K] rank merge spills registers at K = 128 (ptxas -v, sm_90)
_INT64_MAX = tl.constexpr(2**63 - 1)


@triton.jit
def _lex_lt(a_key, a_idx, b_key, b_idx):
    """(a_key, a_idx) < (b_key, b_idx), lexicographically, elementwise."""
    return (a_key < b_key) | ((a_key == b_key) & (a_idx < b_idx))


@triton.jit
def _lex_min(key, idx):
    """The smallest (key, idx) pair of a 1-D block, as two scalars (NOTE rule 3)."""
    m_key = tl.min(key, axis=0)
    m_idx = tl.min(tl.where(key == m_key, idx, _INT64_MAX), axis=0)
    return m_key, m_idx


@triton.jit
def _merge_sorted(a_key, a_idx, b_key, b_idx, SENT: tl.constexpr, K: tl.constexpr):
    """The K smallest pairs of two ascending [K] lists, ascending.

    Real pairs are distinct (distinct slots); the rank of a pair in the union is its position
    in its own list plus the number of smaller pairs in the other one, so real pairs take
    ranks 0 .. n_real - 1 and sentinels only come after them.
    """
    r = tl.arange(0, K)
    # [K(i), K(j)]: is b_j before a_i, is a_i before b_j
    b_first = _lex_lt(b_key[None, :], b_idx[None, :], a_key[:, None], a_idx[:, None])
    a_first = _lex_lt(a_key[:, None], a_idx[:, None], b_key[None, :], b_idx[None, :])
    rank_a = r + tl.sum(b_first.to(tl.int32), axis=1)
    rank_b = r + tl.sum(a_first.to(tl.int32), axis=0)
    # [K(p), K(i)]: position p takes the pair whose rank is p
    hit_a = rank_a[None, :] == r[:, None]
    hit_b = rank_b[None, :] == r[:, None]
    key = tl.minimum(
        tl.min(tl.where(hit_a, a_key[None, :], SENT), axis=1),
        tl.min(tl.where(hit_b, b_key[None, :], SENT), axis=1),
    )
    idx = tl.minimum(
        tl.min(tl.where(hit_a, a_idx[None, :], _INT64_MAX), axis=1),
        tl.min(tl.where(hit_b, b_idx[None, :], _INT64_MAX), axis=1),
    )
    return key, idx


@triton.jit
def _merge_tile(key, idx, best_key, best_idx, SENT: tl.constexpr, K: tl.constexpr):
    """Merge a tile of pairs ([BLOCK], any order) into the sorted best list ([K] each)."""
    r = tl.arange(0, K)
    # The K-th best pair so far: only pairs below it can enter the list.
    thr_key = tl.min(tl.where(r == K - 1, best_key, SENT), axis=0)
    thr_idx = tl.min(tl.where(r == K - 1, best_idx, _INT64_MAX), axis=0)
    enters = _lex_lt(key, idx, thr_key, thr_idx)
    n_enter = tl.sum(enters.to(tl.int32), axis=0)
    if n_enter > 0:
        key = tl.where(enters, key, SENT)
        idx = tl.where(enters, idx, _INT64_MAX)
        tile_key = tl.full([K], SENT, key.dtype)
        tile_idx = tl.full([K], _INT64_MAX, tl.int64)
        # The tile's own best min(n_enter, K) pairs, one lexicographic min per round.
        # A while loop: NOTE rule 2.
        i = n_enter * 0
        rounds = tl.minimum(n_enter, K)
        while i < rounds:
            m_key, m_idx = _lex_min(key, idx)
            tile_key = tl.where(r == i, m_key, tile_key)
            tile_idx = tl.where(r == i, m_idx, tile_idx)
            taken = idx == m_idx
            key = tl.where(taken, SENT, key)
            idx = tl.where(taken, _INT64_MAX, idx)
            i += 1
        best_key, best_idx = _merge_sorted(best_key, best_idx, tile_key, tile_idx, SENT, K)
    return best_key, best_idx


@triton.jit
def _fold(key, idx, acc_key, acc_idx, best_key, best_idx, SENT: tl.constexpr, K: tl.constexpr):
    """Fold a tile of pairs into the running best: per lane (K == 1) or the sorted list."""
    if K == 1:
        better = _lex_lt(key, idx, acc_key, acc_idx)
        acc_key = tl.where(better, key, acc_key)
        acc_idx = tl.where(better, idx, acc_idx)
    else:
        best_key, best_idx = _merge_tile(key, idx, best_key, best_idx, SENT, K)
    return acc_key, acc_idx, best_key, best_idx


@triton.jit
def _best_of_tiles(
    cost_ptr,
    size_ptr,
    last_access_ptr,
    nbhd_cost_ptr,
    state_ptr,
    N,
    now,
    rand_base,
    HEURISTIC: tl.constexpr,
    KEY_DTYPE: tl.constexpr,
    SENT: tl.constexpr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Phase 1: the best K pairs of this program's tiles, [K] keys and [K] int64 slots."""
    lanes = tl.arange(0, BLOCK)
    acc_key = tl.full([BLOCK], SENT, KEY_DTYPE)
    acc_idx = tl.full([BLOCK], _INT64_MAX, tl.int64)
    best_key = tl.full([K], SENT, KEY_DTYPE)
    best_idx = tl.full([K], _INT64_MAX, tl.int64)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    while start < N:  # NOTE rule 2
        offs = start + lanes
        key, cand = _tile_keys(
            cost_ptr,
            size_ptr,
            last_access_ptr,
            nbhd_cost_ptr,
            state_ptr,
            offs,
            offs < N,
            now,
            rand_base,
            HEURISTIC,
        )
        idx = tl.where(cand, offs, _INT64_MAX)
        acc_key, acc_idx, best_key, best_idx = _fold(
            key, idx, acc_key, acc_idx, best_key, best_idx, SENT, K
        )
        start += step
    if K == 1:
        m_key, m_idx = _lex_min(acc_key, acc_idx)
        best_key = tl.full([K], m_key, KEY_DTYPE)
        best_idx = tl.full([K], m_idx, tl.int64)
    return best_key, best_idx


@triton.jit
def _best_of_partials(
    part_key_ptr,
    part_idx_ptr,
    n_part,
    KEY_DTYPE: tl.constexpr,
    SENT: tl.constexpr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Phase 2: the best K of the n_part partial pairs, read through L2 (.cg)."""
    lanes = tl.arange(0, BLOCK)
    acc_key = tl.full([BLOCK], SENT, KEY_DTYPE)
    acc_idx = tl.full([BLOCK], _INT64_MAX, tl.int64)
    best_key = tl.full([K], SENT, KEY_DTYPE)
    best_idx = tl.full([K], _INT64_MAX, tl.int64)
    start = n_part * 0  # a runtime int32 (NOTE rule 2)
    while start < n_part:
        offs = start + lanes
        m = offs < n_part
        key = tl.load(part_key_ptr + offs, mask=m, other=SENT, cache_modifier=".cg")
        idx = tl.load(part_idx_ptr + offs, mask=m, other=_INT64_MAX, cache_modifier=".cg")
        acc_key, acc_idx, best_key, best_idx = _fold(
            key, idx, acc_key, acc_idx, best_key, best_idx, SENT, K
        )
        start += BLOCK
    if K == 1:
        m_key, m_idx = _lex_min(acc_key, acc_idx)
        best_key = tl.full([K], m_key, KEY_DTYPE)
        best_idx = tl.full([K], m_idx, tl.int64)
    return best_key, best_idx


@triton.jit(do_not_specialize=["now", "rand_base"])
def _select_kernel(
    # pointers: the columns, [N] each
    cost_ptr,
    size_ptr,
    last_access_ptr,
    nbhd_cost_ptr,
    state_ptr,
    # pointers: workspace, partials [P * K] (keys: KEY_DTYPE, slots: int64), counter [1] int32
    part_key_ptr,
    part_idx_ptr,
    counter_ptr,
    # pointer: output [k] int64, slot ids best first, -1 past the last candidate
    out_ptr,
    # sizes
    N,
    k,
    # scalars
    now,
    rand_base,
    # meta-parameters
    HEURISTIC: tl.constexpr,
    KEY_DTYPE: tl.constexpr,
    SENT: tl.constexpr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)
    r = tl.arange(0, K)
    best_key, best_idx = _best_of_tiles(
        cost_ptr,
        size_ptr,
        last_access_ptr,
        nbhd_cost_ptr,
        state_ptr,
        N,
        now,
        rand_base,
        HEURISTIC,
        KEY_DTYPE,
        SENT,
        K,
        BLOCK,
    )
    tl.store(part_key_ptr + pid * K + r, best_key)
    tl.store(part_idx_ptr + pid * K + r, best_idx)

    # The last program to finish reduces all partials (NOTE rule 4).
    tl.debug_barrier()  # every thread's partial stores precede the release below
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == num_progs - 1:
        _, final_idx = _best_of_partials(
            part_key_ptr, part_idx_ptr, num_progs * K, KEY_DTYPE, SENT, K, BLOCK
        )
        tl.store(out_ptr + r, tl.where(final_idx == _INT64_MAX, -1, final_idx), mask=r < k)
        tl.atomic_xchg(counter_ptr, 0)  # ready for the next launch (NOTE rule 5)


_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _counter(device: torch.device, stream: int = 0) -> torch.Tensor:
    """The zeroed ticket counter of (``device``, raw ``stream``), [1] int32 (NOTE rule 5)."""
    counter = _COUNTERS.get((device, stream))
    if counter is None:
        counter = _COUNTERS[(device, stream)] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def _current_stream(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream (0 off CUDA): what Triton launches on."""
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _programs(device: torch.device, n_tiles: int, k_pad: int) -> int:
    if device.type != "cuda":
        # The interpreter runs programs one after another: a few suffice to exercise the
        # strided loop and the partial reduction.
        return min(n_tiles, 4)
    sms = _sm_count(device.index)
    # Registers (ptxas -v, sm_90, BLOCK 1024) allow about 7 programs per SM for k <= 16 and
    # 1 to 2 for k = 64. Timed on an H200 (benchmarks/bench_select_tiling.py; rows in
    # benchmarks/results/select_tiling_nvidia-h200.csv): k = 1 runs fastest at 8 programs
    # per SM once each has 2 tiles or more (2^24 slots: 104 against 113 us at 4), and at 4
    # below that (1e6: 10.2 against 11.3 us at one tile each); k = 8 at 4 (2^24: 159 us; 8
    # took 190).
    if k_pad == 1 and n_tiles >= 2 * 8 * sms:
        return sms * 8
    return min(n_tiles, sms * (4 if k_pad <= 16 else 2))


def _int_types(*values: int) -> tuple[int, ...]:
    """The type Triton gives each unspecialised int argument: 0 for i32, 1 for i64, 2 for
    u64 (NOTE rule 7)."""
    return tuple(0 if -(2**31) <= v < 2**31 else 1 if v < 2**63 else 2 for v in values)


class Selection:
    """One selection over fixed columns, prepared once and launched per decision.

    ``Selection(name, cols, k=k)(now, rand_base)`` returns what :func:`select` returns for the
    same arguments, without validating the columns or allocating a buffer again (NOTE [
    One-launch selection ] rule 7). The result is this selection's own [k] int64 device
    buffer, overwritten by its next call; :meth:`victims` reads it to the host instead. Its
    workspace is made on the current stream and is used by one stream at a time: make and
    call it on the stream that owns the columns' updates (a CUDA table's private one).

    Args:
        name: a built-in heuristic (:data:`HEURISTIC_IDS`).
        cols: ``(cost, size, last_access, nbhd_cost, state)``, as for :func:`score`. The
            selection reads them at every call: their values may change, their storage not.
        k: victims per decision, >= 1.
        block, programs: the tiling, as for :func:`select`.
    """

    __slots__ = (
        "_args",
        "_consts",
        "_counters",
        "_grid",
        "_meta",
        "_out_ptr",
        "_ptrs",
        "_runners",
        "cols",
        "device",
        "k",
        "n",
        "name",
        "out",
    )

    def __init__(
        self,
        name: str,
        cols: tuple[torch.Tensor, ...],
        *,
        k: int,
        block: int | None = None,
        programs: int | None = None,
    ) -> None:
        cols = tuple(cols)
        self.n = check_columns(name, cols, 0, 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.name, self.cols, self.k = name, cols, k
        self.device = device = cols[0].device
        # the kernel writes all k entries, as the sorting path does; none for no slots
        self.out = torch.empty(k, dtype=torch.int64, device=device)
        if self.n == 0:
            self.out.fill_(-1)
        self._runners: dict[tuple, object] = {}
        self._counters: dict[int, tuple[torch.Tensor, int]] = {}  # stream -> (counter, address)
        if self.n == 0 or k > MAX_K:
            return
        k_pad = triton.next_power_of_2(k)
        block = block or _block(self.n, device)
        if block & (block - 1) or block < 16:
            raise ValueError(f"block must be a power of two >= 16, got {block}")
        n_tiles = triton.cdiv(self.n, block)
        if programs is not None and (not isinstance(programs, int) or programs < 1):
            raise ValueError(f"programs must be a positive int, got {programs!r}")
        p = programs or _programs(device, n_tiles, k_pad)
        dtype = key_dtype(name)
        part_key = torch.empty(p * k_pad, dtype=dtype, device=device)
        part_idx = torch.empty(p * k_pad, dtype=torch.int64, device=device)
        self._grid = (p, 1, 1)
        self._args = (*cols, part_key, part_idx)
        self._ptrs = tuple(t.data_ptr() for t in self._args)  # for the direct launch (rule 7)
        self._out_ptr = self.out.data_ptr()
        self._meta = dict(
            HEURISTIC=HEURISTIC_IDS[name],
            KEY_DTYPE=tl.int64 if dtype == torch.int64 else tl.float32,
            SENT=2**63 - 1 if dtype == torch.int64 else float("inf"),
            K=k_pad,
            BLOCK=block,
        )
        self._consts = tuple(self._meta.values())  # the constexprs, in signature order

    def __call__(self, now: int, rand_base: int) -> torch.Tensor:
        """The k best candidate slots, [k] int64 on the device, best first, -1 padded."""
        if not isinstance(now, int) or isinstance(now, bool):
            raise ValueError(f"now must be a Python int, got {now!r}")
        if not isinstance(rand_base, int) or isinstance(rand_base, bool):
            raise ValueError(f"rand_base must be a Python int, got {rand_base!r}")
        if not 0 <= rand_base < 2**32:
            raise ValueError(f"rand_base must lie in [0, 2**32), got {rand_base}")
        if self.n == 0:
            return self.out
        if self.k > MAX_K:
            self.out.copy_(_select_by_sorting(self.name, self.cols, now, rand_base, self.k))
            return self.out
        device = self.device
        stream = _current_stream(device)
        counter = self._counters.get(stream)
        if counter is None:
            c = _counter(device, stream)
            counter = self._counters[stream] = (c, c.data_ptr())
        types = _int_types(now, rand_base)
        run = self._runners.get(types)
        try:
            if run is not None and torch.cuda.current_device() == device.index:
                # NOTE rule 7: addresses, not tensors (the launcher then asks the driver
                # nothing), every argument in signature order
                run(*self._ptrs, counter[1], self._out_ptr, self.n, self.k, now, rand_base,
                    *self._consts, stream=stream)  # fmt: skip
                return self.out
            with _guard(device):  # the launch goes to the tensors' device (and its stream)
                compiled = _select_kernel[self._grid[:1]](
                    *self._args,
                    counter[0],
                    self.out,
                    self.n,
                    self.k,
                    now,
                    rand_base,
                    **self._meta,
                    num_warps=4 if self._meta["K"] <= 16 else 8,
                    enable_fp_fusion=False,
                )
        except BaseException:
            counter[0].zero_()  # a failed launch must not leave a stale ticket behind
            raise
        if device.type == "cuda" and hasattr(compiled, "run") and hasattr(compiled, "function"):
            self._runners[types] = compiled[self._grid]
        return self.out

    def victims(self, now: int, rand_base: int) -> list[int]:
        """:meth:`__call__` read to the host: the ``min(k, #candidates)`` slots, best first.

        One read, waiting for the current stream only (``tolist`` copies on it and
        synchronises it)."""
        ids = self(now, rand_base).tolist()
        return ids[: ids.index(-1)] if -1 in ids else ids


def _guard(device: torch.device):
    """The device guard of ``device`` for a launch (a no-op off CUDA)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def select(
    name: str,
    cost: torch.Tensor,
    size: torch.Tensor,
    last_access: torch.Tensor,
    nbhd_cost: torch.Tensor,
    state: torch.Tensor,
    *,
    now: int,
    rand_base: int,
    k: int,
    block: int | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """The k lowest-scoring candidate slots, [k] int64 on the input device, best first.

    Args as :func:`score`, plus ``k`` >= 1. Ordered by (score, slot id); padded with -1 when
    there are fewer than k candidates. One launch for k <= MAX_K (NOTE [ One-launch
    selection ]). ``block`` (a power of two) and ``programs`` override the tiling, for tests.
    A caller deciding repeatedly over the same columns prepares a :class:`Selection` once.
    """
    sel = Selection(
        name, (cost, size, last_access, nbhd_cost, state), k=k, block=block, programs=programs
    )
    return sel(now, rand_base)


def _select_by_sorting(name, cols, now, rand_base, k):
    """k > MAX_K: all scores, then ordered by (score, non-candidate, slot) with stable sorts."""
    out = torch.full((k,), -1, dtype=torch.int64, device=cols[0].device)
    key = score_all(name, *cols, now=now, rand_base=rand_base)
    other = (cols[4] != 1).to(torch.int8)
    by_cand = torch.sort(other, stable=True).indices  # candidates first, ascending slots
    order = by_cand[torch.sort(key[by_cand], stable=True).indices]
    m = min(out.numel(), order.numel())
    ids = order[:m]
    out[:m] = torch.where(other[ids] == 0, ids, -1)
    return out
