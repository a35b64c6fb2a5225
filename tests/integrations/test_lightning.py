"""Recipe: Lightning with ``trainer.fit(...)`` inside one session (docs/integrations.md). A
small LightningModule trains 4 optimizer steps of 2 accumulated batches, validates twice,
logs and saves a checkpoint (``ModelCheckpoint`` deep-copies the logged metrics and pickles
them: NOTE [ Copies and pickles ]); at half its measured peak the parameters, the logged
metrics and the checkpoint equal the run without tritondtr, bit for bit."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tritondtr

from .common import assert_evicted_within_budget, assert_same_parameters, half_peak

L = pytest.importorskip("lightning")
# Lightning 2.6's own use of torch's pytree (torch 2.13 deprecates it), not this test's.
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*")

WIDTH, BATCH = 64, 64


class _Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(WIDTH),
            nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4),
        )  # fmt: skip

    def training_step(self, batch, i):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _loader(n: int, seed: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=g), torch.randint(0, 4, (n,), generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


def _fit(out, budget, *, precision: str, session: bool = True):
    L.seed_everything(0, verbose=False)
    model = _Net()
    trainer = L.Trainer(
        max_steps=4, accumulate_grad_batches=2, val_check_interval=4, precision=precision,
        accelerator="cpu", devices=1, default_root_dir=out, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    train, val = _loader(8 * BATCH, 1), _loader(2 * BATCH, 2)
    if not session:
        trainer.fit(model, train, val)
        return model, trainer, None
    with tritondtr.enable(budget=budget) as s:  # the recipe: the whole fit() inside
        trainer.fit(model, train, val)
    return model, trainer, s.stats


@pytest.fixture(autouse=True)
def _quiet_lightning():
    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    yield
    log.setLevel(level)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fit_inside_one_session(tmp_path, precision):
    eager, eager_trainer, _ = _fit(tmp_path / "eager", None, precision=precision, session=False)
    _, _, measured = _fit(tmp_path / "measure", None, precision=precision)
    budget = half_peak(measured)
    model, trainer, stats = _fit(tmp_path / "dtr", budget, precision=precision)

    assert_evicted_within_budget(stats, budget)
    assert_same_parameters(model, eager)
    metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
    assert metrics == {k: v.item() for k, v in eager_trainer.callback_metrics.items()}
    assert metrics.keys() == {"train_loss", "val_loss"}
    (ckpt,) = (tmp_path / "dtr" / "checkpoints").glob("*.ckpt")
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    want = eager.state_dict()
    assert saved.keys() == want.keys() and all(torch.equal(saved[k], want[k]) for k in want)
    if precision == "bf16-mixed":  # autocast ran: its casts were tracked like any op
        assert stats.op_counts["aten._to_copy.default"] > 0
