"""Property: random programs under random budgets give eager's results and gradients.

A program is a list of abstract instructions (opcode and small integers) that an interpreter
resolves against the values computed so far, so the same list runs identically in eager mode
and under tritondtr. Instructions cover elementwise and reduction ops, views (transpose,
slices, select, diagonal, flatten, unsqueeze), in-place writes through views of a fresh
buffer (aliases that read the new contents), random ops (dropout, rand_like, bernoulli),
multi-output ops (split, unbind, max with indices, sort, std_mean) and detach. The budget is
None, the stress setting, or a random fraction of the program's measured unlimited peak.

# NOTE [ Random programs ]
# 1. Values are float64 and bounded (tanh, sigmoid, sin: no overflow), so a program never
#    produces inf; every comparison is exact (``torch.equal``).
# 2. In-place ops write a clone made by the same instruction (through a view of it, or the
#    whole of it) and never a tensor that autograd saved, so eager accepts every program.
# 3. A budget below the working set of one op raises ``BudgetError``: a correct outcome, not
#    a mismatch; the test then checks that nothing else happened (no partial results).
"""

from __future__ import annotations

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tritondtr.runtime import BudgetError, enable, unwrap  # noqa: E402

OPCODES = ("unary", "binary", "view", "inplace", "random", "multi", "reduce", "detach")
UNARY = (
    torch.tanh,
    torch.sigmoid,
    torch.sin,
    torch.relu,
    lambda t: t * 0.5,
    lambda t: t.square().tanh(),
    torch.neg,
)
BINARY = (torch.add, torch.mul, torch.sub, torch.maximum, lambda a, b: torch.atan2(a, b + 3))


def _pick(vals, k: int) -> torch.Tensor:
    return vals[k % len(vals)]


def _view(t: torch.Tensor, kind: int) -> torch.Tensor:
    kind %= 6
    if t.dim() == 0:
        return t.unsqueeze(0)
    if kind == 0 and t.dim() >= 2:
        return t.transpose(0, 1)
    if kind == 1 and t.shape[0] > 1:
        return t[1:]
    if kind == 2 and t.dim() >= 2:
        return t[0]
    if kind == 3 and t.dim() >= 2:
        return t.diagonal()
    if kind == 4:
        return t.flatten() if t.is_contiguous() else t.unsqueeze(0)
    return t.unsqueeze(-1)


def _binary_operand(a: torch.Tensor, b: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``b``, or its sum when it does not broadcast with ``a`` (in place: to ``a``'s shape)."""
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
        ok = shape == a.shape or not inplace
    except RuntimeError:
        ok = False
    return b if ok else b.sum()


def run_program(
    leaves: list[torch.Tensor], program: list[tuple[int, int, int, int]], seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run ``program`` on (clones of) ``leaves``; returns (every value, gradients of the
    leaves) as plain tensors. NOTE [ Random programs ]."""
    torch.manual_seed(seed)
    vals = [x.clone() for x in leaves]
    for code, a, b, c in program:
        op = OPCODES[code % len(OPCODES)]
        x = _pick(vals, a)
        if op == "unary":
            vals.append(UNARY[c % len(UNARY)](x))
        elif op == "binary":
            vals.append(BINARY[c % len(BINARY)](x, _binary_operand(x, _pick(vals, b))))
        elif op == "view":
            vals.append(_view(x, c))
        elif op == "inplace":
            buf = x.clone()
            target = _view(buf, b) if c % 2 else buf
            kind = c // 2 % 3
            if kind == 0:
                target.mul_(1.5)
            elif kind == 1:
                target.add_(_binary_operand(target, _pick(vals, b), inplace=True).tanh())
            else:
                target.sigmoid_()
            vals += [buf, target]
        elif op == "random":
            kind = c % 3
            if kind == 0:
                vals.append(torch.nn.functional.dropout(x, p=0.3, training=True))
            elif kind == 1:
                vals.append(x * torch.rand_like(x))
            else:
                vals.append(x * torch.bernoulli(torch.full_like(x, 0.5)))
        elif op == "multi":
            kind = c % 5
            if x.dim() == 0:
                x = x.unsqueeze(0)
            if kind == 0:
                vals += list(x.split(max(1, x.shape[0] // 2)))
            elif kind == 1:
                vals += list(x.unbind(0))
            elif kind == 2:
                m, idx = x.max(dim=0)
                vals += [m, idx.to(x.dtype)]
            elif kind == 3:
                vals += list(x.sort(dim=-1))[:1]
            else:
                vals += list(torch.std_mean(x, dim=0))
        elif op == "reduce":
            vals.append(x.sum(dim=b % x.dim()) if x.dim() else x * 2)
        else:
            vals.append(x.detach())
    diff = [v for v in vals if v.requires_grad]
    loss = sum(v.sum() * (k + 1) / len(diff) for k, v in enumerate(diff))
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return (
        [unwrap(v).detach().clone() for v in vals],
        [unwrap(g).clone() if g is not None else None for g in grads],
    )


def _leaves() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = ((4, 6), (4, 6), (6,), (3, 4, 6))
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """``torch.equal`` that also holds NaN equal to NaN at the same positions (std of one
    element is NaN in eager too)."""
    nx, ny = x.isnan(), y.isnan()
    return torch.equal(nx, ny) and torch.equal(x.masked_fill(nx, 0), y.masked_fill(ny, 0))


def _same(xs, ys) -> bool:
    return len(xs) == len(ys) and all(
        (x is None and y is None) or (x is not None and y is not None and _equal(x, y))
        for x, y in zip(xs, ys)
    )


instruction = st.tuples(*(st.integers(0, 63) for _ in range(4)))
budgets = st.tuples(
    st.sampled_from(["unlimited", "stress", "fraction", "fraction"]), st.floats(0.05, 1.0)
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=st.lists(instruction, min_size=1, max_size=25),
    budget=budgets,
    seed=st.integers(0, 2**31 - 1),
)
# std of a single element is NaN, in eager too: NaN must compare equal at the same places.
@example(program=[(5, 2, 0, 1), (5, 4, 0, 54)], budget=("unlimited", 1.0), seed=0)
def test_random_programs_equal_eager(program, budget, seed):
    leaves = _leaves()
    ref_vals, ref_grads = run_program(leaves, program, seed)
    with enable(budget=None) as s:
        run_program(leaves, program, seed)
    peak = s.stats.peak_bytes
    kind, fraction = budget
    kw = (
        {"stress": True}
        if kind == "stress"
        else {"budget": None if kind == "unlimited" else max(1, int(peak * fraction))}
    )
    try:
        with enable(**kw) as session:
            vals, grads = run_program(leaves, program, seed)
    except BudgetError:
        event("budget below one op's working set")
        assert session.stats.budget_errors == 1
        return
    event(f"budget: {kind}")
    event("rematerialized" if session.stats.rematerializations else "nothing rematerialized")
    assert _same(vals, ref_vals), "values differ from eager"
    assert _same(grads, ref_grads), "gradients differ from eager"
    if kw.get("budget") is not None:
        # NOTE [ Budget accounting ] rule 2: at most the outputs of the one op in flight over
        # the budget; the largest value of this program bounds those outputs.
        largest = max(v.untyped_storage().nbytes() for v in ref_vals)
        assert session.stats.peak_bytes <= kw["budget"] + 2 * largest
