"""Which outputs of a backward op are gradients on their way to a plain leaf's ``.grad``.

# NOTE [ Leaf gradients ]
# 1. In a backward pass that builds no graph of its own (grad mode off), a fresh output of an
#    op that autograd hands only to the ``AccumulateGrad`` node of a plain leaf (a parameter)
#    stays a plain tensor: not tracked, not counted, never evicted. It is that leaf's ``.grad``
#    in the making, and ``.grad`` is plain and uncounted anyway (NOTE [ What is tracked ]
#    rule 4 in session.py): the rule moves the point where the budget stops counting it from
#    the leaf's post-accumulate hook back to the op that computes it.
# 2. Why, besides the accounting being the same before and after ``AccumulateGrad``:
#    a. Between the op and the hook, autograd runs other ops (``aten.t`` of a linear layer's
#       weight gradient, the rest of the node's formula), and each made room for bytes that
#       left the count a moment later, evicting activations the backward pass reads next: on
#       the zoo's MLP at scale 16 and 50 % of its peak 18 of 30 evictions were made before an
#       ``aten.t``, on the GRU loop 250 of 309.
#    b. Autograd sums the gradients of a weight used several times (an RNN's per step, a tree's
#       per node) in its input buffer in place only for plain tensors (PyTorch's
#       ``InputBuffer::accumulate`` refuses tensor subclasses): as wrappers every sum
#       allocated a new weight-sized buffer, and the running sum, the new term and the result
#       were counted together (the zoo TreeLSTM's 50 % cliff, docs/history/simulator-log.md,
#       "The TreeLSTM at 50 % sits on a cliff"). Plain, they
#       are summed in place as in eager mode, with the same bits.
#    c. Evicting one would have cost a re-run of the backward pass that led to it (NOTE
#       [ Backward storages ] rule 3 in core/backward.py).
# 3. Which outputs: the autograd node in flight (``torch._C._current_autograd_node``) is
#    analysed once: each of its edges leads, directly or through the leaf's own views and
#    casts with a single successor (``_PASS``: a linear weight's ``TBackward0``, autocast's
#    ``ToCopyBackward0``, a slice), to the ``AccumulateGrad`` of a plain leaf or not, and
#    autograd's input metadata gives the shape and dtype each edge expects. An output with
#    the element count and dtype of a leaf-bound edge and of no other edge of the node is
#    taken for that leaf's gradient (element counts, not shapes: formulas compute a weight's
#    gradient transposed or with a kept dimension and return a view of it); when an edge to
#    something else expects the same (a square weight and a batch of as many elements), the
#    node's outputs are tracked as before. An intermediate of the node's formula with a leaf
#    gradient's size is taken too: it is plain and uncounted until the node ends, a few ops
#    later.
# 4. Only outputs whose element count is that of a hooked leaf (NOTE [ What is tracked ] rule
#    4: every plain leaf a tracked op read) are looked at: other ops pay one set lookup.
# 5. Consequence for budgets: tracked peaks (``SessionStats.peak_bytes``, the baseline of the
#    ratios in the benchmarks and the twin) no longer include parameter gradients; where they
#    dominated a peak (the TreeLSTM's shared weight), the peak and every budget given as a
#    fraction of it are lower than before (docs/runtime.md, Budget accounting).
# 6. A plain output of rule 1 that a tracked op reads while it lives (a tensor hook's or a
#    custom Function's value with a leaf gradient's size, a ``.grad`` read under grad mode)
#    enters that op's recipe as a copy, as NOTE [ In-place versions ] rule 2 copies a written
#    plain tensor: a later in-place write to it (plain, so untracked) cannot make the recipe
#    stale, as it could not while such values were tracked. The outputs are remembered in a
#    weak dictionary, so no tensor is kept alive by it.
# 7. The nodes analysed are dropped when the backward pass ends (an autograd engine callback
#    queued at its first analysis): they hold no graph and no saved tensor beyond it.
"""

from __future__ import annotations

