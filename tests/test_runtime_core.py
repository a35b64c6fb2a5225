"""Targeted runtime tests: views, in-place, RNG replay, hidden mutation, versions, budget
errors, exceptions, no_grad, retain_graph, double backward, multi-output ops, boundary calls,
deep chains, invalid arguments, profiler ranges, autocast."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode

import tritondtr.runtime as rt
from tritondtr.runtime.recipe import BLANK, READ, WRITE


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def grads_of(fn, *leaves):
    for t in leaves:
        t.grad = None
    out = fn()
    out.backward()
    return rt.unwrap(out.detach()).clone(), [t.grad.clone() for t in leaves]


def compare(fn, *leaves, **enable):
    """fn() under eager and under tritondtr (stress by default): equal value and grads."""
    ref, gref = grads_of(fn, *leaves)
    with rt.enable(**(enable or {"stress": True, "debug": True})) as s:
        out, g = grads_of(fn, *leaves)
    assert torch.equal(out, ref)
    for a, b in zip(g, gref):
        assert torch.equal(a, b)
    return s


def leaf(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape, requires_grad=True)


def test_views_of_evicted_base():
    x = leaf(6, 5)

    def fn():
        a = x.tanh() * 3
        v, w = a[1:], a.t()[2]
        return (v.exp().sum() + w.sin().sum()) * a.view(-1)[7]

    s = compare(fn, x)
    assert s.stats.evictions > 0 and s.stats.rematerializations > 0


@pytest.mark.parametrize("alias", [False, True], ids=["no-alias", "alias"])
def test_inplace(alias):
    x = leaf(4, 7)

    def fn():
        a = x * 2
        v = a[1] if alias else None
        a.add_(1).mul_(x)
        b = a.sigmoid() * 1
        b[0].zero_()
        out = b.sum() * 2
        return out + v.sum() if alias else out

    compare(fn, x)


def test_inplace_relu_and_view_write_match_eager_values():
    x = leaf(3, 4)

    def fn():
        a = x.exp() * 1
        a[:, 1:3] = a[:, 1:3] * 5  # copy_ into a view
        return F.relu(a - 2, inplace=True).sum()

    compare(fn, x)


def test_uninitialized_buffers_stay_plain():
    """NOTE [ What is tracked ] rule 5: torch.empty and friends made from nothing tracked are
    plain tensors (C++ code writes them through raw pointers); writes of tracked values into
    them keep values and gradients."""
    x = leaf(4, 6)
    with rt.enable(budget=None):
        a = x.sin()
        plain = [
            torch.empty(4, 6),
            torch.empty_like(x),
            x.new_empty(3),
            torch.empty_strided((2, 3), (1, 2)),
        ]
        assert all(type(t) is torch.Tensor for t in plain)
        assert type(torch.empty_like(a)) is rt.DTRTensor  # from a tracked tensor: tracked
        assert type(a.new_empty(2)) is rt.DTRTensor

    def fn():
        a = x.sin() * 2
        buf = torch.empty(4, 6)
        buf.copy_(a)  # a plain tensor written with a tracked value
        return (buf * a.cos()).sum()

    compare(fn, x)


def test_unsafe_view_shares_its_argument_storage():
    """NOTE [ Op semantics ] rule 8: ``_unsafe_view`` (matmul's reshape of its mm result)
    aliases its argument: its bytes are counted once, and values and gradients survive the
    eviction of the base."""
    x = leaf(8, 6)
    with rt.enable(budget=None) as s:
        a = x.sin()  # 192 bytes
        v = torch.ops.aten._unsafe_view(a, [4, 12])
        assert type(v) is rt.DTRTensor and v._cell is a._cell
        assert s.stats.resident_bytes == 8 * 6 * 4
    w = leaf(3, 5, 6)

    def fn():
        h = (w.tanh() @ x.t()).relu()  # 3-d matmul: mm, then _unsafe_view
        return (h * h.cos()).sum()

    compare(fn, w)


def test_overwriting_ops_do_not_depend_on_the_old_version():
    """NOTE [ Overwriting ops ]: a new version written entirely by copy_ / fill_ / zero_ /
    bernoulli_ is recomputed from a fresh buffer, not from its old version; a partial write
    or one that reads its own buffer keeps the old version as a parent."""
    x = leaf(16, 16)
    with rt.enable(budget=None):
        m = torch.empty_like(x.tanh()).bernoulli_(0.5)
        assert [e[5] for e in m._cell.storage.recipe.inputs] == [BLANK]
        p = x.sin()
        p[1:].zero_()  # the slice does not cover the buffer
        assert [e[5] for e in p._cell.storage.recipe.inputs] == [WRITE]
        q = x.cos()
        q.fill_(q[1, 1])  # reads the buffer it overwrites
        assert sorted(e[5] for e in q._cell.storage.recipe.inputs) == [READ, WRITE]

    def fn():
        torch.manual_seed(5)
        h = x.tanh()
        for _ in range(3):
            h = F.dropout(h.sin(), 0.3)  # CPU: empty_like(h).bernoulli_(0.7).div_(0.7)
        buf = torch.empty_like(h)
        buf.copy_(h.exp())
        z = torch.zeros_like(h).fill_(2.0)
        w = x.sin()
        w[1:].zero_()
        v = x.cos()
        v.fill_(v[2, 3])
        return (h * buf * z * w * v).sum()

    compare(fn, x)


def test_recomputation_computes_the_oldest_missing_input_first():
    """NOTE [ Iterative rematerialization ] rule 4, on a residual chain x = x + f(x) with
    everything evicted after every op: recomputing x_k first (the older input) keeps one
    residual locked at a time. Computing f(x_k) first recomputed x_k under f's frame, lost it
    to the next eviction, and recomputed it again: 81,831 rematerializations for 12 blocks
    (x4 per two blocks) and a peak growing with the depth."""
    x0 = leaf(256)

    def fn():
        x = x0 * 1.0
        for _ in range(12):
            x = x + (x * 2).sin()
        return x

    with rt.enable(stress=True) as s:
        y = fn()
        s.stats.peak_bytes = s.stats.resident_bytes  # measure the recomputation alone
        got = y.sum().item()
    assert got == fn().sum().item()
    assert s.stats.peak_bytes <= 3 * 256 * 4  # x_k, x_k * 2 and its sin: no depth term
    assert s.stats.rematerializations <= 12 * 12 * 6  # 741 here: quadratic, not 2^n


def test_random_ops_replay_and_leave_the_stream_alone():
    x = leaf(64, 32)

    def fn():
        torch.manual_seed(3)
        h = F.dropout(x.tanh(), 0.5) + torch.rand(64, 32)
        return (F.dropout(h, 0.3) * torch.randn_like(h)).sum()

    compare(fn, x)
    torch.manual_seed(5)
    with rt.enable(stress=True):
        fn().backward()
        after = torch.rand(3)
    torch.manual_seed(5)
    fn().backward()
    assert torch.equal(after, torch.rand(3))


def test_batch_norm_stats_not_updated_twice():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(5)
    bn2 = torch.nn.BatchNorm1d(5)
    bn2.load_state_dict(bn.state_dict())
    x = leaf(8, 5)
    (bn(x).tanh().sum()).backward()
    with rt.enable(stress=True):
        (bn2(x).tanh().sum()).backward()
    for a, b in zip(bn.buffers(), bn2.buffers()):
        assert torch.equal(a, b)


def test_write_to_a_plain_input_inside_freezes_and_backward_fails_as_eager():
    """NOTE [ Parameter writes ] rule 3: the write freezes what depends on x; the backward then
    fails exactly as eager's does (x was saved for w's gradient)."""
    x = torch.randn(5)  # plain input from outside, no grad
    eager = {}
    for name, ctx in (
        ("eager", contextlib.nullcontext),
        ("tritondtr", lambda: rt.enable(stress=True)),
    ):
        w = leaf(5)
        xx = x.clone()
        with ctx():
            y = (xx * w).tanh()
            with torch.no_grad():
                xx.add_(1)
            with pytest.raises(RuntimeError, match="modified by an inplace operation") as e:
                y.sum().backward()
            eager[name] = str(e.value)
    assert eager["tritondtr"] == eager["eager"]


def test_changed_outside_input_raises_clear_error():
    """NOTE [ Parameter writes ] rule 4: a write the session does not see (here after exit)
    makes a later recomputation raise StaleInputError, not read the new contents."""
    x = torch.randn(5)  # plain input from outside, no grad
    with rt.enable(stress=True) as s:
        y = (x * 2).tanh()
    assert s.stats.evictions > 0
    x.add_(1)  # outside any session: unseen
    with pytest.raises(rt.StaleInputError, match="modified in place"):
        y.sum().item()


def test_parameter_update_hands_out_held_tensors():
    w = leaf(5)
    with rt.enable(stress=True):
        loss = (w * 2).exp().sum()
        loss.backward()
        with torch.no_grad():
            w.sub_(w.grad)  # an optimizer step
    assert loss.item() == (leaf(5) * 2).exp().sum().item()


def test_budget_error_is_clear_and_session_stays_usable():
    x = torch.randn(1000)
    with rt.enable(budget=1000, debug=True) as s:
        a = x * 2  # 4000 bytes: allowed as the output of the op in flight
        msg = r"1000 bytes.*aten\.mul\.Tensor.*4000 bytes.*locked"
        with pytest.raises(rt.BudgetError, match=msg):
            a + a * 1
        small = torch.ones(10) + 1
        assert small.sum().item() == 20.0
    assert torch.equal(rt.unwrap(a), x * 2)
    assert s.stats.budget_errors == 1


def test_user_exception_restores_process():
    x = leaf(3)
    with pytest.raises(KeyError), rt.enable(budget="1MiB") as s:
        (x * 2).sum()
        raise KeyError("user")
    assert _get_current_dispatch_mode() is None
    assert s.closed and not s.active
    assert type(x * 2) is torch.Tensor


def test_no_grad():
    x = torch.randn(4, 4)
    with rt.enable(stress=True):
        with torch.no_grad():
            plain = x @ x
            y = (x + 0).tanh()  # grad mode off and no wrapper input: plain
        z = x * 1  # tracked
        with torch.no_grad():
            tracked = z.exp()
    assert type(plain) is torch.Tensor and type(y) is torch.Tensor
    assert rt.is_tracked(tracked) and torch.equal(rt.unwrap(tracked), x.exp())


def test_retain_graph_and_double_backward():
    x = leaf(6)
    ref = (x.sin() * x).sum()
    ref.backward(retain_graph=True)
    ref.backward()
    g_ref = x.grad.clone()
    (gg_ref,) = torch.autograd.grad(
        (torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)[0] ** 2).sum(), x
    )
    x.grad = None
    with rt.enable(stress=True, debug=True):
        y = (x.sin() * x).sum()
        y.backward(retain_graph=True)
        y.backward()
        (g,) = torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad((g**2).sum(), x)
    assert torch.equal(x.grad, g_ref)
    assert torch.equal(rt.unwrap(gg), gg_ref)


def test_multi_output_ops():
    x = leaf(5, 6)

    def fn():
        v, i = x.exp().max(dim=1)
        a, b = x.split([2, 4], dim=1)
        var, mean = torch.var_mean(x * 3, dim=0)
        return v.sum() + i.float().sum() + (a.sum() * b.mean()) + var.sum() + mean.sum()

    compare(fn, x)


def test_boundary_calls_inside_and_after_exit():
    x = torch.arange(6.0).reshape(2, 3)

    @torch.library.custom_op("tritondtr_test::twice", mutates_args=())
    def twice(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    with rt.enable(stress=True):
        y = x + 1
        assert y.sum().item() == 21.0
        assert y.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        assert (y.numpy() == (x + 1).numpy()).all()
        assert "tensor([[1., 2., 3." in repr(y)
        assert torch.equal(rt.unwrap(twice(y)), (x + 1) * 2)
        z = y * 2
    assert z.tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]
    w = z + 1  # after exit: plain in, plain out
    assert type(w) is torch.Tensor and torch.equal(w, (x + 1) * 2 + 1)
    z.add_(1)
    assert torch.equal(rt.unwrap(z), w)


def test_100k_deep_chain_recomputes_without_recursion():
    n = 100_000
    with rt.enable(budget=None, heuristic="lru") as s:
        y = torch.zeros(1)
        for _ in range(n):
            y = y + 1
        s.evict_all()
        assert y.item() == float(n)
    assert s.stats.rematerializations == n + 1  # the adds and torch.zeros


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget": -1},
        {"budget": "12 parsecs"},
        {"budget": 1.5},
        {"budget": True},
        {"heuristic": "nope"},
        {"backend": "gpu-magic"},
        {"stress": True, "budget": "1MiB"},
        {"never_evict": 3},
        {"debug": "yes"},
    ],
    ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()),
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError, match=r"expected|must|unknown|takes no budget|cannot read"):
        rt.enable(**kwargs)


def test_budget_strings():
    assert rt.enable("512MiB").config.budget == 512 * 2**20
    assert rt.enable("1.5GB").config.budget == 1_500_000_000
    assert rt.enable(1234).stats.budget == 1234


def test_profiler_shows_named_ranges():
    x = leaf(16, 16)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, rt.enable(budget=3000):
        h = x
        for _ in range(6):
            h = h.tanh() * 1.5
        h.sum().backward()
    names = {e.name for e in prof.events()}
    assert {"tritondtr::evict", "tritondtr::select", "tritondtr::rematerialize"} <= names


def test_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def fn():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lin(lin(x).relu()).float().sum()

    compare(fn, *lin.parameters())


def test_never_evict_pins_outputs():
    x = leaf(8, 8)
    seen = []

    def pin_tanh(op, out):
        seen.append(op)
        return op == "aten.tanh.default"

    with rt.enable(stress=True, never_evict=pin_tanh) as s:
        (x.tanh() * 2).sum().backward()
    assert "aten.tanh.default" in seen and s.stats.evictions > 0


def test_unsupported_op_is_refused_clearly():
    with rt.enable(stress=True):
        y = torch.randn(3, 4) * 1
        with pytest.raises(rt.UnsupportedOpError, match=r"aten\.resize_.*storage"):
            y.resize_(20)
        assert torch.equal(rt.unwrap(y * 1), rt.unwrap(y))  # the session stays usable


def test_op_refused_only_when_differentiated():
    """NOTE [ Op semantics ] rule 7: prod's backward differs for subclasses."""
    x = leaf(3, 4)
    with rt.enable(stress=True):
        with pytest.raises(rt.UnsupportedOpError, match=r"aten\.prod.*Differentiate it"):
            (x * 1).prod()
        with torch.no_grad():
            p = (x * 1).prod(1)
    assert torch.equal(rt.unwrap(p), x.detach().prod(1))


