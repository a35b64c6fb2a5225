"""Random small networks for the differential fuzzer (NOTE [ Differential fuzzer ] in
check.py): 1-4 blocks (MLP, LayerNorm MLP, attention, conv + BatchNorm, GRU cell,
checkpointed block, conv2d with max pooling, indices and upsampling) with dropout and
in-place ReLU, trained 1-3 steps with gradient accumulation, clipping and SGD/Adam/
AdamW(foreach) or manual SGD (``p.data = p.data - lr * p.grad``), in one session or one per
step. Losses, parameters and gradients are compared exactly against eager; also the peak
bound, the twin and the process state. ``tight`` (NOTE [ Differential fuzzer ] rule 6): budgets
of 5-50 % of the peak, every budgeted run traced, and ``evict_all()`` after each forward and
each optimizer step in most seeds."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import tritondtr
import tritondtr.runtime as rt

from .check import HEURISTICS, Failure, Tally, descend
from .run import RunConfig, process_state, twin

BLOCKS = ("mlp", "ln_mlp", "attn", "conv", "gru", "ckpt", "conv2d")


class Block(nn.Module):
    def __init__(self, kind: str, w: int, r: random.Random) -> None:
        super().__init__()
        self.kind, self.p = kind, r.choice([0.0, 0.1, 0.3])
        if kind == "mlp":
            self.a, self.b = nn.Linear(w, 2 * w), nn.Linear(2 * w, w)
        elif kind == "ln_mlp":
            self.ln, self.a, self.b = nn.LayerNorm(w), nn.Linear(w, w), nn.Linear(w, w)
        elif kind == "attn":
            self.ln, self.qkv, self.o = nn.LayerNorm(w), nn.Linear(w, 3 * w), nn.Linear(w, w)
        elif kind == "conv":
            self.c, self.bn = nn.Conv1d(1, 2, 3, padding=1), nn.BatchNorm1d(2)
            self.o = nn.Linear(2 * w, w)
        elif kind == "gru":
            self.cell = nn.GRUCell(w, w)
        elif kind == "conv2d":  # [B, 1, w/4, 4] -> conv, pool with indices, upsample
            self.c = nn.Conv2d(1, 2, 3, padding=1, padding_mode=r.choice(["zeros", "circular"]))
            self.o = nn.Linear(2 * w, w)
        else:
            self.a, self.b = nn.Linear(w, w), nn.Linear(w, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, w]
        k, (B, W) = self.kind, x.shape
        if k == "mlp":
            h = self.a(x)
            h = F.relu(h, inplace=True) if self.p else F.gelu(h)
            return x + F.dropout(self.b(h), self.p, self.training)
        if k == "ln_mlp":
            return x + F.dropout(self.b(torch.tanh(self.a(self.ln(x)))), self.p, self.training)
        if k == "attn":
            q, kk, v = self.qkv(self.ln(x)).view(B, 3, 4, W // 4).transpose(0, 1).unbind(0)
            a = (q.transpose(0, 1) @ kk.transpose(0, 1).transpose(-1, -2)) / (W // 4) ** 0.5
            a = F.dropout(a.softmax(-1), self.p, self.training)
            return x + self.o((a @ v.transpose(0, 1)).transpose(0, 1).reshape(B, W))
        if k == "conv":
            return x + self.o(self.bn(self.c(x.unsqueeze(1))).relu_().flatten(1))
        if k == "conv2d":
            h, idx = F.max_pool2d(self.c(x.view(B, 1, W // 4, 4)), 2, return_indices=True)
            h = F.interpolate(h, scale_factor=2, mode="nearest") + F.max_unpool2d(h, idx, 2)
            return x + self.o(F.silu(h).flatten(1))
        if k == "gru":
            h = torch.zeros_like(x)
            for t in range(3):
                h = self.cell(x * (t + 1) / 3, h)
            return h
        return x + checkpoint(lambda t: self.b(torch.sin(self.a(t))), x, use_reentrant=False)


class Net(nn.Module):
    def __init__(self, r: random.Random, w: int, din: int, dout: int) -> None:
        super().__init__()
        self.kinds = [r.choice(BLOCKS) for _ in range(r.randint(1, 4))]
        self.inp, self.out = nn.Linear(din, w), nn.Linear(w, dout)
        self.blocks = nn.ModuleList([Block(k, w, r) for k in self.kinds])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The training of a model seed: ``micro`` batches per step, one session a step
    (``per_step``) or one for all."""

    optimizer: str
    micro: int
    steps: int
    per_step: bool
    clip: bool


def make(seed: int) -> tuple[Net, list, Plan]:
    r = random.Random(seed)
    w, din, dout = r.choice([8, 16, 32, 64]), r.choice([5, 16]), r.choice([3, 10])
    B = r.choice([4, 8, 16])
    torch.manual_seed(seed)
    net = Net(r, w, din, dout)
    if r.random() < 0.3:
        net = net.double()
    opt = r.choice(["sgd", "sgdm", "adam", "adamw_foreach", "manual"])
    plan = Plan(opt, r.choice([1, 1, 2]), r.choice([1, 2, 3]), r.random() < 0.5, r.random() < 0.3)
    g = torch.Generator().manual_seed(seed + 1)
    dt = next(net.parameters()).dtype
    data = [
        (torch.randn(B, din, generator=g, dtype=dt), torch.randint(0, dout, (B,), generator=g))
        for _ in range(plan.steps * plan.micro)
    ]
    return net, data, plan


