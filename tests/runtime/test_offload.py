"""``enable(offload=...)`` (NOTE [ Offload ] in tritondtr/core/core.py) on CPU sessions: a
victim copied to host memory and back is bit-exact, whatever reads it next (an in-place write,
a view, the backward pass); the twin replays a recorded run with offload to the same
decisions; bad input is a clear error. A CPU session saves no memory by offloading (its host
is its device): these tests check the rules, gpu_check the CUDA path."""

from __future__ import annotations

import math

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tests.zoo import ZOO, make, train_step, unet_case
from tritondtr.core import Core
from tritondtr.core.link import Link
from tritondtr.core.tuning import CANDIDATES, choose
from tritondtr.runtime.copies import HostLink
from tritondtr.runtime.session import Session
from tritondtr.sim.simulate import simulate
from tritondtr.sim.twin import replay_runtime

CASES = {**{name: lambda name=name: make(name) for name in ZOO}, "unet": unet_case}
FAST = "1TB/s"  # a link far faster than any CPU op: every victim is offloaded


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _step(name, **enable):
    case = CASES[name]()
    opt = torch.optim.Adam(case.model.parameters(), lr=1e-2)
    if enable is None or enable.get("eager"):
        return case, train_step(case, opt).detach(), None
    with rt.enable(**enable) as session:
        loss = rt.unwrap(train_step(case, opt).detach())
    return case, loss, session.stats


def _equal(case, loss, ref, ref_loss):
    assert torch.equal(loss, ref_loss)
    for (n, p), (_, q) in zip(case.model.named_parameters(), ref.model.named_parameters()):
        assert torch.equal(p.grad, q.grad), f"{n}: gradient differs"
        assert torch.equal(p.detach(), q.detach()), f"{n}: updated parameter differs"
    for (n, b), (_, c) in zip(case.model.named_buffers(), ref.model.named_buffers()):
        assert torch.equal(b, c), f"buffer {n} differs"


@pytest.mark.parametrize("frac", [0.5, 0.3], ids=lambda f: f"{int(f * 100)}pct")
@pytest.mark.parametrize("name", [*ZOO, "unet"])
def test_a_step_with_offload_equals_eager(name, frac):
    ref, ref_loss, _ = _step(name, eager=True)
    _, _, base = _step(name, budget=None)
    case, loss, st = _step(name, budget=int(base.peak_bytes * frac), offload=FAST)
    _equal(case, loss, ref, ref_loss)
    if st.evictions:  # every victim went to the host, and what was read came back
        assert st.offloads > 0 and st.rematerializations == 0  # a fetched victim evicted
        assert st.fetched_bytes > 0 and st.link_busy_ns > 0  # again copies nothing


@pytest.mark.parametrize("name", ["mlp", "gpt", "lstm"])
def test_stress_with_offload_equals_eager(name):
    ref, ref_loss, _ = _step(name, eager=True)
    case, loss, st = _step(name, stress=True, offload=FAST)
    _equal(case, loss, ref, ref_loss)
    assert st.offloads > 0 and st.fetches > 0


def test_in_place_writes_and_views_of_offloaded_storages():
    a = torch.randn(64, 64)
    want_y = (a * 2).add_(1)
    want_v = (a * 3)[3:10, ::2].clone()
    with rt.enable(stress=True, offload=FAST) as s:
        x = a * 2  # offloaded after the op (stress)
        y = x.add_(1)  # fetched, written in place
        w = a * 3
        v = w[3:10, ::2]  # a view of an offloaded storage
        got_y, got_v = rt.unwrap(y.clone()), rt.unwrap(v.clone())
    assert torch.equal(got_y, want_y) and torch.equal(got_v, want_v)
    assert s.stats.offloads >= 2 and s.stats.fetches >= 2


def test_the_twin_replays_a_run_with_offload_to_its_decisions(tmp_path):
    case = make("gpt")
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    with tritondtr.enable(budget=None) as s0:
        train_step(make("gpt"), torch.optim.SGD(make("gpt").model.parameters(), lr=1e-2))
    budget = int(0.4 * s0.stats.peak_bytes)
    with tritondtr.trace(tmp_path / "step.npz", budget=budget, offload="20GB/s") as rec:
        train_step(case, opt)
    st = rec.session.stats
    assert st.offloads > 0 and rec.trace.meta["runtime"]["offload_bandwidth"] == 20e9
    res = simulate(
        tritondtr.sim.load_trace(tmp_path / "step.npz"),
        "dtr_eq",
        budget=budget,
        semantics="runtime",
    )
    assert (res.evictions, res.remats, res.offloads, res.peak_bytes) == (
        st.evictions,
        st.rematerializations,
        st.offloads,
        st.peak_bytes,
    )
    plain = simulate(rec.trace, "dtr_eq", budget=budget, semantics="runtime", action="recompute")
    assert plain.offloads == 0


