"""The Triton kernels against their torch twins (tritondtr.policy.scoring), the specification.

Victim ids must be equal (``torch.equal``), -1 padding included; scores must be bit-equal
(the kernels reproduce NOTE [ Scoring rules ] operation by operation). On CPU the kernels run
under TRITON_INTERPRET=1 (tests/conftest.py); the ``gpu`` tests run the compiled kernels.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import torch

from tritondtr import kernels
from tritondtr.engine.table import MetadataTable, SlotState
from tritondtr.policy.heuristics import Heuristic
from tritondtr.policy.scoring import random_base, score_torch, select_torch

# Division by zero and inf/inf are part of the inputs; numpy (the interpreter) warns on them.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")

HEURISTICS = [h.value for h in Heuristic]
SEED = 7
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"
# Clocks on both sides of 2**31: the kernels get `now` as an int32 or an int64 argument.
NOW = {1: 5, 127: 1000, 1000: 2**31 + 5, 4097: 2**33 + 7, 70000: 12345, 10**6: 2**40}
ROOT = pathlib.Path(__file__).resolve().parents[2]


def columns(n: int, kind: str = "mixed", device: str = DEVICE, seed: int = 0) -> dict:
    """Metadata columns [n] with ties, NaN and inf costs, zero and negative staleness, zero
    and huge sizes. ``kind``: ``mixed`` (~25 % candidates), ``none`` (nothing evictable),
    ``few`` (3 candidates)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{n}-{kind}-{seed}".encode()))
    now = NOW.get(n, 1000)

    def u():
        return torch.rand(n, generator=g)

    def ri(lo, hi):
        return torch.randint(lo, hi, (n,), generator=g)

    cost = torch.where(u() < 0.5, ri(0, 4).float(), u() * 100)  # half of them tie
    cost[u() < 0.03] = float("nan")
    cost[u() < 0.03] = float("inf")
    size = torch.where(u() < 0.5, ri(0, 4), ri(1, 2**40))  # 0 gives +inf scores
    last = now - ri(0, 4)  # 0: zero staleness
    last = torch.where(u() < 0.03, last + 2, last)  # last_access after now: s < 0
    last = torch.where(u() < 0.03, last - 2**40, last)
    nbhd = ri(0, 3).float()
    nbhd[u() < 0.03] = float("nan")
    if kind == "mixed":
        state = ri(0, 4)
    elif kind == "none":
        state = torch.tensor([0, 2, 3])[ri(0, 3)]
    else:
        state = torch.zeros(n, dtype=torch.int64)
        state[torch.randperm(n, generator=g)[:3]] = 1
    cols = dict(cost=cost, size=size, last_access=last, nbhd_cost=nbhd, state=state.to(torch.int8))
    return {"now": now, "cols": {c: t.to(device) for c, t in cols.items()}}


def args(cols: dict) -> list:
    return [cols[c] for c in MetadataTable.COLUMNS]


def expected_ids(h: str, data: dict, k: int) -> torch.Tensor:
    ids = select_torch(Heuristic(h), *args(data["cols"]), data["now"], k, SEED)
    out = torch.full((k,), -1, dtype=torch.int64)
    out[: ids.numel()] = ids.cpu()
    return out


def kernel_ids(h: str, data: dict, k: int, **tiling) -> torch.Tensor:
    now = data["now"]
    ids = kernels.select(
        h, *args(data["cols"]), now=now, rand_base=random_base(SEED, now), k=k, **tiling
    )
    assert ids.dtype == torch.int64 and ids.shape == (k,)
    assert ids.device == data["cols"]["cost"].device
    return ids.cpu()


def check_select(h: str, data: dict, k: int, **tiling) -> None:
    expected = expected_ids(h, data, k)
    got = kernel_ids(h, data, k, **tiling)
    assert torch.equal(got, expected), f"kernel {got.tolist()} != twin {expected.tolist()}"


CASES = [(n, h, k) for n in (1, 127, 1000, 4097) for h in HEURISTICS for k in (1, 5, 64)]
# The interpreter is slow: the largest size runs k = 1 and one top-k per heuristic.
CASES += [(70000, h, k) for h in HEURISTICS for k in (1, 64)]


@pytest.mark.parametrize(("n", "h", "k"), CASES, ids=[f"N{n}-{h}-k{k}" for n, h, k in CASES])
def test_select_matches_twin(n, h, k):
    check_select(h, columns(n), k)


