"""The session's device, memory-share budgets, the device peak and where decisions are made
(NOTE [ Session device ], [ Memory share budgets ], [ Device peak ] in runtime/device.py;
NOTE [ Decisions on the host ] in core/core.py). The CUDA halves run on a GPU only."""

from __future__ import annotations

import warnings

import pytest
import torch

import tritondtr
from tests import zoo
from tritondtr.runtime import RuntimeConfig
from tritondtr.runtime import device as devices


def _step(case, opt):
    return zoo.train_step(case, opt)


def _run(budget_of, **kw):
    """The zoo GPT's step under ``enable(budget_of(peak), **kw)``: (stats, loss, grads)."""
    case = zoo.make("gpt", seed=0)
    with tritondtr.enable(budget=None) as s:
        case.loss(case.model, case.inputs).backward()
    peak = s.stats.peak_bytes
    case = zoo.make("gpt", seed=0)
    opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
    with tritondtr.enable(budget=budget_of(peak), **kw) as s:
        loss = _step(case, opt)
    return s.stats, loss, [p.detach().clone() for p in case.model.parameters()]


def _eager():
    case = zoo.make("gpt", seed=0)
    opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
    loss = _step(case, opt)
    return loss, [p.detach().clone() for p in case.model.parameters()]


# ------------------------------------------------------------------ budgets
@pytest.mark.parametrize(
    "text, fraction",
    [("auto", 0.9), ("AUTO", 0.9), ("80%", 0.8), (" 100 % ", 1.0), ("0.5%", 0.005)],
)
def test_share_budgets_parse(text, fraction):
    share = RuntimeConfig(budget=text).budget
    assert isinstance(share, devices.MemoryShare)
    assert share.fraction == fraction


@pytest.mark.parametrize("text", ["120%", "0%", "-5%", "x%", "%"])
def test_bad_share_budgets_say_what_to_write(text):
    with pytest.raises(ValueError, match=r"%"):
        RuntimeConfig(budget=text)


def test_auto_budget_is_a_share_of_memavailable_on_cpu(monkeypatch):
    monkeypatch.setattr(devices, "free_bytes", lambda device: 1000 * 2**20)
    case = zoo.make("mlp", seed=0)
    with tritondtr.enable(budget="50%") as s:
        case.loss(case.model, case.inputs).backward()
    assert s.stats.budget == 500 * 2**20
    with tritondtr.enable(budget="auto") as s:
        pass
    assert s.stats.budget == int(1000 * 2**20 * 0.9)


def test_free_bytes_reads_memavailable():
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    got = devices.free_bytes(torch.device("cpu"))
    assert abs(got - avail) < 2**30  # the same counter, read a moment apart