def _traced_steps(name: str, steps: int, offload: str, path):
    """``steps`` SGD steps of zoo model ``name`` in eager, and in one traced session with
    ``offload`` at 30 % of its peak under the analytic model (the same choices every run):
    (case, its last loss, the eager case, eager's last loss, the recorder, the budget)."""
    ref = make(name)
    ref_opt = torch.optim.SGD(ref.model.parameters(), lr=1e-2)
    for _ in range(steps):
        ref_loss = train_step(ref, ref_opt).detach()
    with tritondtr.enable(budget=None) as s0:
        train_step(make(name), torch.optim.SGD(make(name).model.parameters(), lr=1e-2))
    budget = int(0.3 * s0.stats.peak_bytes)
    case = make(name)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
    with tritondtr.trace(path, budget=budget, offload=offload, cost="analytic") as rec:
        for _ in range(steps):
            loss = rt.unwrap(train_step(case, opt).detach())
    return case, loss, ref, ref_loss, rec, budget


def _replayed(res, st) -> tuple:
    """The twin's counts and the session's, side by side for one comparison."""
    twin = (res.evictions, res.remats, res.offloads, res.prefetches, res.peak_bytes)
    return twin, (st.evictions, st.rematerializations, st.offloads, st.prefetches, st.peak_bytes)


@pytest.mark.parametrize("name", ["gpt", "lstm"])
def test_steps_with_offload_prefetch_equal_eager_and_the_twin_replays_them(name, tmp_path):
    """NOTE [ Step plan ] in core/plan.py: from the second step on, offloaded storages come
    back in the previous step's order before they are read; the values are eager's, and the
    twin, recording the same plan from the same calls, makes the same prefetches."""
    case, loss, ref, ref_loss, rec, budget = _traced_steps(name, 3, "20GB/s", tmp_path / "s.npz")
    _equal(case, loss, ref, ref_loss)
    st = rec.session.stats
    assert st.prefetches > 0 and st.offloads > 0
    res = simulate(tritondtr.sim.load_trace(tmp_path / "s.npz"), budget=budget, semantics="runtime")
    twin, session = _replayed(res, st)
    assert twin == session
    none = simulate(rec.trace, budget=budget, semantics="runtime", prefetch=False)
    assert none.prefetches == 0 and none.link_wait > res.link_wait


def test_the_copy_price_scale_is_chosen_by_rehearsal_and_the_twin_replays_it(tmp_path):
    """NOTE [ Copy price scale ] rule 4 in core/tuning.py: at the end of the second step each
    candidate scale is rehearsed on what the driver asked of the core, and the least runs
    on; the values are eager's, and the twin, taping the same calls, chooses alike (NOTE [
    Rehearsal ] rule 5)."""
    case, loss, ref, ref_loss, rec, budget = _traced_steps("gpt", 4, "pcie4", tmp_path / "s.npz")
    _equal(case, loss, ref, ref_loss)
    core, st = rec.session.core, rec.session.stats
    assert set(core.tuner.times) == set(CANDIDATES) and core.tuner.fixed
    assert st.copy_scale == core.tuner.value == choose(core.tuner.times)
    assert core.tape is None and type(core) is Core  # the tape ends at the choice
    res = simulate(tritondtr.sim.load_trace(tmp_path / "s.npz"), budget=budget, semantics="runtime")
    twin, session = _replayed(res, st)
    assert twin == session
    assert res.copy_scale == st.copy_scale


@pytest.mark.parametrize("budget", [285082, 142541])
def test_a_scale_whose_rehearsal_fails_is_not_chosen(budget):
    """NOTE [ Copy price scale ] rules 3 and 4: the zoo LSTM at 10 % (and 5 %) of its peak
    trains only by copying; run live, a step at ``inf`` (never copy) recomputed in circles
    (ThrashError) where scale 1 ran (found in review). Its rehearsal fails instead, it is
    not chosen, and every step equals eager."""
    torch.manual_seed(0)
    ref = make("lstm", seed=0, scale=4)
    ref_opt = torch.optim.Adam(ref.model.parameters(), lr=1e-3)
    case = make("lstm", seed=0, scale=4)
    opt = torch.optim.Adam(case.model.parameters(), lr=1e-3)
    steps = 4
    for _ in range(steps):
        ref_loss = train_step(ref, ref_opt).detach()
    with rt.enable(budget=budget, offload="pcie4", cost="analytic") as s:
        for _ in range(steps):
            loss = rt.unwrap(train_step(case, opt).detach())
    _equal(case, loss, ref, ref_loss)
    assert set(s.core.tuner.times) == set(CANDIDATES) - {math.inf}
    assert s.core.tuner.value != math.inf