@pytest.mark.parametrize("n", [1, 127, 1000, 4097, 70000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("h", HEURISTICS)
def test_score_matches_twin_bitwise(n, h):
    data = columns(n)
    now = data["now"]
    got = kernels.score(h, *args(data["cols"]), now=now, rand_base=random_base(SEED, now))
    want = score_torch(Heuristic(h), *args(data["cols"]), now, SEED)
    assert got.dtype == want.dtype == Heuristic(h).score_dtype
    assert torch.equal(got, want)  # also: the same +inf positions, no NaN left


@pytest.mark.parametrize("n", [1, 1000], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("h", HEURISTICS)
def test_nothing_evictable_gives_all_minus_one(n, h):
    data = columns(n, "none")
    assert torch.equal(kernel_ids(h, data, 5), torch.full((5,), -1))


@pytest.mark.parametrize("h", HEURISTICS)
@pytest.mark.parametrize("k", [5, 64, 200], ids=lambda k: f"k{k}")
def test_k_larger_than_candidates_pads_with_minus_one(h, k):
    # k = 200 > MAX_K takes the sorting path of the launcher.
    data = columns(1000, "few")
    got = kernel_ids(h, data, k)
    assert (got[3:] == -1).all() and (got[:3] >= 0).all()
    assert torch.equal(got, expected_ids(h, data, k))


@pytest.mark.parametrize("h", HEURISTICS)
def test_k_above_max_k_matches_twin(h):
    check_select(h, columns(1000), kernels.MAX_K + 72)


TILINGS = [(h, k) for h in ("dtr", "lru", "random") for k in (1, 5, 64)]


@pytest.mark.parametrize(("h", "k"), TILINGS, ids=[f"N4097-{h}-k{k}" for h, k in TILINGS])
def test_many_tiles_per_program(h, k):
    # 33 tiles over 3 programs: the strided loop, and (k = 64) partials that need two chunks.
    check_select(h, columns(4097), k, block=128, programs=3)


@pytest.mark.parametrize("k", [1, 5, 64], ids=lambda k: f"k{k}")
def test_every_tile_improves_the_list(k):
    # Worst case of the threshold filter: each tile beats the whole list so far.
    n = 640
    data = {
        "now": 10**6,
        "cols": dict(
            cost=torch.ones(n),
            size=torch.ones(n, dtype=torch.int64),
            last_access=torch.arange(n, 0, -1),
            nbhd_cost=torch.zeros(n),
            state=torch.ones(n, dtype=torch.int8),
        ),
    }
    data["cols"] = {c: t.to(DEVICE) for c, t in data["cols"].items()}
    for h in ("lru", "dtr"):
        check_select(h, data, k, block=64, programs=2)


@pytest.mark.parametrize("k", [1, 5, 64], ids=lambda k: f"k{k}")
def test_all_scores_tie_lowest_slots_win(k):
    n = 1000
    state = torch.zeros(n, dtype=torch.int8)
    state[100:] = 1
    cols = dict(
        cost=torch.ones(n),
        size=torch.ones(n, dtype=torch.int64),
        last_access=torch.zeros(n, dtype=torch.int64),
        nbhd_cost=torch.zeros(n),
        state=state,
    )
    data = {"now": 3, "cols": {c: t.to(DEVICE) for c, t in cols.items()}}
    for h in ("dtr", "msps", "lru", "size"):
        assert torch.equal(kernel_ids(h, data, k), torch.arange(100, 100 + k))


@pytest.mark.parametrize("k", [1, 5], ids=lambda k: f"k{k}")
def test_inf_scored_candidate_beats_non_candidates(k):
    # Every candidate scores +inf (size 0), every lower slot is a non-candidate.
    n = 300
    state = torch.zeros(n, dtype=torch.int8)
    state[250::7] = 1
    cols = dict(
        cost=torch.ones(n),
        size=torch.zeros(n, dtype=torch.int64),
        last_access=torch.zeros(n, dtype=torch.int64),
        nbhd_cost=torch.zeros(n),
        state=state,
    )
    data = {"now": 3, "cols": {c: t.to(DEVICE) for c, t in cols.items()}}
    for h in ("dtr", "dtr_local", "msps"):
        assert torch.equal(kernel_ids(h, data, k), torch.arange(250, 300, 7)[:k])


def test_counter_is_reset_after_each_launch():
    check_select("dtr", columns(4097), 5, block=128, programs=3)
    from tritondtr.kernels.topk_select import _COUNTERS

    assert _COUNTERS and all(int(c.item()) == 0 for c in _COUNTERS.values())


def test_empty_columns():
    cols = columns(0)["cols"]
    assert kernels.score("dtr", *args(cols), now=1, rand_base=0).shape == (0,)
    assert torch.equal(
        kernels.select("dtr", *args(cols), now=1, rand_base=0, k=2).cpu(), torch.full((2,), -1)
    )


# ------------------------------------------------------------------- prepared selection
SELECTION_CASES = [(1000, "dtr", 1), (4097, "msps", 5), (127, "lru", 64), (127, "size", 65)]


@pytest.mark.parametrize(("n", "h", "k"), SELECTION_CASES, ids=lambda v: str(v))
def test_selection_matches_select_and_follows_the_columns(n, h, k):
    data = columns(n)
    cols = args(data["cols"])
    sel = kernels.Selection(h, cols, k=k)
    for round_ in range(3):
        now = data["now"] + round_
        got = sel(now, random_base(SEED, now)).cpu()
        fresh = kernels.select(h, *cols, now=now, rand_base=random_base(SEED, now), k=k).cpu()
        assert torch.equal(got, fresh)
        assert torch.equal(got[: min(k, 64)], expected_ids(h, {**data, "now": now}, k)[:64])
        want = [i for i in got.tolist() if i >= 0]
        assert sel.victims(now, random_base(SEED, now)) == want
        # the columns change in place between decisions; the selection reads them anew
        data["cols"]["state"][got[0]] = 0 if got[0] >= 0 else 1


def test_selection_of_empty_columns_and_no_candidates():
    empty = kernels.Selection("dtr", args(columns(0)["cols"]), k=3)
    assert empty(1, 0).tolist() == [-1, -1, -1] and empty.victims(1, 0) == []
    none = columns(127, kind="none")
    sel = kernels.Selection("dtr", args(none["cols"]), k=2)
    assert sel.victims(none["now"], 0) == []


def test_selection_direct_launch_passes_the_kernel_its_arguments_in_order(monkeypatch):
    """NOTE [ One-launch selection ] rule 7: the direct call of the compiled kernel (CUDA
    only) gets every argument in the kernel's signature order, constexprs included. Here a
    stand-in for the compiled kernel launches the interpreted one with those positional
    arguments, which binds them by position: a wrong order fails."""
    from tritondtr.kernels import topk_select

    data = columns(4097)
    cols = args(data["cols"])
    sel = kernels.Selection("dtr", cols, k=5, block=128, programs=3)
    now = data["now"]
    calls = []

    tensors = {t.data_ptr(): t for t in (*sel._args, sel.out, *topk_select._COUNTERS.values())}

    def direct(*a, stream):
        calls.append(stream)
        assert all(isinstance(x, int) for x in a[:9]), "pointers go as addresses"
        a = [tensors[x] for x in a[:9]] + list(a[9:])
        topk_select._select_kernel[sel._grid[:1]](*a, num_warps=4, enable_fp_fusion=False)

    key = topk_select._int_types(now, random_base(SEED, now))
    sel(now, random_base(SEED, now))  # through the JIT first (on CPU it keeps no kernel)
    assert not sel._runners
    tensors.update({c.data_ptr(): c for c in topk_select._COUNTERS.values()})
    sel._runners[key] = direct
    sel.out.fill_(-7)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: sel.device.index)
    got = sel(now, random_base(SEED, now)).cpu()
    assert calls == [0], "the prepared launch was not taken"
    assert torch.equal(got, expected_ids("dtr", data, 5))
    assert len(topk_select._select_kernel.arg_names) == 9 + 4 + len(sel._consts)


def test_selection_keeps_one_kernel_per_integer_type():
    from tritondtr.kernels.topk_select import _int_types

    assert _int_types(5, 2**31 - 1, -(2**31)) == (0, 0, 0)
    assert _int_types(2**31, -(2**31) - 1, 2**63 - 1) == (1, 1, 1)
    assert _int_types(2**63) == (2,)


@pytest.mark.parametrize(
    ("now", "rand_base", "match"),
    [(1.5, 0, "now must be a Python int"), (1, -1, "rand_base must lie"), (1, True, "Python int")],
)
def test_selection_rejects_bad_clocks(now, rand_base, match):
    sel = kernels.Selection("dtr", args(columns(127)["cols"]), k=1)
    with pytest.raises(ValueError, match=match):
        sel(now, rand_base)


# ------------------------------------------------------------------------ launcher errors
def _bad(**change):
    cols = dict(columns(127)["cols"])
    cols.update(change)
    return args(cols)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            dict(cost=lambda d: torch.zeros(127, dtype=torch.float64, device=d)),
            "cost must be torch.float32",
        ),
        (
            dict(state=lambda d: torch.zeros(127, dtype=torch.int32, device=d)),
            "state must be torch.int8",
        ),
        (
            dict(size=lambda d: torch.zeros(126, dtype=torch.int64, device=d)),
            "size has 126 slots but cost has 127",
        ),
        (
            dict(last_access=lambda d: torch.zeros(254, dtype=torch.int64, device=d)[::2]),
            "must be contiguous",
        ),
        (dict(nbhd_cost=lambda d: torch.zeros(1, 127, device=d)), "must be 1-D"),
        (dict(cost=lambda d: np.zeros(127, np.float32)), "must be a torch.Tensor"),
    ],
    ids=["dtype-cost", "dtype-state", "length", "contiguity", "dim", "numpy"],
)
def test_launcher_rejects_bad_columns(change, match):
    cols = _bad(**{c: make(DEVICE) for c, make in change.items()})
    with pytest.raises(ValueError, match=match):
        kernels.select("dtr", *cols, now=1, rand_base=0, k=1)
    with pytest.raises(ValueError, match=match):
        kernels.score("dtr", *cols, now=1, rand_base=0)