import math
import weakref

import torch

from .dynamo import opaque
from .tensor import WRAPPER_TYPES

__all__ = ["LeafGrads"]

_current_node = torch._C._current_autograd_node
_graph_task = torch._C._current_graph_task_id
_AccumulateGrad = torch._C._functions.AccumulateGrad
_MAX_CHAIN = 4  # rule 3: nodes followed towards an AccumulateGrad
# Rule 3: the nodes between an op and a leaf's AccumulateGrad that the rule looks through: the
# leaf's own views and casts (a linear weight's transpose, autocast's copy to bfloat16, a
# slice of it), never an op that mixes in another value.
_PASS = frozenset(
    {
        "TBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "ExpandBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "UnsqueezeBackward0",
        "ToCopyBackward0",
        "AliasBackward0",
        "SliceBackward0",
        "SelectBackward0",
    }
)


class LeafGrads:
    """Rule 3's analysis for one session: ``numels`` (rule 4) is kept by the session as it
    hooks leaves; :meth:`is_leaf_grad` answers for one output of the op in flight and
    remembers, weakly, the outputs it left plain (rule 6)."""

    __slots__ = ("_made", "_nodes", "_task", "numels")

    def __init__(self) -> None:
        self.numels: set[int] = set()
        self._nodes: dict[int, tuple] = {}  # id(node) -> (node, frozenset of (numel, dtype))
        self._made: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # rule 6
        self._task = -1

    def is_leaf_grad(self, o: torch.Tensor) -> bool:
        """Whether ``o``, a fresh output of the op in flight in a backward pass, goes only to
        a plain leaf's gradient (rule 3); if so it is remembered (rule 6)."""
        node = _current_node()
        if node is None:
            return False
        task = _graph_task()
        if task != self._task:  # a new backward pass: its nodes are new
            self._task, self._nodes = task, {}
            _queue_callback(self._forget)  # rule 7: at the end of this pass
        entry = self._nodes.get(id(node))
        if entry is None:
            entry = self._nodes[id(node)] = (node, _leaf_edges(node))
        if (o.numel(), o.dtype) not in entry[1]:
            return False
        self._made[id(o)] = o
        return True

    @property
    def pending(self) -> bool:
        """Whether some output rule 1 left plain is still alive."""
        return bool(self._made)

    def made(self, t: torch.Tensor) -> bool:
        """Whether plain ``t`` is an output rule 1 left plain (and still alive)."""
        return self._made.get(id(t)) is t

    @opaque  # called by autograd's engine: NOTE [ Dynamo never traces the runtime ] rule 3
    def _forget(self) -> None:
        self._task, self._nodes = -1, {}


def _queue_callback(fn) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _leaf_edges(node) -> frozenset:
    """(numel, dtype) of the gradients ``node`` sends only towards plain leaves."""
    leaf, other = set(), set()
    try:
        for fn, nr in node.next_functions:
            if fn is None:
                continue
            metas = getattr(fn, "_input_metadata", None)
            if metas is None:  # a PyTorch without it: everything stays tracked
                return frozenset()
            meta = metas[nr]
            key = (math.prod(meta.shape), meta.dtype)
            (leaf if _reaches_leaf(fn) else other).add(key)
    except RuntimeError:  # metadata autograd cannot give (a nested tensor's): stay tracked
        return frozenset()
    return frozenset(leaf - other)


def _reaches_leaf(fn) -> bool:
    """Rule 3: ``fn`` is a plain leaf's AccumulateGrad, or a view or cast of its gradient
    (``_PASS``) with one successor that is, up to ``_MAX_CHAIN`` nodes down."""
    for _ in range(_MAX_CHAIN):
        if type(fn) is _AccumulateGrad:
            return type(fn.variable) not in WRAPPER_TYPES
        if type(fn).__name__ not in _PASS:
            return False
        succ = [f for f, _ in fn.next_functions if f is not None]
        if len(succ) != 1:
            return False
        fn = succ[0]
    return False
