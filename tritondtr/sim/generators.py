"""Synthetic traces, generated with numpy straight into the columnar :class:`Trace` arrays.

Four families, each with a knob for its resident set (the storages live at once in the
baseline, hence the eviction candidates of a budgeted run):

==================  ==========================================  ========================
generator           graph                                       resident set
==================  ==========================================  ========================
``chain``           uniform chain, forward then backward        ~ n (``backward=False``: 2)
                    (Theorem 3.1's N-layer linear network)
``random_dag``      each op reads its predecessor and random    ``live`` + 1
                    tensors of the last ``live`` ops
``branching``       blocks of ``width`` parallel branches of    ``width`` + 2
                    ``depth`` ops, joined by one op
``transformer``     pre-norm transformer layers, forward and    ~ 11 x ``layers`` + the
                    backward, weights as constants              weight gradients
==================  ==========================================  ========================

No per-op Python objects: 10M tensors take seconds (benchmarks/bench_sim_generators.py).

# NOTE [ Generated traces ]
# 1. Every op has fresh outputs (no views); constants come first, then the ops.
#    ``meta["name"]`` names the generator and its arguments; ``meta["resident"]`` is the
#    expected number of storages live at once in the baseline, constants included.
# 2. A tensor is released right after its last use (right after its creation when nothing
#    uses it), except outputs, which stay referenced and are listed by ``output`` events at
#    the end, and constants, which are never released. ``random_dag`` instead holds every
#    tensor for exactly ``live`` ops, so that its resident set is exact.
# 3. Sizes are bytes and costs ns; ``chain`` uses 1 and 1 (Theorem 3.1's unit model).
"""

from __future__ import annotations

import numpy as np

from ..traceformat.trace import EventKind, Trace

__all__ = ["branching", "chain", "random_dag", "transformer"]


class _Ops:
    """Ops appended in emission order as numpy segments (one output list per op)."""

    def __init__(self) -> None:
        self.segments: list[tuple] = []
        self.names: dict[str, int] = {}
        self.num_ops = 0
        self.num_tensors = 0

    def add(
        self,
        name: str | np.ndarray,
        cost,
        n_in: np.ndarray,
        inputs: np.ndarray,
        n_out: np.ndarray,
        size: np.ndarray,
        const: bool = False,
    ) -> np.ndarray:
        """Append k ops: ``n_in`` [k], ``inputs`` [sum n_in] tensor ids, ``n_out`` [k],
        ``size`` [sum n_out] bytes; ``name`` a string or [k] name ids. Returns the [sum n_out]
        ids of the new tensors."""
        k = n_in.shape[0]
        if isinstance(name, str):
            name = np.full(k, self.names.setdefault(name, len(self.names)), dtype=np.int32)
        cost = np.broadcast_to(np.asarray(cost, dtype=np.float64), (k,))
        self.segments.append((cost, name, n_in, inputs, n_out, size, const))
        ids = np.arange(self.num_tensors, self.num_tensors + size.shape[0], dtype=np.int64)
        self.num_ops += k
        self.num_tensors += size.shape[0]
        return ids

    def name_id(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))


def _const(ops: _Ops, sizes: np.ndarray, name: str) -> np.ndarray:
    k = sizes.shape[0]
    one = np.ones(k, dtype=np.int64)
    return ops.add(
        name,
        0.0,
        np.zeros(k, np.int64),
        np.zeros(0, np.int64),
        one,
        sizes.astype(np.int64),
        const=True,
    )