def test_inplace_view_ops_follow_the_wrapper():
    """NOTE [ Op semantics ] rule 6: t_, squeeze_, unsqueeze_, transpose_, swapdims_,
    as_strided_ (also beyond the view's own extent) change the wrapper only."""
    x = leaf(3, 1, 4)

    def fn():
        y = x * 2
        y.squeeze_(1)
        y.t_()
        y.unsqueeze_(0)
        z = y.exp()
        y.transpose_(0, 2).swapdims_(1, 2)
        w = (x * 3)[0, 0]
        w.as_strided_((2, 5), (5, 1), 1)  # reaches past w's 4 elements
        return (z * 1).sum() + (y * y).sum() + w.sin().sum()

    s = compare(fn, x)
    assert s.stats.rematerializations > 0


def test_conj_and_neg_views_keep_their_bits():
    """Conjugate / negative views (math bits) survive eviction and replay."""
    torch.manual_seed(0)
    z = torch.randn(5, dtype=torch.complex128, requires_grad=True)

    def fn():
        c = (z * 1).conj()
        n = torch._neg_view(c * 1)
        f = torch.fft.ihfft(z.real * 1)  # a fresh output with the conj bit set
        return (c * c).real.sum() + (n.exp() * c).abs().sum() + f.abs().sum()

    compare(fn, z)
    with rt.enable(stress=True):
        c = (z * 1).conj()
        assert c.is_conj() and rt.unwrap(c).is_conj()


