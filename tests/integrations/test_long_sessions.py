"""A session around a whole training loop keeps what it holds bounded: what it kept per step
before NOTE [ What is tracked ] rule 8 (session.py) grew with every step, for good."""

from __future__ import annotations

import torch
from torch.nn import functional as F

import tritondtr
from tritondtr.demo.tinygpt import GPTConfig, TinyGPT, batches


def _bookkeeping(s) -> tuple[int, int, int]:
    """Hooked leaves, watched addresses, storage ids: what a session keeps across steps."""
    return len(s._hooks), len(s.reads), len(s.storages)


def test_a_whole_loop_session_does_not_grow_with_steps():
    config = GPTConfig(block=32, width=64, layers=2, heads=2)
    torch.manual_seed(0)
    model = TinyGPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batches(config, 2, 8, 1, "cpu")
    with tritondtr.enable(budget=None) as s:
        sizes = []
        for step in range(8):
            x, y = data[step % 2]
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sizes.append(_bookkeeping(s))
    n_params = len(list(model.parameters()))
    assert sizes[2][0] == n_params  # the parameters' hooks, no unpacked t(W) left over
    assert sizes[-1] == sizes[2], sizes
