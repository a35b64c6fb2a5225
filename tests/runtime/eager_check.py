"""The eager check of the runtime's targeted tests: a function's value and its leaves'
gradients under tritondtr equal eager's exactly (torch.equal)."""

import torch

import tritondtr.runtime as rt


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


def value_and_grad(fn, x):
    """``fn()``'s value and the gradient of its one leaf ``x``."""
    x.grad = None
    out = fn()
    out.backward()
    return rt.unwrap(out.detach()).clone(), x.grad.clone()
