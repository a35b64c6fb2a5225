"""Recipe: a plain PyTorch loop, with one session around the whole loop or one per step
(docs/integrations.md). TinyGPT (tritondtr.demo) trains 4 optimizer steps of 2 accumulated
micro-batches with an LR schedule, evaluates and saves a checkpoint every 2 steps, logs the
loss, in float32 and under CPU bfloat16 autocast; at half the measured peak the parameters,
the optimizer state, the logs and the checkpoint equal the run without tritondtr, bit for
bit."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn import functional as F

import tritondtr
from tritondtr.demo.tinygpt import GPTConfig, TinyGPT, batches

from .common import assert_evicted_within_budget, assert_same_parameters, half_peak

CONFIG = GPTConfig(block=32, width=64, layers=2, heads=2)
ACCUMULATE, STEPS = 2, 4


def _autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


class _Run:
    """The model, optimizer, schedule and data of one run, built alike every time."""

    def __init__(self, out, bf16: bool) -> None:
        torch.manual_seed(0)
        self.model = TinyGPT(CONFIG)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
        self.data = batches(CONFIG, STEPS * ACCUMULATE, 8, 1, "cpu")
        self.held_out = batches(CONFIG, 2, 8, 2, "cpu")
        self.out, self.bf16 = out, bf16
        self.logged, self.evaluated = [], []

    def loss(self, x, y):
        with _autocast(self.bf16):
            logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def step(self, k: int) -> None:
        """Optimizer step ``k``: forward and backward of its micro-batches, the update, the
        log; every 2 steps an evaluation and a checkpoint."""
        for x, y in self.data[k * ACCUMULATE : (k + 1) * ACCUMULATE]:
            loss = self.loss(x, y) / ACCUMULATE
            loss.backward()
            self.logged.append(loss.item())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if k % 2 == 1:
            self.model.eval()
            with torch.no_grad():
                self.evaluated.append([self.loss(x, y).item() for x, y in self.held_out])
            self.model.train()
            state = {"model": self.model.state_dict(), "opt": self.opt.state_dict()}
            torch.save(state, self.out / f"step{k + 1}.pt")


def _whole_loop(tmp_path, bf16: bool, budget, *, session: bool = True) -> tuple:
    tmp_path.mkdir()
    run = _Run(tmp_path, bf16)
    with tritondtr.enable(budget=budget) if session else contextlib.nullcontext() as s:
        for k in range(STEPS):
            run.step(k)
    return run, s


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_one_session_around_the_loop(tmp_path, bf16):
    eager, _ = _whole_loop(tmp_path / "eager", bf16, None, session=False)
    _, measured = _whole_loop(tmp_path / "measure", bf16, None)
    budget = half_peak(measured.stats)
    run, s = _whole_loop(tmp_path / "dtr", bf16, budget)

    assert_evicted_within_budget(s.stats, budget)
    _assert_same_run(run, eager)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_one_session_per_step(tmp_path, bf16):
    eager, _ = _whole_loop(tmp_path / "eager", bf16, None, session=False)
    (tmp_path / "dtr").mkdir()
    run = _Run(tmp_path / "dtr", bf16)
    with tritondtr.enable(budget=None) as first:  # the first step measures
        run.step(0)
    budget = half_peak(first.stats)
    evictions = 0
    for k in range(1, STEPS):
        with tritondtr.enable(budget=budget) as s:
            run.step(k)
        assert s.stats.peak_bytes <= budget + s.stats.max_op_out_bytes
        evictions += s.stats.evictions
    assert evictions > 0
    _assert_same_run(run, eager)


def _assert_same_run(run: _Run, eager: _Run) -> None:
    assert_same_parameters(run.model, eager.model)
    assert run.logged == eager.logged and run.evaluated == eager.evaluated
    got, want = run.opt.state_dict()["state"], eager.opt.state_dict()["state"]
    for i, state in want.items():
        assert all(torch.equal(got[i][k], v) for k, v in state.items() if torch.is_tensor(v))
    saved = torch.load(run.out / f"step{STEPS}.pt")
    want = eager.model.state_dict()
    assert all(torch.equal(saved["model"][k], v) for k, v in want.items())


class _Noisy(torch.utils.data.Dataset):
    """Samples made by ops in ``__getitem__`` (augmentation). A worker forked inside the
    session runs them under its copy of the session (the dispatch mode is inherited); the
    collate function stacks them into shared memory it allocated, a plain tensor."""

    def __len__(self) -> int:
        return 128

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        return (x * 2 + 1).tanh(), int(x.sum() > 0)


def _worker_loop(workers: int, budget, *, session: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 2),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_Noisy(), batch_size=32, num_workers=workers)
    with tritondtr.enable(budget=budget) if session else contextlib.nullcontext() as s:
        for x, y in loader:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return model, s


def test_dataloader_workers_inside_the_session():
    eager, _ = _worker_loop(0, None, session=False)
    _, measured = _worker_loop(0, None)
    budget = half_peak(measured.stats)
    model, s = _worker_loop(1, budget)
    assert_evicted_within_budget(s.stats, budget)
    assert_same_parameters(model, eager)
