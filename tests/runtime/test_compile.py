"""torch.compile and sessions (NOTE [ Dynamo never traces the runtime ] in runtime/dynamo.py).

A compiled region called inside a session runs eagerly, op by op, under the session: its
values and gradients equal eager's bit for bit whatever the backend, dynamo compiles nothing
(no frame of tritondtr, and no frame of the user either), no graph compiled outside runs
inside, and nothing is printed, warned or raised unraisably on the way.
"""

import contextlib
import os
import sys
import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo import convert_frame
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import counters

import tritondtr
import tritondtr.runtime as rt
from tritondtr.runtime.dynamo import OPAQUE
from tritondtr.runtime.session import _Mode

BACKENDS = ["eager", "aot_eager", "inductor"]
ROOT = os.path.dirname(tritondtr.__file__)


class Counting:
    """A dynamo backend: ``backend``, counting its compilations and the runs of its graphs."""

    def __init__(self, backend: str) -> None:
        self.backend, self.compiles, self.runs = lookup_backend(backend), 0, 0

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        compiled = self.backend(gm, example_inputs)

        def run(*args):
            self.runs += 1
            return compiled(*args)

        return run


class MLP(torch.nn.Module):
    def __init__(self, width: int = 17) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(width, width, generator=g) / width**0.5)
        self.w2 = torch.nn.Parameter(torch.randn(width, width, generator=g) / width**0.5)

    def forward(self, x):
        h = torch.tanh(x @ self.w1) * 1.5
        return torch.relu(h @ self.w2 + h).sum(dim=1)


def step(model, x):
    """One forward and backward: the loss and the parameters' gradients."""
    for p in model.parameters():
        p.grad = None
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def problem():
    x = torch.randn(5, 17, generator=torch.Generator().manual_seed(1))
    return MLP(), x


def runtime_codes_seen() -> list[str]:
    """tritondtr functions whose frames reached dynamo's callback (compiled or skipped)."""
    seen = (ref() for ref in convert_frame.input_codes.seen)
    return sorted(
        f"{os.path.basename(c.co_filename)}:{c.co_name}"
        for c in seen
        if c is not None and c.co_filename.startswith(ROOT)
    )


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """A skip that dynamo remembered from an earlier test would hide a compilation; none is
    left for later tests either (NOTE [ Dynamo never traces the runtime ] rule 5)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@contextlib.contextmanager
def quietly(capfd):
    """Fails if anything inside reaches stderr, warns, or raises unraisably (``__del__``)."""
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    capfd.readouterr()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        sys.unraisablehook = hook
    assert [str(w.message) for w in caught] == []
    assert [f"{u.exc_type.__name__}: {u.exc_value} in {u.object}" for u in unraisable] == []
    assert capfd.readouterr().err == ""


def test_the_mode_handler_is_marked_not_wrapped():
    """This torch has dynamo's per-code strategies: the handler is marked, and PyTorch's
    per-call guard is not put around it (NOTE [ Dynamo never traces the runtime ] rules 2, 3
    and 6)."""
    assert OPAQUE
    assert _Mode._should_skip_dynamo() is False
    handler = _Mode.__dict__["__torch_dispatch__"]
    assert handler._torchdynamo_disable is True
    assert not hasattr(handler, "__wrapped__")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_region_runs_eagerly_inside_a_session(backend, capfd):
    """The issue's case: a compiled module first called inside a session, forward and
    backward with every storage evicted after each op (so the backward recomputes)."""
    model, x = problem()
    ref_loss, ref_grads = step(model, x)
    counting = Counting(backend)
    compiled = torch.compile(model, backend=counting)
    with quietly(capfd), rt.enable(stress=True) as session:
        loss, grads = step(compiled, x)
        loss = rt.unwrap(loss)
    assert session.stats.rematerializations > 0
    assert torch.equal(loss, ref_loss)
    for g, ref in zip(grads, ref_grads, strict=True):
        assert type(g) is torch.Tensor and torch.equal(g, ref)
    assert (counting.compiles, counting.runs) == (0, 0)
    assert dict(counters["frames"]) == {}
    assert runtime_codes_seen() == []


@pytest.mark.parametrize(
    "backend",
    ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)],
)
def test_graph_compiled_outside_never_runs_inside(backend, capfd):
    """Compiled and run outside first: inside, every cached graph's guards fail (the mode's
    dispatch keys) and the region runs eagerly; the compiled graph does not run there. No
    parameter requires grad: one graph, no backward to compile. Inductor compiles its one
    kernel in this process: a pool of compile workers took longer to start than the compile
    (inductor: 2.6 s warm, 12 s with a cold cache on the 2-core box; with the pool 5 and 14).

    The config's own ``patch``, not pytest's ``monkeypatch``: pytest 9.2 undoes a patch of an
    attribute that a module serves from ``__getattr__`` by deleting it, which hides that
    config entry from the rest of the process (CI failed on it)."""
    import torch._inductor.config

    with torch._inductor.config.patch(compile_threads=1):
        _compiled_outside_then_inside(backend, capfd)


def _compiled_outside_then_inside(backend, capfd) -> None:
    model, x = problem()
    model.requires_grad_(False)
    ref = model(x)
    counting = Counting(backend)
    compiled = torch.compile(model, backend=counting)
    compiled(x)
    assert (counting.compiles, counting.runs) == (1, 1)
    with quietly(capfd), rt.enable(budget=None) as session:
        y = rt.unwrap(compiled(x))
    assert session.stats.ops > 0
    assert torch.equal(y, ref)
    assert (counting.compiles, counting.runs) == (1, 1)
    assert runtime_codes_seen() == []


def test_compiled_step_with_backward_inside_a_session(capfd):
    """The whole step compiled: autograd calls the session's gradient hook and storages die
    while dynamo's callback is installed; none of that reaches dynamo."""
    model, x = problem()
    ref_loss, ref_grads = step(model, x)
    counting = Counting("eager")
    compiled_step = torch.compile(step, backend=counting)
    with quietly(capfd), rt.enable(stress=True):
        loss, grads = compiled_step(model, x)
        loss = rt.unwrap(loss)
    assert torch.equal(loss, ref_loss)
    for g, ref in zip(grads, ref_grads, strict=True):
        assert type(g) is torch.Tensor and torch.equal(g, ref)
    assert counting.compiles == 0
    assert runtime_codes_seen() == []


def test_session_entered_inside_a_compiled_function(capfd):
    """``enable`` met while tracing is not traced: dynamo breaks the graph there and runs the
    rest of the function eagerly, under the session."""
    model, x = problem()
    ref = model(x).detach()

    def fn(x):
        h = x * 1.0
        with tritondtr.enable(budget=None) as session:
            y = model(h)
            ops = session.stats.ops
        return y.detach(), ops

    with quietly(capfd):
        y, ops = torch.compile(fn, backend="eager")(x)
    assert ops > 0
    assert torch.equal(rt.unwrap(y), ref)
    assert counters["frames"]["ok"] == 1  # the graph before ``enable`` (``x * 1.0``)
    assert runtime_codes_seen() == []
