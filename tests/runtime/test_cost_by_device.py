"""Cost models by device (NOTE [ Cost models ] rules 8-10 in tritondtr/runtime/cost.py, NOTE
[ Device time ] in tritondtr/runtime/events.py): ``auto`` resolves to ``measured`` on a CPU
session and to the H100 model on CUDA; the H100 model prices each dtype at its datasheet rate
and float32 by the TF32 flags; ``events`` is refused without CUDA and applies event times
without waiting for them (fake events here, real ones on a GPU); a cost set later reaches the
engine's choice."""

from __future__ import annotations

import weakref
from dataclasses import replace

import pytest
import torch

import tritondtr
import tritondtr.runtime as rt
from tests import zoo
from tests.core_executor import Counting
from tritondtr.core import Core
from tritondtr.engine.residency import EVICTED, RESIDENT
from tritondtr.runtime import H100_SXM, CostModel, GPUCost, RuntimeConfig
from tritondtr.runtime.cost import describe, resolve
from tritondtr.runtime.events import DeviceClock, OpTimer
from tritondtr.traceformat.trace import EventKind

aten = torch.ops.aten
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


# ------------------------------------------------------------------ auto, by device
def test_auto_is_the_default_and_is_measured_on_a_cpu_session():
    with tritondtr.trace() as rec:
        torch.randn(8, requires_grad=True).exp().sum().backward()
    assert rec.session.config.cost is CostModel.AUTO
    assert rec.session.cost_fn is None  # measured: the op's wall time
    assert rec.trace.meta["cost_model"] == "measured"


def test_models_resolve_by_device():
    assert resolve(CostModel.AUTO, CPU) is None
    assert resolve(CostModel.MEASURED, CUDA) is None
    assert resolve(CostModel.ANALYTIC, CPU) == rt.AnalyticCost()  # the nominal machine
    for model in (CostModel.AUTO, CostModel.ANALYTIC, CostModel.EVENTS):
        fn = resolve(model, CUDA)
        assert isinstance(fn, GPUCost) and fn.name == "h100-sxm"
    assert describe(CostModel.AUTO, CPU) == "measured"
    assert describe(CostModel.AUTO, None) == "auto"
    assert describe(CostModel.AUTO, CUDA).startswith("h100-sxm(matmul_tf32=")


# --------------------------------------------------------------------- the H100 model
def _mm(dtype):
    a, b = torch.ones(64, 128, dtype=dtype), torch.ones(128, 32, dtype=dtype)
    return (a, b), a @ b


@pytest.mark.parametrize(
    "dtype, rate",
    [
        (torch.float64, 67e12),
        (torch.float32, 67e12),
        (torch.bfloat16, 989.4e12),
        (torch.float16, 989.4e12),
    ],
    ids=["fp64-tensor-cores", "fp32-no-tf32", "bf16", "fp16"],
)
def test_h100_prices_a_matmul_at_its_dtype_rate(dtype, rate):
    fn = H100_SXM  # matmul_tf32 False: PyTorch's default
    args, out = _mm(dtype)
    nbytes = sum(t.nbytes for t in (*args, out))
    want = 3000.0 + nbytes * (1e9 / 3.35e12) + 2 * 64 * 128 * 32 * (1e9 / rate)
    assert fn(aten.mm.default, args, {}, out) == pytest.approx(want, rel=1e-12)


def test_h100_reads_the_tf32_flags_when_the_model_is_chosen():
    old = torch.backends.cuda.matmul.allow_tf32
    args, out = _mm(torch.float32)
    x, w = torch.ones(1, 3, 9, 9), torch.ones(4, 3, 3, 3)
    conv_args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    conv_out = torch.nn.functional.conv2d(x, w)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        # cudnn's flags are set through its context manager (others' tests may have
        # disabled setting them globally)
        with torch.backends.cudnn.flags(allow_tf32=False):
            fn = H100_SXM.with_flags()
        torch.backends.cuda.matmul.allow_tf32 = False  # later changes do not reach fn
        assert fn.matmul_tf32 and not fn.conv_tf32
        fast = fn(aten.mm.default, args, {}, out)
        slow = H100_SXM(aten.mm.default, args, {}, out)
        flop = 2 * 64 * 128 * 32
        assert fast - slow == pytest.approx(flop * (1e9 / 494.7e12 - 1e9 / 67e12), rel=1e-9)
        conv = aten.convolution.default
        fp32 = replace(H100_SXM, conv_tf32=False)(conv, conv_args, {}, conv_out)
        assert fn(conv, conv_args, {}, conv_out) == fp32  # cudnn's flag was off
        assert H100_SXM(conv, conv_args, {}, conv_out) < fp32  # PyTorch's default: TF32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_a_gpu_model_refuses_a_bad_rate():
    with pytest.raises(ValueError, match="bytes_per_s must be a finite number > 0"):
        GPUCost("x", 1, 1, 1, 1, 1, 0, 1)