def _finish(
    ops: _Ops, outputs: np.ndarray, meta: dict, release_after: np.ndarray | None = None
) -> Trace:
    """Concatenate the segments and add release and output events (NOTE [ Generated traces ])."""
    cost, name, n_in, inputs, n_out, size, const = ([s[i] for s in ops.segments] for i in range(7))
    is_const = np.concatenate([np.full(c.shape[0], f) for c, f in zip(cost, const)])
    cost, name = np.concatenate(cost), np.concatenate(name)
    n_in, inputs = np.concatenate(n_in), np.concatenate(inputs)
    n_out, size = np.concatenate(n_out), np.concatenate(size)
    n_ops, n_t = cost.shape[0], size.shape[0]
    op_of = np.repeat(np.arange(n_ops, dtype=np.int64), n_out)
    if release_after is None:
        release_after = op_of.copy()
        np.maximum.at(release_after, inputs, np.repeat(np.arange(n_ops, dtype=np.int64), n_in))
    keep = is_const[op_of]
    keep[outputs] = True
    rel = np.flatnonzero(~keep)
    # Event order: op o at key 2o, the releases after it at 2o + 1, outputs last.
    key = np.concatenate(
        [
            2 * np.arange(n_ops, dtype=np.int64),
            2 * release_after[rel] + 1,
            np.full(outputs.shape[0], 2 * n_ops, dtype=np.int64),
        ]
    )
    kind = np.concatenate(
        [
            np.where(is_const, np.int8(EventKind.CONSTANT), np.int8(EventKind.CALL)),
            np.full(rel.shape[0], int(EventKind.RELEASE), dtype=np.int8),
            np.full(outputs.shape[0], int(EventKind.OUTPUT), dtype=np.int8),
        ]
    )
    arg = np.concatenate([np.arange(n_ops, dtype=np.int64), rel, outputs.astype(np.int64)])
    order = np.argsort(key, kind="stable")
    ptr = lambda counts: np.concatenate([[0], np.cumsum(counts)])
    return Trace(
        kind=kind[order],
        arg=arg[order],
        op_cost=cost,
        op_name=name,
        in_ptr=ptr(n_in),
        inputs=inputs,
        out_ptr=ptr(n_out),
        size=size,
        alias=np.full(n_t, -1, dtype=np.int32),
        names=list(ops.names),
        meta=meta,
    )


def _positive(**kwargs) -> None:
    for k, v in kwargs.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} must be a positive int, got {v!r}")


def chain(n: int, *, backward: bool = True, size: int = 1, cost: float = 1.0) -> Trace:
    """The uniform chain of Theorem 3.1 (an ``n``-layer linear network).

    a_0 is a constant; f_i: a_{i-1} -> a_i for i = 1..n; then loss: a_n -> g_n and
    b_i: (g_i, a_{i-1}) -> g_{i-1} for i = n..1; g_0 is the output. Every tensor has ``size``
    bytes and every op costs ``cost``; the baseline holds all n + 1 activations at the turn
    (peak n + 2 units). ``backward=False`` stops after f_n (output a_n; peak 3 units).
    Tensor ids: a_i = i, g_i = 2n + 1 - i. 2n + 2 tensors (n + 1 without backward).
    """
    _positive(n=n, size=size)
    ops = _Ops()
    _const(ops, np.full(1, size), "input")
    one = np.ones(n, dtype=np.int64)
    a = ops.add("f", cost, one, np.arange(n, dtype=np.int64), one, np.full(n, size))
    if not backward:
        outputs = a[-1:]
        resident = min(n, 2) + 1
    else:
        (g_n,) = ops.add(
            "loss", cost, np.ones(1, np.int64), a[-1:], np.ones(1, np.int64), np.full(1, size)
        )
        # b_i for i = n..1 reads g_i (the previous output) and a_{i-1}.
        g_in = g_n + np.arange(n, dtype=np.int64)
        a_in = np.arange(n - 1, -1, -1, dtype=np.int64)
        g = ops.add(
            "b", cost, 2 * one, np.stack([g_in, a_in], axis=1).ravel(), one, np.full(n, size)
        )
        outputs = g[-1:]
        resident = n + 2
    meta = {
        "name": f"chain(n={n}{'' if backward else ', backward=False'})",
        "generator": "chain",
        "n": n,
        "resident": resident,
    }
    return _finish(ops, outputs, meta)