class _ManualSGD:
    """``p.data = p.data - lr * p.grad``: NOTE [ Plain .data assignment ] in a session."""

    def __init__(self, ps) -> None:
        self.ps = list(ps)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.ps:
            p.grad = None

    def step(self) -> None:
        for p in self.ps:
            if p.grad is not None:
                p.data = p.data - 0.05 * p.grad


def _optimizer(net: Net, kind: str):
    ps = net.parameters()
    if kind == "manual":
        return _ManualSGD(ps)
    if kind.startswith("sgd"):
        return torch.optim.SGD(ps, lr=0.05, momentum=0.9 if kind == "sgdm" else 0.0)
    if kind == "adam":
        return torch.optim.Adam(ps, lr=1e-3)
    return torch.optim.AdamW(ps, lr=1e-3, foreach=True)


def train(
    seed: int, session=contextlib.nullcontext, evict: bool = False
) -> tuple[list, list, list, list]:
    """Losses and logits sums, parameters, gradients (plain copies) and the session objects
    ``session()`` made (``contextlib.nullcontext``: eager); ``evict``: the session evicts
    everything after each forward and each optimizer step."""
    net, data, plan = make(seed)
    opt = _optimizer(net, plan.optimizer)
    kept, made = [], []

    def evict_all() -> None:
        if evict and made:
            getattr(made[-1], "session", made[-1]).evict_all()

    torch.manual_seed(seed + 2)
    with session() if not plan.per_step else contextlib.nullcontext() as outer:
        made += [outer] if outer is not None else []
        for s in range(plan.steps):
            with session() if plan.per_step else contextlib.nullcontext() as inner:
                made += [inner] if inner is not None else []
                opt.zero_grad(set_to_none=True)
                for m in range(plan.micro):
                    x, y = data[s * plan.micro + m]
                    logits = net(x)
                    loss = F.cross_entropy(logits, y) / plan.micro
                    evict_all()
                    loss.backward()
                    kept.append(loss)
                if plan.clip:
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
                opt.step()
                evict_all()
                kept.append(logits.sum())  # logits held across the optimizer step
    values = [rt.unwrap(v).detach().clone() for v in kept]
    params = [p.detach().clone() for p in net.parameters()]
    grads = [None if p.grad is None else p.grad.clone() for p in net.parameters()]
    return values, params, grads, made


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None)
        or (x is not None and y is not None and x.dtype == y.dtype and torch.equal(x, y))
        for x, y in zip(a, b)
    )


def check_model(seed: int, tally: Tally | None = None, tight: bool = False) -> list[Failure]:
    """Every failure of the model of ``seed``: no budget, stress, then 80 % ... 12 % of the
    unlimited peak (``tight``: 50 % ... 5 %) until a BudgetError (a budget too small for a
    step is no failure)."""
    tally = tally if tally is not None else Tally()
    tally.programs += 1
    r = random.Random(seed * 13 + 5)
    ref = train(seed)[:3]
    base = RunConfig(heuristic=r.choice(HEURISTICS[:6]), cost=r.choice(["analytic", "bytes"]))
    # NOTE [ Offload ] in core/core.py: half the models offload (a draw of its own: the
    # draws above and below stay as they were)
    offload = random.Random(seed * 7 + 11).choice((None, None, "1TB/s", "100MB/s"))
    base = dataclasses.replace(base, offload=offload)
    evict = tight and r.random() < 0.7
    out: list[Failure] = []
    fractions = (
        (0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05) if tight else (0.8, 0.6, 0.45, 0.3, 0.2, 0.12)
    )
    peak = 0

    def one(cfg: RunConfig) -> bool | None:
        """Run ``cfg``: True (it fit), False (BudgetError) or None (a crash: stop)."""
        nonlocal peak
        tally.runs += 1
        recs: list = []

        def session(cfg=cfg, recs=recs):
            if cfg.trace:
                recs.append(tritondtr.trace(None, **cfg.options()))
                return recs[-1]
            return rt.enable(**cfg.options())

        fail = lambda kind, detail, cfg=cfg: out.append(Failure(kind, "model", seed, cfg, detail))
        try:
            *got, made = train(seed, session, evict)
        except rt.BudgetError as e:
            tally.budget_errors += 1
            if cfg.budget is None or cfg.stress:
                fail("budget", f"BudgetError without a budget: {e}")
                return None
            return False
        except Exception as e:
            fail("crash", "".join(traceback.format_exception(e))[-3000:])
            return None
        finally:
            state = process_state()
            if state:
                fail("state", "; ".join(state))
        sessions = [getattr(s, "session", s) for s in made]
        peak = peak or max(s.stats.peak_bytes for s in sessions)
        names = ("losses", "parameters", "gradients")
        diffs = [n for n, a, b in zip(names, ref, got) if not _same(a, b)]
        if diffs:
            fail("mismatch", f"{', '.join(diffs)} differ from eager")
        for s in sessions if cfg.budget is not None else []:
            if s.stats.peak_bytes > cfg.budget + s.stats.max_op_out_bytes:
                fail("peak", f"peak {s.stats.peak_bytes} > budget {cfg.budget} + largest op")
        for rec in recs:
            tally.twins += 1
            detail = twin(rec, cfg)
            if detail:
                fail("twin", detail)
        tally.runs_with_remats += any(s.stats.rematerializations for s in sessions)
        tally.evictions += sum(s.stats.evictions for s in sessions)
        return True

    if one(base) and one(dataclasses.replace(base, stress=True)):
        budgeted = lambda b: dataclasses.replace(base, budget=b, trace=r.random() < 0.5 or tight)
        descend(peak, fractions, tight, lambda b: one(budgeted(b)))
    tally.failures += len(out)
    return out
