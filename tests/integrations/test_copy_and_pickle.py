"""``copy.deepcopy`` and pickling of tracked tensors (NOTE [ Copies and pickles ] in
tritondtr/runtime/tensor.py). Lightning deep-copies its logged metrics inside every validation
(``ModelCheckpoint``) and saves them in checkpoints; both raised before."""

import copy
import io
import pickle

import pytest
import torch

import tritondtr
from tritondtr.runtime import is_tracked, unwrap


def _tracked_leaf(x):
    """A detached tracked tensor (a leaf, as a logged metric is) and its eager value."""
    y = (x * 2).exp()
    return y.detach(), (x * 2).exp().detach()


def test_deepcopy_in_a_session_is_a_tracked_clone():
    x = torch.randn(5, 7)
    with tritondtr.enable(budget=None) as s:
        d, want = _tracked_leaf(x)
        d.note = {"step": 3}
        c = copy.deepcopy(d)
        assert is_tracked(c) and c is not d
        assert torch.equal(unwrap(c), want) and c.note == {"step": 3} and c.note is not d.note
        d.add_(1)  # the copy is independent of the original
        assert torch.equal(unwrap(c), want)
        assert s.evict_all() > 0  # a copy is recomputable: it reads the original's version
        assert torch.equal(unwrap(c), want)


def test_deepcopy_keeps_requires_grad_memo_and_grad():
    x = torch.randn(3, 4)
    with tritondtr.enable(budget=None):
        d, want = _tracked_leaf(x)
        leaf = d.requires_grad_()
        leaf.grad = torch.ones(3, 4)
        pair = copy.deepcopy({"a": leaf, "b": leaf})
        assert pair["a"] is pair["b"] and pair["a"].requires_grad and pair["a"].is_leaf
        assert torch.equal(pair["a"].grad, torch.ones(3, 4))
        assert torch.equal(unwrap(pair["a"]).detach(), want)


def test_deepcopy_of_a_non_leaf_raises_as_in_eager():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)
    with tritondtr.enable(budget=None), pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


def test_deepcopy_after_exit_is_plain():
    x = torch.randn(4)
    with tritondtr.enable(budget=None) as s:
        d, want = _tracked_leaf(x)
        s.evict_all()
    c = copy.deepcopy(d)
    assert type(c) is torch.Tensor and torch.equal(c, want)


@pytest.mark.parametrize("inside", [True, False], ids=["in-session", "after-exit"])
def test_torch_save_and_pickle_write_the_plain_value(inside):
    x = torch.randn(6, 5)
    with tritondtr.enable(budget=None) as s:
        d, want = _tracked_leaf(x)
        g = d.requires_grad_()
        s.evict_all()
        if inside:
            buf = io.BytesIO()
            torch.save({"metric": d, "leaf": g}, buf)
            pickled = pickle.dumps(d)
            assert s.evict_all() > 0  # read, not handed out: still the runtime's
    if not inside:
        buf = io.BytesIO()
        torch.save({"metric": d, "leaf": g}, buf)
        pickled = pickle.dumps(d)
    buf.seek(0)
    loaded = torch.load(buf)
    for t in (loaded["metric"], loaded["leaf"], pickle.loads(pickled)):
        assert type(t) is torch.Tensor and torch.equal(t.detach(), want)
    assert loaded["leaf"].requires_grad


def test_pickling_leaves_the_buffer_alone():
    """The wrapper's attributes go into the pickle, not onto the runtime's buffer."""
    x = torch.randn(3)
    with tritondtr.enable(budget=None):
        d, want = _tracked_leaf(x)
        d.note = "metric"
        got = pickle.loads(pickle.dumps(d))
        assert got.note == "metric" and torch.equal(got, want)
        assert not hasattr(unwrap(d), "note")