def _optimizer_in_backward(case) -> None:
    """Each parameter's SGD step runs in the backward pass, once its gradient is whole."""
    opts = {p: torch.optim.SGD([p], lr=1e-2) for p in case.model.parameters()}

    def step(p):
        opts[p].step()
        opts[p].zero_grad(set_to_none=True)

    for p in case.model.parameters():
        p.register_post_accumulate_grad_hook(step)


def _backward_steps(case, steps: int) -> torch.Tensor:
    for _ in range(steps):
        torch.manual_seed(1)
        loss = case.loss(case.model, case.inputs)
        loss.backward()
    return loss.detach()


def test_an_optimizer_step_inside_backward_with_offload_equals_eager(tmp_path):
    """NOTE [ Copy price scale ] rule 6: an optimizer step inside the backward pass writes
    (freezes) once per parameter, so the scale is chosen at the second of those; the values
    are eager's, and the twin, taping the same calls, chooses and decides alike."""
    ref, case = make("gpt"), make("gpt")
    _optimizer_in_backward(ref)
    _optimizer_in_backward(case)
    ref_loss = _backward_steps(ref, 3)
    with tritondtr.enable(budget=None) as s0:
        _backward_steps(make("gpt"), 1)
    budget = int(0.3 * s0.stats.peak_bytes)
    path = tmp_path / "s.npz"
    with tritondtr.trace(path, budget=budget, offload="pcie4", cost="analytic") as rec:
        loss = rt.unwrap(_backward_steps(case, 3))
    assert torch.equal(loss, ref_loss)
    for (n, p), (_, q) in zip(case.model.named_parameters(), ref.model.named_parameters()):
        assert torch.equal(p.detach(), q.detach()), f"{n}: updated parameter differs"
    core, st = rec.session.core, rec.session.stats
    assert core.tuner.fixed and core.tape is None and set(core.tuner.times) <= set(CANDIDATES)
    assert st.offloads > 0
    res = simulate(tritondtr.sim.load_trace(path), budget=budget, semantics="runtime")
    twin, session = _replayed(res, st)
    assert twin == session and res.copy_scale == st.copy_scale


def test_copies_the_host_refused_are_refused_in_the_twin_too(tmp_path, monkeypatch):
    """NOTE [ Asynchronous offload ] rule 7, NOTE [ The twin ] rule 9: a host out of memory
    refuses a copy out (the victim is dropped instead) and the allocator a prefetch (given
    up); the values are eager's, the run records which copies were refused, and the twin
    refuses the same ones, so it replays the run exactly; a replay refusing none decides
    otherwise."""
    copy_out, fetch = HostLink.copy_out, Session.fetch
    calls = {"out": 0, "back": 0}

    def scarce_out(self, sid, buf):
        calls["out"] += 1
        if calls["out"] % 3 == 0:
            raise RuntimeError("CUDA error: out of memory (planted: no pinned host memory)")
        return copy_out(self, sid, buf)

    def scarce_prefetch(self, sid, hint=False):
        if hint:
            calls["back"] += 1
            if calls["back"] % 4 == 0:
                raise RuntimeError("CUDA out of memory (planted)")
        return fetch(self, sid, hint)

    monkeypatch.setattr(HostLink, "copy_out", scarce_out)
    monkeypatch.setattr(Session, "fetch", scarce_prefetch)
    case, loss, ref, ref_loss, rec, budget = _traced_steps("gpt", 3, "pcie4", tmp_path / "s.npz")
    _equal(case, loss, ref, ref_loss)
    st, core = rec.session.stats, rec.session.core
    assert st.refused_copies == len(core.copies.refused) > 0 and st.offloads > 0
    trace = tritondtr.sim.load_trace(tmp_path / "s.npz")
    assert trace.meta["runtime"]["refused"] == core.copies.refused
    res = simulate(trace, budget=budget, semantics="runtime")
    twin, session = _replayed(res, st)
    assert twin == session
    stats, plenty = replay_runtime(trace, "dtr_eq", budget, link=Link("pcie4"))
    assert (stats.evictions, stats.remats, plenty.stats.offloads) != session[:3]


@pytest.mark.parametrize(
    ("offload", "says"),
    [
        ("fast", "offload: cannot read bandwidth 'fast'"),
        (0, "offload: a bandwidth must be positive"),
        (-1e9, "offload: a bandwidth must be positive"),
        ("25 GB", "offload: cannot read bandwidth"),
        ([1], "offload: a bandwidth is a number or a text"),
    ],
)
def test_bad_offload_is_a_clear_error(offload, says):
    with pytest.raises(ValueError, match=says):
        rt.enable(budget="1MiB", offload=offload)


