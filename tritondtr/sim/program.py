"""A trace precompiled for replay: storages resolved, everything as flat Python lists.

The replay loop touches a few list entries per event; building these lists once per trace
(with numpy where it vectorizes) keeps per-event dictionaries and objects out of that loop.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ..traceformat.trace import EventKind, Trace, TraceError

__all__ = ["Program", "compile_trace"]


@dataclass(eq=False)
class Program:
    """Replay-ready lists; T tensors, S storages, O ops, E events.

    Storages are numbered densely in creation order; a view shares its base's storage.

    ==============  =========  =====================================================
    field           length     meaning
    ==============  =========  =====================================================
    sid             T          storage of each tensor
    fresh           T          bytes the tensor allocates (0 for a view)
    op_of           T          op that created the tensor
    op_inputs       O          list of input tensor ids (duplicates kept)
    op_lo, op_hi    O          output tensor ids are ``range(op_lo[o], op_hi[o])``
    op_total        O          bytes an op allocates (sum of ``fresh`` of its outputs)
    op_cost         O          compute cost (ns)
    op_new_parents  O          distinct input storages (parents of its fresh outputs)
    op_views        O          ``[(storage, other input storages), ...]`` for the distinct
                               storages its views land on (cost and edges added there);
                               ``()`` for an op with no view output
    op_out_st       O          storage of each output, in output order (a tuple)
    op_fresh_st     O          storages its fresh outputs create, in output order (a tuple;
                               the same object as ``op_out_st[o]`` when it has no view)
    st_size         S          bytes of the storage
    st_tensors      S          tensors viewing the storage (root first)
    ev_kind, ev_arg E          the event stream (:class:`EventKind`, op or tensor id)
    ==============  =========  =====================================================
    """

    trace: Trace
    sid: list
    fresh: list
    op_of: list
    op_inputs: list
    op_lo: list
    op_hi: list
    op_total: list
    op_cost: list
    op_new_parents: list
    op_views: list
    op_out_st: list
    op_fresh_st: list
    st_size: list
    st_tensors: list
    ev_kind: list
    ev_arg: list
    is_const: list

    @property
    def num_storages(self) -> int:
        return len(self.st_size)


def compile_trace(trace: Trace) -> Program:
    """Resolve views to storages and flatten ``trace`` (cached on the trace object)."""
    cached = getattr(trace, "_program", None)
    if cached is not None:
        return cached
    # Millions of small lists and no cycle: the cyclic collector would only rescan them
    # (random_dag(1e6) compiled in 12-15 s with it, 5.5 s without, on the shared 2-core AMD
    # EPYC guest, before the per-op lists below were built by slicing: 2.5-3.8 s then;
    # docs/history/benchmarks-log.md, Simulator scaling).
    collecting = gc.isenabled()
    gc.disable()
    try:
        prog = _compile(trace)
    finally:
        if collecting:
            gc.enable()
    trace._program = prog
    return prog


def _compile(trace: Trace) -> Program:
    n_t, n_ops = trace.num_tensors, trace.num_ops
    alias = trace.alias
    op_of_np = trace.op_of_tensor()
    fresh_np = np.where(alias < 0, trace.size, 0)
    is_fresh = alias < 0
    n_st = int(is_fresh.sum())
    # Fresh outputs get storages in creation order; a view takes the storage of the input
    # it views, which was created earlier, so one forward pass resolves chains of views.
    sid_np = np.full(n_t, -1, dtype=np.int64)
    sid_np[is_fresh] = np.arange(n_st)
    views = np.flatnonzero(~is_fresh)
    if views.size:
        src = trace.inputs[trace.in_ptr[op_of_np[views]] + alias[views]]
        sid_list = sid_np.tolist()
        for v, s in zip(views.tolist(), src.tolist()):
            sid_list[v] = sid_list[s]
        sid_np = np.asarray(sid_list, dtype=np.int64)
    else:
        sid_list = sid_np.tolist()
    if n_t and min(sid_list) < 0:
        raise TraceError("a view resolves to no storage; this is a bug of tritondtr")
    in_ptr, out_ptr = trace.in_ptr.tolist(), trace.out_ptr.tolist()
    inputs = trace.inputs.tolist()
    in_sid = sid_np[trace.inputs].tolist()
    op_inputs = [inputs[a:b] for a, b in pairwise(in_ptr)]
    op_new_parents = [in_sid[a:b] for a, b in pairwise(in_ptr)]
    for o in _ops_reading_a_storage_twice(trace, sid_np, n_st):
        op_new_parents[o] = list(dict.fromkeys(op_new_parents[o]))
    op_out_st = [tuple(sid_list[a:b]) for a, b in pairwise(out_ptr)]
    op_fresh_st = list(op_out_st)
    op_views: list = [()] * n_ops
    alias_l = alias.tolist()
    for o in np.unique(op_of_np[views]).tolist():
        lo, hi = out_ptr[o], out_ptr[o + 1]
        seen: list = []
        for t in range(lo, hi):
            if alias_l[t] >= 0:
                s = sid_list[t]
                if all(s != x for x, _ in seen):
                    seen.append((s, [p for p in op_new_parents[o] if p != s]))
        op_views[o] = seen
        op_fresh_st[o] = tuple(sid_list[t] for t in range(lo, hi) if alias_l[t] < 0)
    # Tensors of each storage in id order: the fresh root first, its views after it.
    order = np.argsort(sid_np, kind="stable").tolist()
    st_ptr = np.searchsorted(sid_np[order], np.arange(n_st + 1)).tolist()
    st_tensors = [order[a:b] for a, b in pairwise(st_ptr)]
    op_total = np.zeros(n_ops, dtype=np.int64)
    np.add.at(op_total, op_of_np, fresh_np)
    return Program(
        trace=trace,
        sid=sid_list,
        fresh=fresh_np.tolist(),
        op_of=op_of_np.tolist(),
        op_inputs=op_inputs,
        op_lo=out_ptr[:-1],
        op_hi=out_ptr[1:],
        op_total=op_total.tolist(),
        op_cost=trace.op_cost.tolist(),
        op_new_parents=op_new_parents,
        op_views=op_views,
        op_out_st=op_out_st,
        op_fresh_st=op_fresh_st,
        st_size=trace.size[is_fresh].tolist(),
        st_tensors=st_tensors,
        ev_kind=trace.kind.tolist(),
        ev_arg=trace.arg.tolist(),
        is_const=trace.is_constant_op().tolist(),
    )


def _ops_reading_a_storage_twice(trace: Trace, sid: np.ndarray, n_st: int) -> list[int]:
    """Ops with two inputs on one storage (the same tensor twice, or a tensor and its view)."""
    if trace.inputs.size < 2:
        return []
    owner = np.repeat(np.arange(trace.num_ops, dtype=np.int64), np.diff(trace.in_ptr))
    key = np.sort(owner * max(n_st, 1) + sid[trace.inputs])
    return np.unique(key[1:][key[1:] == key[:-1]] // max(n_st, 1)).tolist()


KIND_CALL = int(EventKind.CALL)
KIND_CONSTANT = int(EventKind.CONSTANT)
KIND_RETAIN = int(EventKind.RETAIN)
KIND_RELEASE = int(EventKind.RELEASE)
KIND_OUTPUT = int(EventKind.OUTPUT)