def random_dag(
    n: int,
    *,
    live: int = 64,
    fan_in: int = 2,
    seed: int = 0,
    size: int | tuple[int, int] = 1,
    cost: float | tuple[float, float] = 1.0,
) -> Trace:
    """A random DAG of ``n`` ops with an exact resident set of ``live`` + 1 storages.

    Op i (output tensor i; tensor 0 is a constant input) reads tensor i - 1 and
    ``fan_in - 1`` tensors drawn uniformly from the ``live`` before it; every tensor is
    released ``live`` ops after its creation (NOTE [ Generated traces ] 2), so that the
    baseline holds exactly min(i, live) + 1 storages after op i. ``size`` and ``cost`` are
    fixed, or ``(low, high)`` for uniform draws (sizes integers, inclusive). Seeded.
    """
    _positive(n=n, live=live, fan_in=fan_in)
    rng = np.random.default_rng(seed)
    ops = _Ops()
    _const(ops, np.full(1, size if np.isscalar(size) else size[1]), "input")
    i = np.arange(1, n + 1, dtype=np.int64)
    window = np.minimum(i, live)
    ins = np.empty((n, fan_in), dtype=np.int64)
    ins[:, 0] = i - 1
    if fan_in > 1:
        ins[:, 1:] = (
            i[:, None] - 1 - (rng.random((n, fan_in - 1)) * window[:, None]).astype(np.int64)
        )
    sizes = (
        np.full(n, size, dtype=np.int64)
        if np.isscalar(size)
        else rng.integers(size[0], size[1], n, endpoint=True)
    )
    costs = cost if np.isscalar(cost) else rng.uniform(cost[0], cost[1], n)
    one = np.ones(n, dtype=np.int64)
    ops.add("node", costs, fan_in * one, ins.ravel(), one, sizes)
    release_after = np.minimum(np.arange(n + 1, dtype=np.int64) + live, n)
    meta = {
        "name": f"random_dag(n={n}, live={live}, fan_in={fan_in}, seed={seed})",
        "generator": "random_dag",
        "n": n,
        "live": live,
        "resident": min(n, live + 1) + 1,
    }
    return _finish(ops, np.array([n], dtype=np.int64), meta, release_after)


def branching(
    blocks: int, *, width: int = 16, depth: int = 1, size: int = 1, cost: float = 1.0
) -> Trace:
    """``blocks`` fork-join blocks: ``width`` parallel branches of ``depth`` ops from the
    block input, joined by one op with ``width`` inputs into the next block's input.

    The baseline holds the block input and the ``width`` branch heads: ``width`` + 2
    storages. Ops per block: width x depth + 1.
    """
    _positive(blocks=blocks, width=width, depth=depth)
    ops = _Ops()
    (x0,) = _const(ops, np.full(1, size), "input")
    per = width * depth + 1  # ops, hence tensors, per block; block b's tensors start at base
    base = 1 + per * np.arange(blocks, dtype=np.int64)
    x_in = np.concatenate([[x0], base[1:] - 1])  # the previous block's join output
    j = np.arange(width * depth, dtype=np.int64)
    # Branch op j reads the block input when it starts a branch, else the op before it.
    branch_in = np.where(j % depth == 0, -1, j - 1)[None, :] + base[:, None]
    branch_in = np.where(j % depth == 0, x_in[:, None], branch_in)
    join_in = base[:, None] + depth * np.arange(width, dtype=np.int64) + depth - 1
    ins = np.concatenate([branch_in, join_in], axis=1).ravel()
    n_in = np.tile(np.concatenate([np.ones(width * depth, np.int64), [width]]), blocks)
    names = np.tile(
        np.concatenate(
            [np.full(width * depth, ops.name_id("branch"), np.int32), [ops.name_id("join")]]
        ).astype(np.int32),
        blocks,
    )
    n_ops = blocks * per
    out = ops.add(names, cost, n_in, ins, np.ones(n_ops, np.int64), np.full(n_ops, size))
    meta = {
        "name": f"branching(blocks={blocks}, width={width}, depth={depth})",
        "generator": "branching",
        "blocks": blocks,
        "width": width,
        "depth": depth,
        "resident": width + 2,
    }
    return _finish(ops, out[-1:], meta)