# ----------------------------------------------------------------------- events on CPU
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_events_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match=r"CUDA is not available.*'measured'.*'analytic'"):
        RuntimeConfig(cost="events")


def test_events_on_a_cpu_device_is_a_clear_error():
    with pytest.raises(ValueError, match=r"device is cpu: use cost='measured'"):
        resolve(CostModel.EVENTS, CPU)


# ------------------------------------------------------------- pending events (fakes)
class _Event:
    """A fake CUDA event: ``done`` says whether the stream reached it; ``at`` is its time in
    ms once recorded (``clock`` is shared by the events of one test)."""

    def __init__(self, clock: list) -> None:
        self.clock, self.done, self.at, self.waited = clock, False, None, False

    def record(self) -> None:
        self.at = self.clock[0]

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = self.waited = True

    def elapsed_time(self, end) -> float:
        return end.at - self.at


class _Storage:
    def __init__(self, sid: int) -> None:
        self.sid, self.recipe = sid, object()


def _timed_core():
    core = Core(10**6, "dtr_eq", Counting(), backend="torch")
    core.start(CPU)
    core.sync()
    clock, events = [0.0], []

    def event():
        events.append(_Event(clock))
        return events[-1]

    return core, OpTimer(core, event), clock, events


def _op(core, timer, clock, estimate: float, ms: float, n: int = 1) -> list[_Storage]:
    """One op of ``ms`` on the device, priced ``estimate`` ns, creating ``n`` storages."""
    timer.start()
    clock[0] += ms
    timer.stop(estimate)
    made = []
    for _ in range(n):
        core.begin("op")
        s = _Storage(core.new(100, estimate, (), "op"))
        core.end()
        timer.made(weakref.ref(s))
        made.append(s)
    timer.done()
    return made


def test_an_event_time_replaces_the_estimate_once_it_completes_in_order():
    core, timer, clock, events = _timed_core()
    a = _op(core, timer, clock, 5000.0, 0.002, n=2)  # 2 us on the device, two outputs
    b = _op(core, timer, clock, 7000.0, 0.030)
    assert [core.cost[s.sid] for s in (*a, *b)] == [5000.0, 5000.0, 7000.0]  # pending
    events[3].done = True  # b completed, a not: the queue waits for a (stream order)
    timer.done()
    assert core.cost[b[0].sid] == 7000.0 and len(timer.pending) == 2
    events[1].done = True
    timer.done()
    assert [core.cost[s.sid] for s in (*a, *b)] == pytest.approx([2000.0, 2000.0, 30000.0])
    assert not timer.pending
    for s in (*a, *b):  # the engine's column too
        assert core.engine.table.host_cost[core.eslot[s.sid]] == pytest.approx(core.cost[s.sid])
    core.check_invariants()


def test_storages_gone_or_fused_keep_their_cost_and_the_exit_waits():
    core, timer, clock, events = _timed_core()
    (a,) = _op(core, timer, clock, 5000.0, 0.001)
    (b,) = _op(core, timer, clock, 5000.0, 0.004)
    kept = core.cost[a.sid]
    a.sid = -1  # fused into a later version (NOTE [ Fused versions ]): its cost moved there
    del b  # its Storage died
    (c,) = _op(core, timer, clock, 5000.0, 0.009)
    assert not any(e.done for e in events)
    timer.finish()  # the session's exit: waits for every pending op
    assert events[1].waited and events[5].waited and not timer.pending
    assert core.cost[0] == kept and core.cost[1] == 5000.0
    assert core.cost[c.sid] == pytest.approx(9000.0)


def test_a_measured_cost_changes_the_next_victim():
    """NOTE [ Bounded choice ] rule 2: a cost set after a full scoring is a change."""
    core = Core(350, "dtr_eq", Counting(), backend="torch")
    core.start(CPU)
    core.sync()
    sid = {}
    for name, cost in (("a", 1.0), ("b", 1000.0), ("c", 10.0), ("d", 5000.0)):
        core.begin(name)
        sid[name] = core.new(100, cost, (), name)
        core.end()
    core.begin("e")  # 400 > 350: a full scoring, ``a`` goes
    sid["e"] = core.new(100, 5000.0, (), "e")
    core.end()
    assert core.state[sid["a"]] == EVICTED and core.state[sid["c"]] == RESIDENT
    core.set_cost(sid["b"], 0.5)
    core.begin("f")  # ``c`` (10) would go without the new cost of ``b``
    core.end()
    assert core.state[sid["b"]] == EVICTED and core.state[sid["c"]] == RESIDENT
    core.check_invariants()


