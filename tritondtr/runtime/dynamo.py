"""What ``torch.compile`` sees of the runtime: nothing; a compiled region inside a session
runs eagerly.

# NOTE [ Dynamo never traces the runtime ]
# 1. While a compiled function runs, dynamo's eval-frame callback sees every Python frame
#    entered below it. It skips them while a non-infra dispatch mode is on the mode stack,
#    but a mode is popped while its own ``__torch_dispatch__`` runs: unguarded, dynamo
#    compiled the session's handler and everything it calls (seconds of compilation for a
#    small MLP, recompile-limit warnings naming ``session.py:dispatch``, slower ops, and
#    ``Storage.__del__`` errors on storages whose ``__init__`` dynamo had traced; measured:
#    see docs/benchmarks.md, Measurements behind the NOTEs, Dynamo never traces the runtime).
# 2. PyTorch's guard for this (``TorchDispatchMode._should_skip_dynamo``, torch 2.11-2.13)
#    wraps the handler in ``torch._dynamo.disable``: a Python wrapper that swaps the
#    eval-frame callback on every call, compiled region or not: a cost on every op of every
#    session (docs/benchmarks.md, Measurements behind the NOTEs, Dynamo never traces the
#    runtime).
# 3. Instead, every way into tritondtr is marked ``@opaque``: from C++ (the handlers of the
#    mode and of the wrapper tensor, the post-accumulate-grad hook, the end-of-backward
#    callback of NOTE [ Leaf gradients ], the ``__del__`` of cells and storages) and from
#    user code (``enable``, ``trace``, entering and exiting a session
#    or a recording, ``evict_all``, and ``boundary.value`` behind ``unwrap``, ``.tolist()``,
#    ``.numpy()`` and printing). Its code object gets dynamo's per-code strategy "skip this
#    frame and every frame it calls" (``FrameExecStrategy(SKIP, SKIP)``, in the code object's
#    extra slot), and the function gets ``_torchdynamo_disable`` (dynamo's tracer breaks the
#    graph at a call to it instead of inlining it): what ``torch.compiler.disable`` does,
#    without its wrapper. Only dynamo reads either, and only while a compiled function runs
#    or is traced: nothing is paid outside compiled regions, a lookup per op inside one.
#    ``torch._dynamo.reset()`` keeps the marks (it clears only codes that reached dynamo's
#    callback, which these never do).
# 4. A compiled region called inside a session runs eagerly, op by op, under the session:
#    dynamo compiles nothing while a non-infra dispatch mode is on the stack, and no graph
#    compiled outside runs either (the mode adds the ``Python`` dispatch keys to every
#    tensor, so every cached graph's tensor guards fail). Its ops are tracked, evicted and
#    recomputed like any other; its values are eager's, bit for bit, whatever the backend
#    (not the compiled module's: inductor may round differently).
# 5. PyTorch 2.11 to 2.13 remember that skip for good (the skipped frame's code is marked
#    skipped; pytorch issue 190286): the compiled function and every Python function it
#    called (the ``forward`` of each module class it ran) then stay eager in every later
#    ``torch.compile``, outside sessions too, until ``torch.compiler.reset()``. tritondtr
#    leaves dynamo's state alone.
# 6. Where this torch has no per-code strategies, ``OPAQUE`` is False and the mode keeps
#    PyTorch's guard of rule 2 (``_Mode._should_skip_dynamo``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["OPAQUE", "opaque"]

try:
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )
except ImportError:  # no per-code strategies in this torch: rule 6
    OPAQUE = False
else:
    OPAQUE = True
    _SKIP_ALL = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)

_F = TypeVar("_F", bound=Callable)
_WHY = "tritondtr's runtime is never traced (docs/runtime.md, torch.compile inside a session)"


def opaque(fn: _F) -> _F:
    """``fn`` itself, its code marked so that dynamo never traces it nor anything it calls
    (NOTE [ Dynamo never traces the runtime ] rule 3)."""
    if OPAQUE:
        set_code_exec_strategy(fn.__code__, _SKIP_ALL)
    fn._torchdynamo_disable = True
    fn._torchdynamo_disable_msg = _WHY
    return fn