# ------------------------------------------------------------------ transformer
# One layer as a template: (name, inputs, output sizes, cost). An input is a local tensor
# index (outputs of the block's ops, numbered in order) or the name of an external [blocks]
# id array; sizes and costs are names of the figures computed in ``transformer``.
_FORWARD = [
    ("layernorm", ["x"], ["act"], "ew"),  # 0 h1
    ("mm", [0, "wqkv"], ["qkv"], "mm_qkv"),  # 1 qkv
    ("scores", [1], ["att"], "mm_att"),  # 2 s
    ("softmax", [2], ["att"], "ew_att"),  # 3 p
    ("attend", [3, 1], ["act"], "mm_att"),  # 4 c
    ("mm", [4, "wo"], ["act"], "mm_o"),  # 5 o
    ("add", ["x", 5], ["act"], "ew"),  # 6 x1
    ("layernorm", [6], ["act"], "ew"),  # 7 h2
    ("mm", [7, "w1"], ["mlp"], "mm_mlp"),  # 8 u
    ("gelu", [8], ["mlp"], "ew_mlp"),  # 9 a
    ("mm", [9, "w2"], ["act"], "mm_mlp"),  # 10 d
    ("add", [6, 10], ["act"], "ew"),  # 11 y: the next layer's x
]
_BACKWARD = [  # "g": the gradient of the layer output y
    ("mm_bw", ["g", "f9", "w2"], ["mlp", "w2"], "mm_mlp2"),  # 0 ga, 1 gW2
    ("gelu_bw", [0, "f8"], ["mlp"], "ew_mlp"),  # 2 gu
    ("mm_bw", [2, "f7", "w1"], ["act", "w1"], "mm_mlp2"),  # 3 gh2, 4 gW1
    ("layernorm_bw", [3, "f6", "g"], ["act"], "ew"),  # 5 gx1 (+ residual)
    ("mm_bw", [5, "f4", "wo"], ["act", "wo"], "mm_o2"),  # 6 gc, 7 gWo
    ("attend_bw", [6, "f3", "f1"], ["att", "qkv"], "mm_att2"),  # 8 gp, 9 gqkv'
    ("softmax_bw", [8, "f3"], ["att"], "ew_att"),  # 10 gs
    ("scores_bw", [10, "f1", 9], ["qkv"], "mm_att2"),  # 11 gqkv
    ("mm_bw", [11, "f0", "wqkv"], ["act", "wqkv"], "mm_qkv2"),  # 12 gh1, 13 gWqkv
    ("layernorm_bw", [12, "x", 5], ["act"], "ew"),  # 14 gx: the g of layer - 1
]
_WEIGHT_GRADS = (1, 4, 7, 13)


def _tile(ops: _Ops, template, blocks: int, ext: dict, sizes: dict, costs: dict) -> np.ndarray:
    """Emit ``blocks`` copies of ``template`` block after block; returns [blocks, F] ids of
    each block's tensors. ``ext[name]`` is a [blocks] array of external tensor ids."""
    per_block = sum(len(outs) for _, _, outs, _ in template)
    base = ops.num_tensors + per_block * np.arange(blocks, dtype=np.int64)
    cols = [ext[r] if isinstance(r, str) else base + r for _, ins, _, _ in template for r in ins]
    ins = np.stack(cols, axis=1).ravel()
    n_in = np.tile([len(i) for _, i, _, _ in template], blocks).astype(np.int64)
    n_out = np.tile([len(o) for _, _, o, _ in template], blocks).astype(np.int64)
    size = np.tile([sizes[s] for _, _, outs, _ in template for s in outs], blocks)
    cost = np.tile([costs[c] for *_, c in template], blocks)
    names = np.tile([ops.name_id(n) for n, *_ in template], blocks).astype(np.int32)
    ids = ops.add(names, cost, n_in, ins, n_out, size.astype(np.int64))
    return ids.reshape(blocks, per_block)