def test_launcher_rejects_bad_scalars():
    cols = _bad()
    with pytest.raises(ValueError, match="no Triton kernel for heuristic 'dtrr'"):
        kernels.select("dtrr", *cols, now=1, rand_base=0, k=1)
    with pytest.raises(ValueError, match="k must be a positive int"):
        kernels.select("dtr", *cols, now=1, rand_base=0, k=0)
    with pytest.raises(ValueError, match="rand_base must lie in"):
        kernels.score("random", *cols, now=1, rand_base=2**32)
    with pytest.raises(ValueError, match="now must be a Python int"):
        kernels.score("dtr", *cols, now=1.5, rand_base=0)
    with pytest.raises(ValueError, match="block must be a power of two"):
        kernels.select("dtr", *cols, now=1, rand_base=0, k=1, block=100)


# --------------------------------------------------------------------- through the table
@pytest.mark.parametrize("h", HEURISTICS)
def test_table_triton_backend_equals_torch(h):
    rng = np.random.default_rng(zlib.crc32(h.encode()))
    table = MetadataTable(64, device=DEVICE)
    n = 3000
    slots = table.add_many(
        rng.integers(0, 5, n).astype(np.float32),
        rng.integers(1, 8, n),
        rng.integers(0, 50, n),
        nbhd_cost=rng.integers(0, 3, n),
    )
    table.free_many(rng.choice(slots, 500, replace=False))
    live = np.flatnonzero(table.host_state != SlotState.FREE)
    table.update_many(rng.choice(live, 800, replace=False), state=SlotState.EVICTED)
    table.update_many(rng.choice(live, 300, replace=False), state=SlotState.RESIDENT_LOCKED)
    for k in (1, 5, 64):
        got = table.select(h, 60, k, backend="triton", seed=3)
        assert torch.equal(got, table.select(h, 60, k, backend="torch", seed=3))
    assert torch.equal(
        table.score(h, 60, backend="triton", seed=3), table.score(h, 60, backend="torch", seed=3)
    )


