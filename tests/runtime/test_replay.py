"""How a recipe replays (runtime/recipe.py): under the grad mode it first ran in (NOTE
[ Replay context ] rule 1), and into copies that keep its bytes and geometry (NOTE [ Replay
copies ] rule 1). Autocast (rule 3) is test_autocast.py, inference mode (rule 4)
test_inference_mode.py."""

import torch

import tritondtr.runtime as rt
from tests.runtime.eager_check import grads_of, leaf


def test_replay_runs_under_the_first_grad_mode():
    """NOTE [ Replay context ]: a kernel reading the grad mode replays as it first ran."""
    lib = torch.library.Library("tritondtr_test", "FRAGMENT")
    lib.define("grad_scale(Tensor x) -> Tensor")
    lib.impl("grad_scale", lambda x: x * (2.0 if torch.is_grad_enabled() else 3.0), "CPU")
    op = torch.ops.tritondtr_test.grad_scale.default
    x = leaf(4)
    with rt.enable(stress=True):
        y = op(x.detach() * 1)  # evicted now; recomputed under the no-grad print below
        with torch.no_grad():
            got = rt.unwrap(y * 1)
    assert torch.equal(got, x.detach() * 2.0)


def test_replay_copies_keep_bytes_and_geometry():
    """NOTE [ Replay copies ] rule 1: an in-place replay on a buffer that covers its storage
    (the clone) and on one that does not (the storage copy) gives eager's values, sizes and
    strides."""
    x = leaf(6, 4)

    def fn(keep=None):
        outs = [
            x * 2,  # contiguous: clone
            (x * 2)[:1],  # a view of a bigger storage: storage copy
            x.t() * 2,  # a transposed fresh output: storage copy
            (x.reshape(6, 1, 4) * 2).as_strided((6, 1, 4), (4, 99, 1)),  # dense, odd stride
        ]
        total = 0
        for k, a in enumerate(outs):
            a.mul_(x[k % 6, 0]).add_(1)
            if keep is not None:
                keep.append(a)
            total = total + (a * a).sum()
        return total

    ref_keep, got_keep = [], []
    ref, gref = grads_of(lambda: fn(ref_keep), x)
    with rt.enable(stress=True, debug=True) as s:
        out, g = grads_of(lambda: fn(got_keep), x)
        got = [rt.unwrap(a) for a in got_keep]  # recomputed: stress evicted them
    assert s.stats.rematerializations > 0
    assert torch.equal(out, ref) and torch.equal(g[0], gref[0])
    for a, b in zip(got, ref_keep):
        assert torch.equal(a, b.detach())
        assert a.shape == b.shape and a.stride() == b.stride()
        assert a.storage_offset() == b.storage_offset()


def test_clone_buffer_matches_the_storage_copy():
    """NOTE [ Replay copies ] rule 1: the clone path and the storage-copy path agree."""
    from tritondtr.runtime.recipe import clone_buffer, geometry

    base = torch.randn(6, 4)
    cases = [
        base.clone(),
        base.clone().as_strided((6, 1, 4), (4, 99, 1)),
        base.clone()[1:],
        base.clone().t(),
        torch.zeros(0, 3),
        torch.randn(3, dtype=torch.complex64).conj(),
    ]
    for t in cases:
        nbytes = t.untyped_storage().nbytes()
        slow, fast = clone_buffer(t), clone_buffer(t, nbytes)
        assert geometry(fast) == geometry(slow) == geometry(t)
        assert fast.untyped_storage().nbytes() == nbytes
        assert bytes(fast.untyped_storage()) == bytes(slow.untyped_storage())
        assert fast.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or not nbytes