def test_offload_true_measures_the_link_once():
    from tritondtr.runtime import device as devices

    with rt.enable(budget=None, offload=True) as s:
        (torch.randn(64, 64) * 2).sum()
    bw = devices.link_bandwidth(torch.device("cpu"))
    assert s.core.link is not None and s.core.link.bandwidth == bw > 0
    assert devices.link_bandwidth(torch.device("cpu")) == bw  # kept, not measured again


@pytest.mark.gpu
def test_cuda_step_with_offload_to_pinned_memory_equals_eager():
    """The CUDA path: host copies in pinned memory on the session's copy stream, device
    buffers rebuilt byte for byte (NOTE [ Host copies on CUDA ]); three steps, so the
    later ones prefetch."""

    def case():
        c = make("gpt", scale=2)
        c.model.cuda()
        c.inputs = tuple(x.cuda() if torch.is_tensor(x) else x for x in c.inputs)
        return c

    torch.use_deterministic_algorithms(True)
    try:
        ref = case()
        ref_loss = train_step(ref, torch.optim.Adam(ref.model.parameters(), lr=1e-2)).detach()
        with rt.enable(budget=None) as s0:
            c = case()
            train_step(c, torch.optim.Adam(c.model.parameters(), lr=1e-2))
        ref_opt = torch.optim.Adam(ref.model.parameters(), lr=1e-2)
        for _ in range(2):
            ref_loss = train_step(ref, ref_opt).detach()
        c = case()
        opt = torch.optim.Adam(c.model.parameters(), lr=1e-2)
        with rt.enable(budget=int(0.3 * s0.stats.peak_bytes), offload="pcie5") as s:
            for _ in range(3):
                loss = rt.unwrap(train_step(c, opt))
    finally:
        torch.use_deterministic_algorithms(False)
    _equal(c, loss.detach(), ref, ref_loss)
    assert s.stats.offloads > 0 and s.stats.fetches + s.stats.prefetches > 0
    assert s.stats.prefetches > 0


@pytest.mark.gpu
def test_cuda_copies_are_ordered_on_the_device_without_host_waits():
    """NOTE [ Host copies on CUDA ] rules 3 to 5: a write right after a copy out, and a
    read right after a copy back, see the bytes they should, with no host synchronization
    between (the copies are 64 MiB, so an unordered kernel would overtake them)."""
    dev = torch.device("cuda")
    link = HostLink(dev)
    x = torch.randn(16 * 2**20, device=dev)
    want = x.clone()
    host = link.copy_out(0, x)
    assert 0 in link.pending
    link.order([0])  # the write below waits for the copy out, on the device
    x.mul_(-1)
    back = link.copy_back(1, host, x.dtype, x.size(), x.stride(), 0)
    link.order([1])
    got = back * 1  # a read right behind the copy back
    assert torch.equal(got, want)
    link.settle()
    assert not link.pending
    assert torch.equal(host.view(torch.float32), want.cpu())
    assert host.is_pinned()


def test_the_cpu_host_link_copies_any_layout_exactly():
    """NOTE [ Host copies on CUDA ] rule 6: on a CPU device the copies are plain, whole
    storages, so a strided view with an offset comes back as it left; nothing is pending."""
    link = HostLink(torch.device("cpu"))
    base = torch.arange(60, dtype=torch.float64)
    v = base[3:].view(19, 3)[::2].t()  # strided, offset 3
    host = link.copy_out(5, v)
    assert host.numel() == base.numel() * 8 and not link.pending
    back = link.copy_back(5, host, v.dtype, v.size(), v.stride(), v.storage_offset())
    assert torch.equal(back, v) and back.stride() == v.stride()
    assert back.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_a_victim_whose_storage_already_died_is_offloaded_without_a_copy():
    """NOTE [ Storage lifetime ] rule 5: during a freeze the queues are not drained, so a
    storage whose last reference went can still be chosen; offloading it copies nothing
    (found by a reviewer helper: it raised "core storage 0 has no live Storage")."""
    n = 64
    size = n * n * 4

    def cost(op, args, kwargs, out):  # exp is expensive: offloading it pays
        return 1e9 if "exp" in str(op) else 1.0

    def program(p):
        y = p.exp()
        z = y * 3
        s1 = y.sum()
        del y
        x = p * 7
        w = x * 5
        del x
        u = p * 9
        s2 = u.sum()
        p.add_(1)  # a write to memory the recipes read: freeze
        return z, s1, w, s2

    want = program(torch.arange(n * n, dtype=torch.float32).reshape(n, n) / (n * n))
    p = torch.arange(n * n, dtype=torch.float32).reshape(n, n) / (n * n)
    with rt.enable(budget=int(1.5 * size), heuristic="lru", cost=cost, offload="25GB/s") as s:
        got = [rt.unwrap(t.clone()) for t in program(p)]
    assert s.stats.offloads >= 1
    assert all(torch.equal(a, b) for a, b in zip(got, want))