# ------------------------------------------------------------------------ import direction
@pytest.mark.parametrize("path", sorted((ROOT / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_kernels_import_only_torch_and_triton(path):
    allowed = {"__future__", "contextlib", "functools", "os", "torch", "triton"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:  # relative: kernels itself
            names = [node.module]
        else:
            continue
        for name in names:
            assert not name.startswith("tritondtr"), f"{path.name} imports {name}"
            assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


# -------------------------------------------------------------------------- compiled, CUDA
# The interpreter accepts code that the compiler rejects (it once missed a non-constexpr
# global): compile for sm_90 ahead of time, which needs triton's bundled ptxas but no GPU.
_AOT = textwrap.dedent("""
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from tritondtr.kernels.heuristic_scores import _score_kernel
    from tritondtr.kernels.topk_select import _select_kernel
    cols = dict(cost_ptr="*fp32", size_ptr="*i64", last_access_ptr="*i64",
                nbhd_cost_ptr="*fp32", state_ptr="*i8")
    scalars = dict(now="i64", rand_base="i64")
    target = GPUTarget("cuda", 90, 32)
    def ptx(fn, sig, const, warps):
        src = ASTSource(fn, {**sig, **{c: "constexpr" for c in const}}, const)
        opts = dict(num_warps=warps, enable_fp_fusion=False)
        return triton.compile(src, target=target, options=opts).asm["ptx"]
    p = ptx(_score_kernel, dict(cols, out_ptr="*fp32", N="i32", **scalars),
            dict(HEURISTIC=0, BLOCK=1024), 4)
    assert "div.rn.f32" in p and "fma.rn.f32" not in p, "score: not an IEEE division alone"
    for h, key, k in ((0, "fp32", 1), (3, "i64", 64), (5, "fp32", 8)):
        sig = dict(cols, part_key_ptr="*" + key, part_idx_ptr="*i64", counter_ptr="*i32",
                   out_ptr="*i64", N="i32", k="i32", **scalars)
        fp = key == "fp32"
        const = dict(HEURISTIC=h, KEY_DTYPE=tl.float32 if fp else tl.int64,
                     SENT=float("inf") if fp else 2**63 - 1, K=k, BLOCK=1024)
        p = ptx(_select_kernel, sig, const, 4 if k <= 16 else 8)
        assert "atom.global.gpu.acq_rel.add" in p and "ld.global.cg" in p, "select: ordering"
    print("compiled")
""")


def test_kernels_compile_for_sm90_without_a_gpu():
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this triton has no ahead-of-time compile API")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run(
        [sys.executable, "-c", _AOT], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


GPU_CASES = [(h, k) for h in HEURISTICS for k in (1, 5, 64)]


@pytest.mark.gpu
@pytest.mark.skipif(
    INTERPRETED and torch.cuda.is_available(),
    reason="the interpreter is on: run `TRITON_INTERPRET=0 pytest -m gpu` for the compiled kernels",
)
@pytest.mark.parametrize(("h", "k"), GPU_CASES, ids=[f"N1e6-{h}-k{k}" for h, k in GPU_CASES])
def test_gpu_select_and_score_match_twin(h, k):
    data = columns(10**6, device="cuda")
    check_select(h, data, k)
    now = data["now"]
    got = kernels.score(h, *args(data["cols"]), now=now, rand_base=random_base(SEED, now))
    assert torch.equal(got, score_torch(Heuristic(h), *args(data["cols"]), now, SEED))


@pytest.mark.gpu
@pytest.mark.skipif(
    INTERPRETED and torch.cuda.is_available(),
    reason="the interpreter is on: run `TRITON_INTERPRET=0 pytest -m gpu` for the compiled kernels",
)
@pytest.mark.parametrize("k", [1, 8])
def test_gpu_prepared_selection_launches_its_compiled_kernel_directly(k):
    """NOTE [ One-launch selection ] rule 7 on the device: after each integer type's first
    launch the selection calls the compiled kernel itself; every call equals the twin, as
    the columns change between calls."""
    data = columns(70000, device="cuda")
    sel = kernels.Selection("dtr", args(data["cols"]), k=k)
    nows = (5, 2**31 + 5, 2**40, 7)
    for now in nows:
        for _ in range(3):
            d = {**data, "now": now}
            got = sel(now, random_base(SEED, now)).cpu()
            assert torch.equal(got, expected_ids("dtr", d, k))
            assert sel.victims(now, random_base(SEED, now)) == [i for i in got.tolist() if i >= 0]
            data["cols"]["state"][got[0]] = 0  # the best one leaves the candidates
    from tritondtr.kernels.topk_select import _int_types

    assert len(sel._runners) == len({_int_types(t, random_base(SEED, t)) for t in nows}) > 1


def test_programs_per_sm_as_timed_on_an_h200(monkeypatch):
    """The CUDA grid rule (``_programs``, timed by benchmarks/bench_select_tiling.py): k = 1
    takes 8 programs per SM once each gets 2 tiles, else 4; k <= 16 takes 4; larger k 2."""
    from tritondtr.kernels import topk_select

    monkeypatch.setattr(topk_select, "_sm_count", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert topk_select._programs(cuda, 16384, 1) == 1056  # 2^24 slots in tiles of 1024
    assert topk_select._programs(cuda, 2112, 1) == 1056
    assert topk_select._programs(cuda, 2111, 1) == 528
    assert topk_select._programs(cuda, 977, 1) == 528  # 1e6 slots
    assert topk_select._programs(cuda, 300, 1) == 300
    assert topk_select._programs(cuda, 16384, 8) == 528
    assert topk_select._programs(cuda, 16384, 64) == 264
    assert topk_select._programs(torch.device("cpu"), 16384, 1) == 4
