"""Random PyTorch programs for the differential fuzzer (NOTE [ Differential fuzzer ] in
check.py): :func:`generate` makes the :class:`Program` of a seed, the same one every time.

A program is source lines in three sections: ``pre`` (before the session: leaves and some
graph), ``body`` (inside it) and ``post`` (after it). Each line is made by a template
(templates/) from the tensors the lines before it made, run eagerly
at once, and dropped if eager PyTorch rejects it: every program runs in eager.
"""

from __future__ import annotations

import dataclasses
import random
import warnings

from .templates import KINDS, TEMPLATES
from .templates.autograd import FUNCTION_NAMES, FUNCTIONS
from .templates.registry import is_t

HEADER = (
    """
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

class Sq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g

class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return 2 * g

def blk(x):
    return (x.sin() * x.cos()).tanh() + x
"""
    + FUNCTIONS
)
HEADER_NAMES = frozenset({"torch", "F", "checkpoint", "Sq", "Dirty", "blk"}) | FUNCTION_NAMES

LEAVES = (
    "a0 = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)",
    "a1 = torch.randn(6, dtype=torch.float64, requires_grad=True)",
    "a2 = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)",
    "a3 = torch.randn(4, 4, dtype=torch.float32, requires_grad=True)",
    "a4 = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)",
    "a5 = torch.randn(5, 3, dtype=torch.float64).t()",  # not contiguous
    "a6 = torch.randn(1, 6, dtype=torch.float64).expand(4, 6)",  # a stride 0
    "a7 = torch.randint(0, 4, (4, 6))",
    "a8 = torch.randn(4, 6) > 0",
    "a9 = torch.randn(0, 6, dtype=torch.float64, requires_grad=True)",
    "a10 = torch.randn(6, 4, dtype=torch.float64).t().requires_grad_()",  # leaf, not contiguous
    "a11 = torch.randn(4, 6, dtype=torch.complex64, requires_grad=True)",
    "a12 = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)",
)
PRE_KINDS = ("unary", "binary", "view", "reduce")
POST_KINDS = ("unary", "binary", "view", "inplace", "reduce", "backward", "multi", "boundary")


@dataclasses.dataclass(frozen=True)
class Program:
    """``raise_at``: the body line before which the program raises an exception inside the
    session (None: it does not); the eager reference then skips the rest of the body."""

    seed: int
    pre: tuple[str, ...]
    body: tuple[str, ...]
    post: tuple[str, ...]
    raise_at: int | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Program:
        return cls(d["seed"], tuple(d["pre"]), tuple(d["body"]), tuple(d["post"]), d["raise_at"])

    def source(self, session: str = "tritondtr.enable(stress=True)") -> str:
        """A standalone script: the body indented under ``with <session> as _S:``."""
        body = self.body if self.raise_at is None else self.body[: self.raise_at]
        inner = ["    " + ln for line in body for ln in line.split("\n")]
        block = [f"with {session} as _S:", *inner]
        if self.raise_at is not None:  # the exception the program raises inside the session
            block = ["try:", *("    " + ln for ln in block), "        raise KeyError('user')"]
            block += ["except KeyError:", "    pass"]
        parts = [HEADER.strip(), "", "import tritondtr", "", *self.pre, *block, *self.post]
        return "\n".join(parts) + "\n"


class _NoSession:
    """``_S`` outside a session: ``_S.evict_all()`` lines do nothing in eager."""

    def evict_all(self) -> None:
        pass


def namespace() -> dict:
    """A fresh namespace with the header's names and ``_S`` bound to no session."""
    ns: dict = {}
    exec(HEADER, ns)
    ns["_S"] = _NoSession()
    return ns


def run_lines(ns: dict, lines) -> tuple[int | None, BaseException | None]:
    """Run ``lines`` in ``ns`` up to the first that raises: (its index, the exception), or
    (None, None)."""
    for i, line in enumerate(lines):
        try:
            exec(line, ns)
        except Exception as e:
            return i, e
    return None, None


def _holds(pred, v) -> bool:
    """``pred(v)``, False where it raises (``is_leaf`` of a multi-output view written in
    place raises, as any access to its ``grad_fn``)."""
    try:
        return bool(pred(v))
    except RuntimeError:
        return False


class _Generator:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.r = random.Random(seed)
        self.sections: dict[str, list[str]] = {"pre": [], "body": [], "post": []}
        self.section = "pre"
        self.k = 0
        self.ns = namespace()

    # -------------------------------------------------- what the templates use
    def new(self) -> str:
        self.k += 1
        return f"v{self.k}"

    def names(self, pred=lambda v: True) -> list[str]:
        """Names of the program's tensors (a*, v*, g*, L*) that satisfy ``pred``."""
        return [
            n
            for n, v in self.ns.items()
            if n[0] in "avgL" and n[1:].isdigit() and is_t(v) and _holds(pred, v)
        ]

    def pick(self, pred=lambda v: True) -> str | None:
        """A tensor satisfying ``pred``, one of the six latest in 60 % of the picks."""
        ns = self.names(pred)
        if not ns:
            return None
        return self.r.choice(ns[-6:] if self.r.random() < 0.6 else ns)

    # -------------------------------------------------- building
    def _rebuild(self) -> None:
        self.ns = namespace()
        for sec in ("pre", "body", "post"):
            i, e = run_lines(self.ns, self.sections[sec])
            assert i is None, (sec, i, e)
            if sec == self.section:
                return

    def add(self, line: str) -> bool:
        """Keep ``line`` if eager runs it (else restore the namespace it may have spoiled)."""
        try:
            exec(line, self.ns)
        except Exception:
            self._rebuild()
            return False
        self.sections[self.section].append(line)
        return True

    def step(self, kinds=KINDS) -> None:
        weights = [TEMPLATES[k][0] for k in kinds]
        for _ in range(6):
            line = TEMPLATES[self.r.choices(kinds, weights)[0]][1](self)
            if line is not None and self.add(line):
                return

    def generate(self) -> Program:
        r = self.r
        self.add(f"torch.manual_seed({self.seed % 100000})")
        chosen = LEAVES[:3] + tuple(r.sample(LEAVES[3:], r.randint(0, len(LEAVES) - 3)))
        for line in chosen:
            self.add(line)
        for _ in range(r.randint(0, 3)):
            self.step(PRE_KINDS)
        self.section = "body"
        self.add(f"torch.manual_seed({(self.seed * 7 + 1) % 100000})")
        for _ in range(r.randint(4, 30)):
            self.step()
        if r.random() < 0.8:  # a final backward, most of the time
            for _ in range(4):
                line = TEMPLATES["backward"][1](self)
                if line is not None and self.add(line):
                    break
        body = self.sections["body"]
        raise_at = r.randint(1, len(body)) if r.random() < 0.2 and len(body) > 2 else None
        self.section = "post"
        for _ in range(r.choice([0, 0, 1, 3])):
            self.step(POST_KINDS)
        s = self.sections
        return Program(self.seed, tuple(s["pre"]), tuple(s["body"]), tuple(s["post"]), raise_at)


def generate(seed: int) -> Program:
    """The program of ``seed`` (deterministic: same seed, same program, same torch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _Generator(seed).generate()
