"""Small checks of the runtime on a given device, importable by a GPU check script as well as
by the tests (which run them on the CPU, some with the CPU playing CUDA)."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch

import tritondtr.runtime as rt
from tritondtr.runtime import session as _session

_NONDET_OPS = ("aten.index_add_.default", "aten.scatter_add.default")


@contextlib.contextmanager
def counting_replays():
    """A Counter of the recipes the session recomputes, by op name (``"aten.mm.default"``)."""
    counts: Counter = Counter()
    run = _session.run_recipe

    def counted(rec, *args, **kwargs):
        counts[rec.info.name] += 1
        return run(rec, *args, **kwargs)

    _session.run_recipe = counted
    try:
        yield counts
    finally:
        _session.run_recipe = run


def nondeterministic_step(device, w, src):
    """A loss whose backward reads an ``index_add_`` written into a tracked tensor and a
    fresh ``scatter_add`` output (both nondeterministic on CUDA), and recomputes ``tanh``."""
    idx = torch.tensor([0, 3, 3, 1, 5], device=device)
    h = (src * 1.5).tanh()
    acc = w * 1  # a tracked tensor, then written in place
    acc.index_add_(0, idx, h)
    s = torch.zeros(6, 4, device=device).scatter_add(0, idx[:, None].expand(5, 4), h.sin())
    return (acc * s).sum(), acc, s


def probe_nondeterministic(device) -> dict:
    """On ``device``, under ``enable(stress=True)``: whether the outputs of ``index_add_``
    (in place) and ``scatter_add`` are pinned and never recomputed while other outputs are
    (``pinned``), and whether the gradients equal eager's bitwise (``grads_equal``)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=gen).to(device).requires_grad_()
    src = torch.randn(5, 4, generator=gen).to(device).requires_grad_()
    nondeterministic_step(device, w, src)[0].backward()
    eager = (w.grad.clone(), src.grad.clone())
    w.grad = src.grad = None
    with counting_replays() as replays, rt.enable(stress=True) as session:
        loss, acc, s = nondeterministic_step(device, w, src)
        flags = [session.core.pinned[t._cell.storage.sid] for t in (acc, s)]
        del acc, s
        loss.backward()
    return {
        "pinned": all(flags)
        and not any(replays[name] for name in _NONDET_OPS)
        and replays["aten.tanh.default"] > 0,
        "grads_equal": torch.equal(w.grad, eager[0]) and torch.equal(src.grad, eager[1]),
        "replays": dict(replays),
    }
