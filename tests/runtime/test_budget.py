"""A budget under the runtime: a BudgetError says what did not fit and leaves the session
usable, and the engine is built only once the budget binds (NOTE [ Lazy engine ] in
core/core.py). The budget's accounting over whole steps is test_zoo.py."""

import pytest
import torch

import tritondtr.runtime as rt
from tests.runtime.eager_check import compare, leaf


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