def test_replay_runs_under_the_first_grad_mode():
    """NOTE [ Replay context ]: a kernel reading the grad mode replays as it first ran."""
    lib = torch.library.Library("tritondtr_test", "FRAGMENT")
    lib.define("grad_scale(Tensor x) -> Tensor")
    lib.impl("grad_scale", lambda x: x * (2.0 if torch.is_grad_enabled() else 3.0), "CPU")
    op = torch.ops.tritondtr_test.grad_scale.default
    x = leaf(4)
    with rt.enable(stress=True):
        y = op(x.detach() * 1)  # evicted now; recomputed under the no-grad print below
        with torch.no_grad():
            got = rt.unwrap(y * 1)
    assert torch.equal(got, x.detach() * 2.0)


def test_engine_deferred_until_the_budget_binds():
    """NOTE [ Lazy engine ]: no engine while the budget does not bind; once it binds, the
    pool syncs mid-step and values and gradients still equal eager."""
    x = leaf(32, 32)

    def fn():
        a = x.tanh() * 1
        b = [a]
        for _ in range(12):
            b.append(b[-1].sin() * 1.5)
        del a
        v = b[3].t()  # a view and dead storages enter the engine at the sync
        return sum(t.sum() for t in b[::3]) + v.exp().sum()

    s = compare(fn, x, budget=1 << 30, debug=True)
    assert s.core.engine is None and s.stats.evictions == 0
    peak = s.stats.peak_bytes
    s = compare(fn, x, budget=peak // 2, debug=True)
    assert s.core.engine is not None and s.stats.evictions > 0
    assert s.stats.rematerializations > 0


_FAILS = {"left": 0}


@torch.library.custom_op("tritondtr_test::oom_then_double", mutates_args=())
def _oom_then_double(x: torch.Tensor) -> torch.Tensor:
    """x * 2, after raising the allocator's out-of-memory error ``_FAILS["left"]`` times."""
    if _FAILS["left"] > 0:
        _FAILS["left"] -= 1
        raise torch.OutOfMemoryError("out of memory (raised by the test)")
    return x * 2


@pytest.mark.parametrize("fails", [1, 2])
def test_allocator_oom_evicts_and_retries(fails):
    """NOTE [ Budget accounting ]: on the allocator's OutOfMemoryError (CUDA in practice; a
    custom op raises it here) one victim is evicted and the op retried, also from a lazy
    pool (the budget never bound, so the engine is built first)."""
    x = torch.randn(100)
    with rt.enable(budget="1MiB", debug=True) as s:
        a = (x + 1) * 3
        others = [a + k for k in range(3)]
        b = a - 1
        _FAILS["left"] = fails
        y = torch.ops.tritondtr_test.oom_then_double(b)
        # NOTE [ Out-of-memory fallback ] rule 2: retry i evicts 2**i victims
        assert s.stats.evictions == 2**fails - 1 and _FAILS["left"] == 0
        assert torch.equal(rt.unwrap(y), ((x + 1) * 3 - 1) * 2)
        for k, o in enumerate(others):  # recomputed if it was a victim
            assert torch.equal(rt.unwrap(o), (x + 1) * 3 + k)


def test_allocator_oom_with_nothing_to_evict_propagates():
    x = torch.randn(100)
    with rt.enable(budget=None) as s:  # nothing is ever evicted: the error is the user's
        _FAILS["left"] = 1
        with pytest.raises(torch.OutOfMemoryError, match="raised by the test"):
            torch.ops.tritondtr_test.oom_then_double(x + 1)
        assert torch.equal(rt.unwrap(torch.ops.tritondtr_test.oom_then_double(x + 1)), (x + 1) * 2)
    with rt.enable(budget="1MiB") as s:  # only the op's own (locked) input is tracked
        b = x + 1
        _FAILS["left"] = 5
        with pytest.raises(torch.OutOfMemoryError):
            torch.ops.tritondtr_test.oom_then_double(b)
        _FAILS["left"] = 0
        assert torch.equal(rt.unwrap(b), x + 1) and s.stats.evictions == 0


def test_replay_copies_keep_bytes_and_geometry():
    """NOTE [ Replay copies ] rule 1: an in-place replay on a buffer that covers its storage
    (the clone) and on one that does not (the storage copy) gives eager's values, sizes and
    strides."""
    x = leaf(6, 4)

    def fn(keep=None):
        outs = [
            x * 2,  # contiguous: clone
            (x * 2)[:1],  # a view of a bigger storage: storage copy
            x.t() * 2,  # a transposed fresh output: storage copy
            (x.reshape(6, 1, 4) * 2).as_strided((6, 1, 4), (4, 99, 1)),  # dense, odd stride
        ]
        total = 0
        for k, a in enumerate(outs):
            a.mul_(x[k % 6, 0]).add_(1)
            if keep is not None:
                keep.append(a)
            total = total + (a * a).sum()
        return total

    ref_keep, got_keep = [], []
    ref, gref = grads_of(lambda: fn(ref_keep), x)
    with rt.enable(stress=True, debug=True) as s:
        out, g = grads_of(lambda: fn(got_keep), x)
        got = [rt.unwrap(a) for a in got_keep]  # recomputed: stress evicted them
    assert s.stats.rematerializations > 0
    assert torch.equal(out, ref) and torch.equal(g[0], gref[0])
    for a, b in zip(got, ref_keep):
        assert torch.equal(a, b.detach())
        assert a.shape == b.shape and a.stride() == b.stride()
        assert a.storage_offset() == b.storage_offset()


def test_clone_buffer_matches_the_storage_copy():
    """NOTE [ Replay copies ] rule 1: the clone path and the storage-copy path agree."""
    from tritondtr.runtime.recipe import clone_buffer, geometry

    base = torch.randn(6, 4)
    cases = [
        base.clone(),
        base.clone().as_strided((6, 1, 4), (4, 99, 1)),
        base.clone()[1:],
        base.clone().t(),
        torch.zeros(0, 3),
        torch.randn(3, dtype=torch.complex64).conj(),
    ]
    for t in cases:
        nbytes = t.untyped_storage().nbytes()
        slow, fast = clone_buffer(t), clone_buffer(t, nbytes)
        assert geometry(fast) == geometry(slow) == geometry(t)
        assert fast.untyped_storage().nbytes() == nbytes
        assert bytes(fast.untyped_storage()) == bytes(slow.untyped_storage())
        assert fast.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or not nbytes


def test_detach_of_an_evicted_wrapper_recomputes_nothing():
    """NOTE [ Op semantics ] rule 12: ``detach`` answers with a view wrapper at once, without
    using its argument's storage: under stress (everything evicted after each op) it
    recomputes nothing, ticks no clock, and its value is the argument's when read."""
    x = torch.randn(6, 5, requires_grad=True)
    with rt.enable(stress=True) as s:
        y = (x * 2).tanh()
        remats, now, ops = s.stats.rematerializations, s.core.now, s.stats.ops
        d = y.detach()
        assert (s.stats.rematerializations, s.core.now, s.stats.ops) == (remats, now, ops)
        assert rt.is_tracked(d) and not d.requires_grad
        assert torch.equal(rt.unwrap(d), (x * 2).tanh().detach())
        y.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    (x_ref * 2).tanh().sum().backward()
    assert torch.equal(x.grad, x_ref.grad)