def test_a_share_budget_evicts_like_the_bytes_it_resolves_to(monkeypatch):
    """A share is only another way to write a byte budget: same evictions, same gradients."""
    stats_b, loss_b, params_b = _run(lambda peak: peak // 2, cost="analytic")  # no timing noise
    monkeypatch.setattr(devices, "free_bytes", lambda device: stats_b.budget * 2)
    stats_s, loss_s, params_s = _run(lambda peak: "50%", cost="analytic")
    assert stats_s.budget == stats_b.budget
    assert stats_s.evictions == stats_b.evictions > 0
    assert torch.equal(loss_s, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(params_s, params_b))


# ------------------------------------------------------------------ device
@pytest.mark.parametrize(
    "device, match",
    [("gpu", "names no device"), (3, "must be a torch.device"), ("meta", "CPU or CUDA")],
)
def test_bad_device_is_a_clear_error(device, match):
    with pytest.raises(ValueError, match=match):
        tritondtr.enable(device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA message")
def test_cuda_device_without_cuda_says_so_at_entry():
    s = tritondtr.enable(device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"), s:
        pass


def test_the_rule_of_the_first_output():
    """NOTE [ Session device ] rule 2, as a function of (device so far, CUDA available, out)."""
    cpu, cuda, meta = torch.device("cpu"), torch.device("cuda", 0), torch.device("meta")
    assert devices.tracks(None, False, cpu)
    assert not devices.tracks(None, True, cpu)  # a GPU machine waits for a CUDA output
    assert devices.tracks(None, True, cuda)
    assert not devices.tracks(None, False, meta)
    assert devices.tracks(cuda, True, cuda) and not devices.tracks(cuda, True, cpu)


def test_cpu_outputs_wait_for_cuda_and_warn_once(monkeypatch):
    """On a GPU machine (played here: the session believes CUDA is available), CPU outputs
    stay plain, with one warning naming the op and the device; nothing is tracked."""
    case = zoo.make("mlp", seed=0)
    s = tritondtr.enable(budget=None)
    s._cuda = True
    with pytest.warns(UserWarning, match=r"aten\.\w+.*on cpu.*device='cpu'") as rec, s:
        case.loss(case.model, case.inputs).backward()
    assert len([w for w in rec if "tritondtr" in str(w.message)]) == 1
    assert s.stats.peak_bytes == 0 and s.core.device is None


def test_named_cpu_device_tracks_without_a_warning(monkeypatch):
    case = zoo.make("mlp", seed=0)
    s = tritondtr.enable(budget=None, device="cpu")
    s._cuda = True  # even on a GPU machine, device='cpu' tracks CPU tensors
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with s:
            case.loss(case.model, case.inputs).backward()
    assert s.stats.peak_bytes > 0 and s.core.device == torch.device("cpu")


def test_no_device_peak_on_cpu():
    case = zoo.make("mlp", seed=0)
    with tritondtr.enable(budget=None) as s:
        case.loss(case.model, case.inputs).backward()
    assert s.stats.device_peak_bytes is None


# ------------------------------------------------------------------ decisions
def test_host_table_decides_without_device_syncs():
    stats, loss, params = _run(lambda peak: peak // 2)
    ref_loss, ref_params = _eager()
    assert stats.evictions > 0
    assert stats.device_syncs == 0
    assert stats.backend == "torch on cpu"
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))


def test_bad_table_place():
    with pytest.raises(ValueError, match="table place"):
        tritondtr.enable(table="gpu")


# ------------------------------------------------------------------ CUDA
def _gpt_cuda(budget, scale=4, **kw):
    case = zoo.make("gpt", seed=0, scale=scale)
    case.model.cuda()
    case.inputs = tuple(x.cuda() for x in case.inputs)
    opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
    if budget is False:
        loss = _step(case, opt)
        return None, loss, [p.detach().clone() for p in case.model.parameters()]
    with tritondtr.enable(budget=budget, **kw) as s:
        loss = _step(case, opt)
    return s.stats, loss, [p.detach().clone() for p in case.model.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("table", ["host", "device"])
def test_cuda_decisions_by_table_place(table):
    torch.use_deterministic_algorithms(True)
    try:
        _, ref_loss, ref_params = _gpt_cuda(False)
        peak, _, _ = _gpt_cuda(None)
        stats, loss, params = _gpt_cuda(peak.peak_bytes // 2, table=table)
    finally:
        torch.use_deterministic_algorithms(False)
    assert stats.evictions > 0
    assert stats.backend == ("torch on cpu" if table == "host" else "triton on cuda:0")
    assert (stats.device_syncs == 0) == (table == "host")
    assert stats.device_peak_bytes is not None and stats.device_peak_bytes >= stats.peak_bytes
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))


@pytest.mark.gpu
def test_cuda_session_waits_for_the_first_cuda_output():
    case = zoo.make("mlp", seed=0)
    case.model.cuda()
    x = case.inputs[0].cuda()
    with pytest.warns(UserWarning, match="on cpu"), tritondtr.enable(budget=None) as s:
        mask = torch.ones(3, requires_grad=True) * 2  # a CPU op with grad on comes first
        case.model(x).sum().backward()
    assert s.core.device.type == "cuda" and s.stats.peak_bytes > 0
    assert not tritondtr.runtime.is_tracked(mask)


@pytest.mark.gpu
def test_cuda_step_on_a_side_stream_is_exact():
    """NOTE [ Side streams ]: a step run on a side stream under stress (every storage evicted
    after every op, so buffers are freed while that stream may still read them). Scale 1:
    stress's cascades grow with depth squared (scale 4: 356k recomputations, 99 s on an
    H200; scale 1: 24k)."""
    torch.use_deterministic_algorithms(True)
    try:
        _, ref_loss, ref_params = _gpt_cuda(False, scale=1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            case = zoo.make("gpt", seed=0, scale=1)
            case.model.cuda()
            case.inputs = tuple(x.cuda() for x in case.inputs)
            opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
            with tritondtr.enable(stress=True) as s:
                loss = _step(case, opt)
        torch.cuda.synchronize()
    finally:
        torch.use_deterministic_algorithms(False)
    assert s._side_seen and s.stats.rematerializations > 0
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(p.detach(), r) for p, r in zip(case.model.parameters(), ref_params))


def test_a_changed_precision_flag_refuses_the_replay():
    """NOTE [ Precision flags ]: the check a CUDA session runs before every recomputation."""
    start = devices.precision_flags()
    devices.check_precision(start, "aten.mm.default")  # unchanged: nothing to say
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not before
    try:
        with pytest.raises(RuntimeError, match=r"aten\.mm\.default.*allow_tf32.*before"):
            devices.check_precision(start, "aten.mm.default")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