def test_device_clock_adds_completed_pairs_and_the_rest_at_exit():
    clock, events = [0.0], []

    def event():
        events.append(_Event(clock))
        return events[-1]

    st = rt.SessionStats()
    dc = DeviceClock(st, event)
    t = dc.start()
    clock[0] += 3.0
    dc.stop(t, "recompute_s")
    t = dc.start()
    clock[0] += 1.0
    dc.stop(t, "select_s")
    assert st.recompute_s == 0.0 and st.select_s == 0.0  # nothing completed, nothing waited
    events[1].done = True
    dc.poll()
    assert st.recompute_s == pytest.approx(3e-3) and st.select_s == 0.0
    dc.finish()
    assert st.select_s == pytest.approx(1e-3) and events[3].waited


# ------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("cost", ["events", "auto"])
def test_gradients_equal_eager_on_cuda(cost):
    def factory():
        torch.manual_seed(0)
        case = zoo.make("gpt", seed=0)
        case.model.cuda()
        case.inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in case.inputs)
        opt = torch.optim.SGD(case.model.parameters(), lr=1e-2)
        return case, lambda: zoo.train_step(case, opt)

    ref, ref_step = factory()
    ref_loss = ref_step().detach()
    with tritondtr.enable() as s:
        factory()[1]()
    peak = s.stats.peak_bytes
    case, step = factory()
    with tritondtr.enable(budget=int(0.4 * peak), cost=cost) as s:
        loss = rt.unwrap(step().detach())
    assert s.stats.evictions > 0 and s.stats.rematerializations > 0
    assert s.stats.recompute_s > 0 and s.clock is not None and not s.clock.pending  # device time
    assert s.core.clock is s.clock  # the core's selections are timed on the device too
    assert s.timer is None or not s.timer.pending  # applied, at the latest at exit
    assert torch.equal(loss, ref_loss)
    for (n, p), (_, q) in zip(case.model.named_parameters(), ref.model.named_parameters()):
        assert torch.equal(p.grad, q.grad), n


@pytest.mark.gpu
def test_events_on_a_cpu_session_is_a_clear_error_on_a_cuda_machine():
    err = pytest.raises(ValueError, match=r"device is cpu: use cost='measured'")
    with err, tritondtr.enable(cost="events", device="cpu"):
        torch.ones(3, requires_grad=True).exp()


@pytest.mark.gpu
def test_events_session_waits_past_cpu_ops_for_the_first_cuda_output():
    """NOTE [ Session device ] rule 2: a CPU op first neither fixes the device nor prices its
    output under ``events`` (that output stays plain)."""
    with pytest.warns(UserWarning, match="on cpu"), tritondtr.enable(cost="events") as s:
        torch.ones(3, requires_grad=True).exp()
        torch.ones(3, device="cuda", requires_grad=True).exp()
    assert s.core.device.type == "cuda"


def test_a_trace_under_events_holds_each_ops_device_time():
    """NOTE [ Recording a trace ] rule 6: under ``events`` the trace's CALL costs are the
    ops' device times, read from their events when the trace is built, not the estimates
    the run scored with. On the CPU a fake timer stands in for CUDA's (each event records
    1 us after the one before: every op takes 1 us, 1000 ns, on the "device")."""
    clock = [0.0]

    def event():
        clock[0] += 0.001
        return _Event(clock)

    x = torch.randn(64, 64, requires_grad=True)
    with tritondtr.trace(None, cost=H100_SXM) as rec:
        rec.session.timer = OpTimer(rec.session.core, event)
        y = (x @ x).relu().sum()
        y.backward()
    t = rec.trace
    calls = t.arg[t.kind == EventKind.CALL]
    costs = t.op_cost[calls].tolist()
    assert len(costs) == 8 and t.meta["costs"] == "device time (CUDA events)"
    assert costs == pytest.approx([1000.0] * 8)
    with tritondtr.trace(None, cost=H100_SXM) as plain:  # the estimates otherwise
        (x @ x).relu().sum().backward()
    assert plain.trace.meta["costs"] == "as the run scored"
    t = plain.trace
    assert t.op_cost[t.arg[t.kind == EventKind.CALL]].min() > 1000.0  # the H100 estimates
