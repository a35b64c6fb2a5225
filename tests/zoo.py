"""A small model zoo for the runtime's tests and benchmarks.

Each entry builds ``Case(model, inputs, loss)`` from a seed: ``loss(model, inputs)`` is one
forward pass returning a scalar. :func:`train_step` does forward, backward and an Adam step.
Sizes are small (CPU tests); ``scale`` grows the widths for benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ZOO", "Case", "UNet", "make", "train_step", "unet_case"]


@dataclass
class Case:
    model: nn.Module
    inputs: tuple
    loss: Callable[[nn.Module, tuple], torch.Tensor]


# ---------------------------------------------------------------------------- models
def _mlp(scale: int) -> Case:
    w = 32 * scale
    layers = [nn.Linear(32, w), nn.Tanh()]
    for k in range(8):
        layers += [nn.Linear(w, w), nn.GELU() if k % 2 else nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(w, 10))
    x, y = torch.randn(128, 32), torch.randint(0, 10, (128,))
    return Case(model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def _cnn(scale: int) -> Case:
    c = 8 * scale
    model = nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1),
        nn.BatchNorm2d(c),
        nn.ReLU(inplace=True),
        nn.Conv2d(c, c, 3, padding=1),
        nn.BatchNorm2d(c),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1),
        nn.BatchNorm2d(2 * c),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * c, 10),
    )
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    return Case(model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1]))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))
        self.heads, self.drop = heads, nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, device=x.device).tril() == 0
        att = self.drop(att.masked_fill(mask, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-like decoder: token + position embeddings, pre-LN blocks, tied head."""

    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        layers: int = 2,
        heads: int = 4,
        block: int = 16,
        p: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_Block(d, heads, p) for _ in range(layers))
        self.ln, self.drop = nn.LayerNorm(d), nn.Dropout(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.t()


def _gpt(scale: int) -> Case:
    model = GPT(d=32 * scale, layers=4 * scale)
    idx = torch.randint(0, 64, (4, 16))
    tgt = torch.randint(0, 64, (4, 16))
    return Case(
        model, (idx, tgt), lambda m, b: F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten())
    )


class _LSTMNet(nn.Module):
    """Two stacked LSTM cells unrolled over time (the op-by-op form; nn.LSTM on CPU is one
    fused oneDNN op per layer, which leaves nothing to evict within a layer)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.cells = nn.ModuleList([nn.LSTMCell(16, d), nn.LSTMCell(d, d)])
        self.head = nn.Linear(d, 5)
        self.d = d

    def forward(self, x):
        h = [x.new_zeros(x.shape[0], self.d) for _ in self.cells]
        c = [x.new_zeros(x.shape[0], self.d) for _ in self.cells]
        for t in range(x.shape[1]):
            inp = x[:, t]
            for k, cell in enumerate(self.cells):
                h[k], c[k] = cell(inp, (h[k], c[k]))
                inp = h[k]
        return self.head(h[-1])


def _lstm(scale: int) -> Case:
    model = _LSTMNet(16 * scale)
    x, y = torch.randn(64, 12, 16), torch.randint(0, 5, (64,))
    return Case(model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1]))


class TreeLSTM(nn.Module):
    """Binary Tree-LSTM; the tree comes from the input: pairing offsets from the token ids, and
    the order of children from the sign of a computed value (``.item()`` inside forward).
    ``tokens`` is [B, N]: B trees of the same shape (the first row decides it)."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.leaf = nn.Linear(d, 2 * d)
        self.node = nn.Linear(2 * d, 5 * d)
        self.head = nn.Linear(d, 3)
        self.d = d

    def _compose(self, left, right):
        (hl, cl), (hr, cr) = left, right
        i, fl, fr, o, u = self.node(torch.cat([hl, hr], -1)).chunk(5, -1)
        c = i.sigmoid() * u.tanh() + fl.sigmoid() * cl + fr.sigmoid() * cr
        return o.sigmoid() * c.tanh(), c

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens[0].tolist()
        nodes = [tuple(self.leaf(self.emb(tokens[:, k])).chunk(2, -1)) for k in range(len(ids))]
        r = 0
        while len(nodes) > 1:  # a round of pairwise merges from a data-dependent offset
            start = ids[r % len(ids)] % 2 if len(nodes) > 2 else 0
            merged = nodes[:start]
            for k in range(start, len(nodes) - 1, 2):
                a, b = nodes[k], nodes[k + 1]
                if a[0].sum().item() < b[0].sum().item():
                    a, b = b, a
                merged.append(self._compose(a, b))
            if (len(nodes) - start) % 2:
                merged.append(nodes[-1])
            nodes, r = merged, r + 1
        return self.head(nodes[0][0])


def _treelstm(scale: int) -> Case:
    model = TreeLSTM(d=16 * scale)
    tokens, y = torch.randint(0, 32, (32, 13)), torch.randint(0, 3, (32,))
    return Case(model, (tokens, y), lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """A U-Net of the DTR authors' log's shape (their ``unet.log``): two conv / batch norm /
    ReLU per block, four max-pool levels down, four bilinear upsamplings with pad and skip
    concatenation up, 19 convolutions. [N, 3, H, W] -> [N, 1, H, W] logits, H and W at least
    16 (an odd size on the way down is padded back on the way up)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        w = width
        self.inc = _double_conv(3, w)
        chans = [(w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w), (8 * w, 8 * w)]
        self.downs = nn.ModuleList(_double_conv(i, o) for i, o in chans)
        chans = [(16 * w, 4 * w), (8 * w, 2 * w), (4 * w, w), (2 * w, w)]
        self.ups = nn.ModuleList(_double_conv(i, o) for i, o in chans)
        self.out = nn.Conv2d(w, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up in self.ups:
            skip = skips.pop()
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
            dy, dx = skip.size(2) - x.size(2), skip.size(3) - x.size(3)
            x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
            x = up(torch.cat([skip, x], dim=1))
        return self.out(x)


def unet_case(width: int = 4, side: int = 40) -> Case:
    """A :class:`UNet` of base ``width`` on a batch of 2 ``side`` x ``side`` images with
    binary targets (binary cross-entropy with logits); 40 pads a 2 x 2 map back to 5 x 5.
    Not in :data:`ZOO`: the runtime's tests and the recorded steps (benchmarks/recorded.py)
    use it on its own."""
    torch.manual_seed(0)
    model = UNet(width)
    x = torch.randn(2, 3, side, side)
    y = (torch.rand(2, 1, side, side) > 0.5).float()
    return Case(model, (x, y), lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1]))


ZOO: dict[str, Callable[[int], Case]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "gpt": _gpt,
    "lstm": _lstm,
    "treelstm": _treelstm,
}


def make(name: str, seed: int = 0, scale: int = 1) -> Case:
    """Build zoo model ``name`` and its batch, deterministically from ``seed``."""
    torch.manual_seed(seed)
    return ZOO[name](scale)


def train_step(case: Case, opt: torch.optim.Optimizer, seed: int = 1) -> torch.Tensor:
    """One training step: zero grads, forward, backward, optimizer step; returns the loss.
    ``seed`` seeds the random ops (dropout) so that two runs draw the same masks."""
    torch.manual_seed(seed)
    opt.zero_grad(set_to_none=True)
    loss = case.loss(case.model, case.inputs)
    loss.backward()
    opt.step()
    return loss