def transformer(
    layers: int,
    *,
    batch: int = 8,
    seq: int = 512,
    d_model: int = 1024,
    heads: int = 16,
    flops_per_ns: float = 1e5,
    bytes_per_ns: float = 2e3,
) -> Trace:
    """A pre-norm transformer stack (fp32), one training iteration: forward, loss, backward.

    Per layer 12 forward ops (layernorm, qkv, scores, softmax, attend, out-proj, residual,
    layernorm, MLP up, gelu, MLP down, residual) and 10 backward ops; 4 weights per layer are
    constants and their gradients are outputs. Costs are nominal: matmuls at
    ``flops_per_ns`` (1e5 = 100 TFLOP/s), elementwise ops at ``bytes_per_ns`` (2e3 = 2 TB/s).
    The resident set is ~11 saved activations per layer plus the weight gradients.
    """
    _positive(layers=layers, batch=batch, seq=seq, d_model=d_model, heads=heads)
    b, s, d = batch, seq, d_model
    act = 4 * b * s * d
    sizes = {
        "act": act,
        "qkv": 3 * act,
        "mlp": 4 * act,
        "att": 4 * b * heads * s * s,
        "wqkv": 12 * d * d,
        "wo": 4 * d * d,
        "w1": 16 * d * d,
        "w2": 16 * d * d,
    }
    mm = lambda flops: flops / flops_per_ns
    costs = {
        "ew": act / bytes_per_ns,
        "ew_att": sizes["att"] / bytes_per_ns,
        "ew_mlp": sizes["mlp"] / bytes_per_ns,
        "mm_qkv": mm(6 * b * s * d * d),
        "mm_att": mm(2 * b * s * s * d),
        "mm_o": mm(2 * b * s * d * d),
        "mm_mlp": mm(8 * b * s * d * d),
    }
    costs.update({k + "2": 2 * v for k, v in costs.items() if k.startswith("mm")})
    ops = _Ops()
    L = layers
    w = {n: _const(ops, np.full(L, sizes[n]), n) for n in ("wqkv", "wo", "w1", "w2")}
    (x0,) = _const(ops, np.full(1, act), "input")
    fwd_base = ops.num_tensors + 12 * np.arange(L, dtype=np.int64)
    x = np.concatenate([[x0], fwd_base[:-1] + 11])
    f = _tile(ops, _FORWARD, L, {"x": x, **w}, sizes, costs)
    (g_top,) = ops.add(
        "loss_bw",
        costs["ew"],
        np.ones(1, np.int64),
        f[-1, 11:],
        np.ones(1, np.int64),
        np.full(1, act),
    )
    rev = np.arange(L - 1, -1, -1)  # backward blocks run from the last layer down
    bwd_base = ops.num_tensors + 15 * np.arange(L, dtype=np.int64)
    ext = {
        "g": np.concatenate([[g_top], bwd_base[:-1] + 14]),
        "x": x[rev],
        **{n: v[rev] for n, v in w.items()},
        **{f"f{k}": f[rev, k] for k in range(12)},
    }
    bw = _tile(ops, _BACKWARD, L, ext, sizes, costs)
    outputs = np.concatenate([bw[:, list(_WEIGHT_GRADS)].ravel(), bw[-1, 14:]])
    meta = {
        "name": f"transformer(layers={L}, batch={b}, seq={s}, d_model={d}, heads={heads})",
        "generator": "transformer",
        "layers": L,
        "resident": None,
    }
    return _finish(ops, outputs, meta)


def by_name(name: str, **kwargs) -> Trace:
    """A generator by name (``chain``, ``random_dag``, ``branching``, ``transformer``)."""
    gens = {
        "chain": chain,
        "random_dag": random_dag,
        "branching": branching,
        "transformer": transformer,
    }
    if name not in gens:
        raise ValueError(f"unknown generator {name!r}; expected one of {sorted(gens)}")
    return gens[name](**kwargs)
