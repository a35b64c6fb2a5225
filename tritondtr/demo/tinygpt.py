"""TinyGPT: the small GPT-like model of the demo and the runtime benchmarks, and its data.

The data is windows of a short text embedded here (no download), so runs are reproducible
offline; :func:`gpt2_small` gives GPT-2 small's sizes for GPU benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

__all__ = ["CORPUS", "GPTConfig", "TinyGPT", "batches", "gpt2_small"]

CORPUS = """\
A tensor that is not needed now can be dropped and computed again later. Memory is a cache:
when the budget is full, the runtime picks a victim by its cost to recompute, its size and the
time since it was last used, and frees it. When a dropped tensor is needed, its parents are
made resident and the op that made it runs again, with the same random state, so the numbers
come out the same, bit for bit. The gradient of a long chain flows back one op at a time.
Small machines train large models this way, trading a little time for a lot of memory.
The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.
Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!
"""


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of :class:`TinyGPT`: ``block`` tokens of context, ``width`` channels,
    ``layers`` blocks of ``heads`` attention heads, ``dropout`` probability."""

    vocab: int = 64
    block: int = 64
    width: int = 128
    layers: int = 4
    heads: int = 4
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")
        if min(self.vocab, self.block, self.width, self.layers, self.heads) < 1:
            raise ValueError(f"all sizes must be >= 1, got {self}")


def gpt2_small(vocab: int = 50257) -> GPTConfig:
    """GPT-2 small's sizes (124M parameters): 12 layers, width 768, 12 heads, 1024 tokens."""
    return GPTConfig(vocab=vocab, block=1024, width=768, layers=12, heads=12, dropout=0.1)


class _Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1, self.ln2 = nn.LayerNorm(c.width), nn.LayerNorm(c.width)
        self.qkv, self.proj = nn.Linear(c.width, 3 * c.width), nn.Linear(c.width, c.width)
        self.fc, self.out = nn.Linear(c.width, 4 * c.width), nn.Linear(4 * c.width, c.width)
        self.drop = nn.Dropout(c.dropout)
        self.register_buffer("mask", torch.ones(c.block, c.block).tril() == 0, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = self.drop(att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class TinyGPT(nn.Module):
    """A GPT-like decoder: token and position embeddings, pre-LayerNorm blocks with causal
    self-attention and an MLP, a head tied to the token embedding.

    Initialised as GPT-2 is (NOTE [ GPT-2 initialisation ]), so the first loss is about
    ``ln(vocab)`` (4.16 for 64 symbols).

    ``forward(idx)``: idx ``[B, T] int64`` (T <= block) -> logits ``[B, T, vocab]``.
    ``checkpoint = True`` runs every block under ``torch.utils.checkpoint`` (the baseline
    tritondtr is compared with in benchmarks/bench_runtime_checkpoint.py)."""

    checkpoint: bool = False

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab, config.width)
        self.pos = nn.Embedding(config.block, config.width)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln, self.drop = nn.LayerNorm(config.width), nn.Dropout(config.dropout)
        self._init_gpt2()

    def _init_gpt2(self) -> None:
        # NOTE [ GPT-2 initialisation ]
        # 1. Every Linear and Embedding weight ~ N(0, 0.02), biases 0, LayerNorms (1, 0):
        #    GPT-2's initialisation (Radford et al. 2019; nanoGPT's model.py). Logits then start
        #    near 0, so the first loss is near ln(vocab), as for a uniform guess. PyTorch's
        #    defaults (N(0, 1) embeddings, tied to the head) gave ~70 for 64 symbols.
        # 2. The projections that end a residual branch (``proj``, ``out``) get std
        #    0.02 / sqrt(2 * layers): the residual stream sums 2 * layers of them.
        std_residual = 0.02 / (2 * self.config.layers) ** 0.5
        for name, mod in self.named_modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                last = name.rsplit(".", 1)[-1]
                std = std_residual if last in ("proj", "out") else 0.02
                nn.init.normal_(mod.weight, mean=0.0, std=std)
            if isinstance(mod, nn.Linear) and mod.bias is not None:
                nn.init.zeros_(mod.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for blk in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.ln(x) @ self.tok.weight.t()


def batches(config: GPTConfig, n: int, batch: int, seed: int, device) -> list[tuple]:
    """``n`` (input, target) pairs ``[batch, block] int64`` of windows of :data:`CORPUS`."""
    chars = sorted(set(CORPUS))
    if len(chars) > config.vocab:
        raise ValueError(f"vocab {config.vocab} is smaller than the corpus's {len(chars)} chars")
    data = torch.tensor([chars.index(ch) for ch in CORPUS])
    block = min(config.block, len(data) - 1)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, len(data) - block, (batch,), generator=g)
        x = torch.stack([data[s : s + block] for s in start.tolist()])
        y = torch.stack([data[s + 1 : s + 1 + block] for s in start.tolist()])
        out.append((x.to(device), y.to(device)))
    return out
