"""Synthetic trace generators: equal, array for array, to the same graphs recorded op by op
with TraceBuilder; resident sets as documented (checked with the simulator's baseline)."""

import numpy as np
import pytest

from tritondtr.sim import generators as gen
from tritondtr.sim.baseline import baseline
from tritondtr.traceformat.builder import TraceBuilder
from tritondtr.traceformat.trace import EventKind

ARRAYS = ("kind", "arg", "op_cost", "op_name", "in_ptr", "inputs", "out_ptr", "size", "alias")


def record(ops, outputs, *, consts=(("input", 1),), release_after=None):
    """The reference: one TraceBuilder call per op, then a release of every tensor after its
    last use (or after op ``release_after[t]``), in tensor id order, outputs at the end.
    ``ops``: (name, inputs, cost, size) with single outputs; tensor ids are dense."""
    b = TraceBuilder()
    const = [b.constant(size, name=name) for name, size in consts]
    n_t = len(const) + len(ops)
    last = list(range(n_t))  # op index = tensor index (one output each)
    for o, (_, ins, _, _) in enumerate(ops, start=len(const)):
        for t in ins:
            last[t] = max(last[t], o)
    if release_after is not None:
        last = [release_after(t) for t in range(n_t)]
    after = {}
    for t in range(len(const), n_t):
        if t not in outputs:
            after.setdefault(last[t], []).append(t)
    for o, (name, ins, cost, size) in enumerate(ops, start=len(const)):
        b.call(name, ins, [size], cost)
        for t in after.get(o, []):
            b.release(t)
    for t in outputs:
        b.output(t)
    return b.build(outputs="none")


def assert_same(a, b):
    for k in ARRAYS:
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert a.names == b.names


@pytest.mark.parametrize("n", [1, 2, 7, 127])
def test_chain_equals_recorded(n):
    ops = [("f", [i], 1.0, 1) for i in range(n)]  # f_i reads a_{i-1} = tensor i - 1
    ops.append(("loss", [n], 1.0, 1))  # g_n is tensor n + 1
    for i in range(n, 0, -1):  # b_i reads g_i (tensor 2n + 1 - i) and a_{i-1}
        ops.append(("b", [2 * n + 1 - i, i - 1], 1.0, 1))
    assert_same(gen.chain(n), record(ops, [2 * n + 1]))


@pytest.mark.parametrize("n", [1, 5, 1000])
def test_chain_forward_only_equals_recorded(n):
    ops = [("f", [i], 2.5, 3) for i in range(n)]
    ref = record(ops, [n], consts=(("input", 3),))
    assert_same(gen.chain(n, backward=False, size=3, cost=2.5), ref)


@pytest.mark.parametrize("blocks,width,depth", [(1, 1, 1), (3, 4, 1), (2, 3, 4), (5, 127, 2)])
def test_branching_equals_recorded(blocks, width, depth):
    ops, x = [], 0
    for _ in range(blocks):
        heads = []
        for _ in range(width):
            t = x
            for _ in range(depth):
                ops.append(("branch", [t], 1.0, 1))
                t = len(ops)  # tensor id of the op just added (tensor 0 is the constant)
            heads.append(t)
        ops.append(("join", heads, 1.0, 1))
        x = len(ops)
    assert_same(gen.branching(blocks, width=width, depth=depth), record(ops, [x]))


@pytest.mark.parametrize("n,live,fan_in", [(1, 1, 1), (50, 4, 3), (1000, 127, 2)])
def test_random_dag_equals_recorded_and_stays_in_window(n, live, fan_in):
    t = gen.random_dag(n, live=live, fan_in=fan_in, seed=3).validate()
    ins = t.inputs.reshape(n, fan_in)
    i = np.arange(1, n + 1)
    assert (ins[:, 0] == i - 1).all()
    assert ((ins >= (i - np.minimum(i, live))[:, None]) & (ins < i[:, None])).all()
    ops = [("node", row.tolist(), 1.0, 1) for row in ins]
    ref = record(ops, [n], release_after=lambda u: min(u + live, n))
    assert_same(t, ref)
    assert np.array_equal(t.inputs, gen.random_dag(n, live=live, fan_in=fan_in, seed=3).inputs)


def test_random_dag_size_and_cost_ranges():
    t = gen.random_dag(4097, live=16, size=(1, 1000), cost=(0.5, 2.0), seed=1)
    s = t.size[1:]
    assert s.min() >= 1 and s.max() <= 1000 and np.unique(s).size > 500
    assert t.op_cost[1:].min() >= 0.5 and t.op_cost[1:].max() <= 2.0


@pytest.mark.parametrize(
    "trace",
    [
        gen.chain(1),
        gen.chain(1000),
        gen.chain(1000, backward=False),
        gen.random_dag(5, live=8),
        gen.random_dag(4097, live=127, fan_in=3),
        gen.branching(7, width=127, depth=3),
        gen.branching(2, width=1),
    ],
    ids=lambda t: t.meta["name"],
)
def test_resident_set_is_the_baseline_peak(trace):
    """meta["resident"] (storages live at once, constants included) against the simulator's
    baseline replay, which knows nothing of the generators (unit sizes)."""
    trace.validate()
    assert baseline(trace).peak_bytes == trace.meta["resident"]


@pytest.mark.parametrize("layers", [1, 3])
def test_transformer_is_a_valid_training_iteration(layers):
    t = gen.transformer(layers, batch=2, seq=16, d_model=8, heads=2).validate()
    assert t.num_ops == 4 * layers + 1 + 12 * layers + 1 + 10 * layers
    outputs = t.arg[t.kind == EventKind.OUTPUT]
    assert outputs.size == 4 * layers + 1  # weight gradients and the input gradient
    base = baseline(t)  # raises on a use after the last release
    weights = 4 * (3 + 1 + 4 + 4) * 8 * 8
    assert base.constant_bytes == layers * weights + 4 * 2 * 16 * 8
    assert base.peak_bytes > base.constant_bytes + layers * 4 * 2 * 16 * 8 * 11


def test_errors_say_what_was_wrong():
    with pytest.raises(ValueError, match="n must be a positive int"):
        gen.chain(0)
    with pytest.raises(ValueError, match="live must be a positive int"):
        gen.random_dag(10, live=0)
    with pytest.raises(ValueError, match="unknown generator"):
        gen.by_name("ring")


@pytest.mark.parametrize("n", [10**6])
def test_a_million_tensors_quickly(n):
    t = gen.random_dag(n, live=1000, fan_in=2)
    assert t.num_tensors == n + 1 and t.num_events == 2 * n + 1
    t.validate()


@pytest.mark.slow
def test_ten_million_tensors():
    """Generation only (full validation of 20M events is the 1M test's job, scaled)."""
    t = gen.chain(5 * 10**6)
    assert t.num_tensors == 10**7 + 2 and t.num_ops == 10**7 + 2
    assert t.in_ptr[-1] == t.inputs.size and t.inputs.max() < t.num_tensors
