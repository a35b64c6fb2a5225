"""Recipe: a hand loop with ``accelerate`` (``accelerator.backward``, ``accumulate``,
``save_state``) inside one session (docs/integrations.md). 4 optimizer steps of 2 accumulated
batches, an evaluation and a saved state every 2 steps, the loss logged each batch; at half
its measured peak the parameters, the logged losses and the saved state equal the run without
tritondtr, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tritondtr

from .common import assert_evicted_within_budget, assert_same_parameters, half_peak

accelerate = pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")
from accelerate.state import AcceleratorState  # noqa: E402

WIDTH, BATCH = 64, 64


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """An ``Accelerator`` is a process-wide singleton state; each run builds its own."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _loop(out, budget, *, mixed_precision: str, session: bool = True):
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = accelerate.Accelerator(
        cpu=True, gradient_accumulation_steps=2, mixed_precision=mixed_precision
    )
    accelerate.utils.set_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(WIDTH),
        nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(10 * BATCH, WIDTH, generator=g), torch.randint(0, 4, (10 * BATCH,), generator=g)
    )
    train = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    val = torch.utils.data.DataLoader(data, batch_size=2 * BATCH)
    model, opt, train, val = acc.prepare(model, opt, train, val)
    logged, evaluated = [], []

    def run():
        for i, (x, y) in enumerate(train):
            if i == 8:  # 4 optimizer steps
                break
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            logged.append(loss.item())
            if i % 4 == 3:  # every 2 optimizer steps: evaluate, save
                model.eval()
                with torch.no_grad():
                    evaluated.append([F.cross_entropy(model(x), y).item() for x, y in val])
                model.train()
                acc.save_state(out / f"batch{i + 1}")

    if not session:
        run()
        return acc.unwrap_model(model), logged, evaluated, None
    with tritondtr.enable(budget=budget) as s:  # the recipe: the whole loop inside
        run()
    return acc.unwrap_model(model), logged, evaluated, s.stats


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_accelerate_loop_inside_one_session(tmp_path, mixed_precision):
    eager, eager_logged, eager_eval, _ = _loop(
        tmp_path / "eager", None, mixed_precision=mixed_precision, session=False
    )
    *_, measured = _loop(tmp_path / "measure", None, mixed_precision=mixed_precision)
    budget = half_peak(measured)
    model, logged, evaluated, stats = _loop(
        tmp_path / "dtr", budget, mixed_precision=mixed_precision
    )

    assert_evicted_within_budget(stats, budget)
    assert_same_parameters(model, eager)
    assert logged == eager_logged and evaluated == eager_eval and len(evaluated) == 2
    saved = safetensors_torch.load_file(tmp_path / "dtr" / "batch8" / "model.safetensors")
    want = eager.state_dict()
    assert saved.keys() == want.keys() and all(torch.equal(saved[k], want[k]) for k in want)
    if mixed_precision == "bf16":  # autocast ran: its casts were tracked like any op
        assert stats.op_counts["aten._to_copy.default"] > 0
