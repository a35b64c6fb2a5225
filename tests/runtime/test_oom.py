"""NOTE [ Out-of-memory fallback ] (runtime/oom.py): what counts as the allocator's refusal,
retries that double their evictions, and recomputations retried too. A real CUDA refusal is
probed by benchmarks/gpu_check.py (tests/gpu_probes.py ``probe_oom``); the tests at the end
are an op's first attempt refused (NOTE [ Budget accounting ])."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tritondtr.runtime as rt
from tritondtr.runtime.oom import is_oom

_FAIL = {"replays": 0, "calls": 0}


@torch.library.custom_op("tritondtr_test::oom_on_replay", mutates_args=())
def _oom_on_replay(x: torch.Tensor) -> torch.Tensor:
    """x * 3; its calls after the first raise the allocator's error ``_FAIL["replays"]``
    times: a recomputation the allocator refuses."""
    _FAIL["calls"] += 1
    if _FAIL["calls"] > 1 and _FAIL["replays"] > 0:
        _FAIL["replays"] -= 1
        raise torch.OutOfMemoryError("out of memory (raised by the test)")
    return x * 3


@pytest.mark.parametrize(
    "error, refused",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"), True),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 8388608 bytes."
            ),
            True,
        ),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_what_counts_as_the_allocator_refusing(error, refused):
    assert is_oom(error) is refused


@pytest.mark.parametrize("fails", [1, 3])
def test_a_refused_recomputation_evicts_and_retries(fails):
    x = torch.randn(1000)
    _FAIL.update(calls=0, replays=0)
    with rt.enable(budget="1MiB", debug=True) as s:
        y = torch.ops.tritondtr_test.oom_on_replay(x + 1)
        keep = [(x * k).sin() for k in range(6)]  # needs no y
        s.evict_all()  # y too
        keep = [t * 1 for t in keep]  # resident again: victims for the retries
        before = s.stats.evictions
        _FAIL["replays"] = fails
        z = y * 2  # y is recomputed; the allocator refuses it ``fails`` times
        assert _FAIL["replays"] == 0
        assert s.stats.evictions > before
        assert torch.equal(rt.unwrap(z), (x + 1) * 3 * 2)
        for k, t in enumerate(keep):  # recomputed where they were the retries' victims
            assert torch.equal(rt.unwrap(t), (x * k).sin() * 1)


def test_a_refusal_with_nothing_to_evict_propagates_from_a_recomputation():
    x = torch.randn(1000)
    _FAIL.update(calls=0, replays=0)
    with rt.enable(stress=True) as s:
        y = torch.ops.tritondtr_test.oom_on_replay(x + 1)
        _FAIL["replays"] = 100
        with pytest.raises(torch.OutOfMemoryError, match="raised by the test"):
            (y * 2).sum()
        _FAIL["replays"] = 0
        assert torch.equal(rt.unwrap(y * 1), (x + 1) * 3)
    assert s.stats.rematerializations > 0


_REFUSE = {"left": 0}


@torch.library.custom_op("tritondtr_test::refused_first", mutates_args=())
def _refused_first(x: torch.Tensor) -> torch.Tensor:
    if _REFUSE["left"] > 0:
        _REFUSE["left"] -= 1
        raise torch.OutOfMemoryError("out of memory (raised by the test)")
    return x + 1


@torch.library.custom_op("tritondtr_test::refused_write_", mutates_args=("x",))
def _refused_write_(x: torch.Tensor) -> None:
    x.add_(1)  # half of the work is done ...
    if _REFUSE["left"] > 0:
        _REFUSE["left"] -= 1
        raise torch.OutOfMemoryError("out of memory (raised by the test)")  # ... then refused


def test_a_refusal_before_anything_is_tracked_is_the_allocators_error():
    """Review finding: the first op of a session refused by the allocator raised
    AttributeError (no engine yet) instead of the allocator's error."""
    x = torch.randn(10)
    _REFUSE["left"] = 1
    refused = pytest.raises(torch.OutOfMemoryError, match="raised by the test")
    with refused, rt.enable(budget="1GiB"):
        torch.ops.tritondtr_test.refused_first(x)


def test_an_op_that_writes_its_argument_is_not_retried():
    """NOTE [ Out-of-memory fallback ] rule 1: an in-place op may have applied part of its
    write before the refusal; a retry would apply it twice."""
    x = torch.randn(1000)
    with rt.enable(budget="1MiB") as s:
        a = x * 2
        others = [x * k for k in range(4)]  # victims a retry could evict
        s.evict_all()
        others = [o * 1 for o in others]
        _REFUSE["left"] = 1
        with pytest.raises(torch.OutOfMemoryError):
            torch.ops.tritondtr_test.refused_write_(a)
    assert _REFUSE["left"] == 0


_FAILS = {"left": 0}


@torch.library.custom_op("tritondtr_test::oom_then_double", mutates_args=())
def _oom_then_double(x: torch.Tensor) -> torch.Tensor:
    """x * 2, after raising the allocator's out-of-memory error ``_FAILS["left"]`` times."""
    if _FAILS["left"] > 0:
        _FAILS["left"] -= 1
        raise torch.OutOfMemoryError("out of memory (raised by the test)")
    return x * 2


@pytest.mark.parametrize("fails", [1, 2])
def test_allocator_oom_evicts_and_retries(fails):
    """NOTE [ Budget accounting ]: on the allocator's OutOfMemoryError (CUDA in practice; a
    custom op raises it here) one victim is evicted and the op retried, also from a lazy
    pool (the budget never bound, so the engine is built first)."""
    x = torch.randn(100)
    with rt.enable(budget="1MiB", debug=True) as s:
        a = (x + 1) * 3
        others = [a + k for k in range(3)]
        b = a - 1
        _FAILS["left"] = fails
        y = torch.ops.tritondtr_test.oom_then_double(b)
        # NOTE [ Out-of-memory fallback ] rule 2: retry i evicts 2**i victims
        assert s.stats.evictions == 2**fails - 1 and _FAILS["left"] == 0
        assert torch.equal(rt.unwrap(y), ((x + 1) * 3 - 1) * 2)
        for k, o in enumerate(others):  # recomputed if it was a victim
            assert torch.equal(rt.unwrap(o), (x + 1) * 3 + k)


def test_allocator_oom_with_nothing_to_evict_propagates():
    x = torch.randn(100)
    with rt.enable(budget=None) as s:  # nothing is ever evicted: the error is the user's
        _FAILS["left"] = 1
        with pytest.raises(torch.OutOfMemoryError, match="raised by the test"):
            torch.ops.tritondtr_test.oom_then_double(x + 1)
        assert torch.equal(rt.unwrap(torch.ops.tritondtr_test.oom_then_double(x + 1)), (x + 1) * 2)
    with rt.enable(budget="1MiB") as s:  # only the op's own (locked) input is tracked
        b = x + 1
        _FAILS["left"] = 5
        with pytest.raises(torch.OutOfMemoryError):
            torch.ops.tritondtr_test.oom_then_double(b)
        _FAILS["left"] = 0
        assert torch.equal(rt.unwrap(b), x + 1) and s.stats.evictions == 0


def test_a_refused_recomputation_keeps_its_resident_input():
    """NOTE [ Out-of-memory fallback ] rule 6: the budget never binds, so the core does not
    lock the resident input of a recomputation (NOTE [ Iterative rematerialization ] rule 8),
    and a refused replay's retry must not evict it: with the input the only other storage, the
    retry has nothing to evict and the allocator's error propagates. The retry evicted the input
    and the replay then raised "a recipe reads an evicted storage" (found by a CPU model of the
    GPU check's out-of-memory probe: a dispatch mode under the session that refuses above a
    byte limit)."""
    x = torch.randn(1000)
    _FAIL.update(calls=0, replays=0)
    with rt.enable(budget="1GiB", debug=True) as s:
        a = x + 1
        y = torch.ops.tritondtr_test.oom_on_replay(a)
        s.evict_all()
        a * 1  # a recomputed to be read, resident again; the product dies at once
        _FAIL["replays"] = 1
        with pytest.raises(torch.OutOfMemoryError, match="raised by the test"):
            y * 2
        assert _FAIL["replays"] == 0
        assert torch.equal(rt.unwrap(y * 2), (x + 1) * 3 * 2)


def test_a_refused_recomputation_evicts_another_storage_and_keeps_its_input():
    """Rule 6 with something else to evict: the retry evicts it, never the replay's input,
    although the input, 1,000 times larger, is the heuristic's first choice."""
    x = torch.randn(100_000)
    _FAIL.update(calls=0, replays=0)
    with rt.enable(budget="1GiB", debug=True) as s:
        a = x + 1
        y = torch.ops.tritondtr_test.oom_on_replay(a)
        other = (x[:100] * 5).sin()
        s.evict_all()
        a * 1, other * 1  # both resident again: the retry's only candidates
        before = s.stats.evictions
        _FAIL["replays"] = 1
        z = y * 2
        assert _FAIL["replays"] == 0 and s.stats.evictions == before + 1
        assert torch.equal(rt.unwrap(z), (x + 1) * 3 * 2)
        assert torch.equal(rt.unwrap(other), (x[:100] * 5).sin())


class _Refuse(TorchDispatchMode):
    """Under the session's mode: the allocator refusing the next ``times`` calls of ``op``.
    A custom op would not do for rule 7: an unknown op counts as random, never retried."""

    def __init__(self, op, times):
        super().__init__()
        self.op, self.left = op, times

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op and self.left:
            self.left -= 1
            raise torch.OutOfMemoryError("out of memory (raised by the test)")
        return func(*args, **(kwargs or {}))


def test_a_refused_op_on_plain_tensors_evicts_and_retries():
    """Rule 7: an op with no tracked input under no_grad (an optimizer's out-of-place op)
    refused by the allocator while the session holds evictable storages (found by fuzzing
    the CPU model of the GPU's out-of-memory probe)."""
    x, p = torch.randn(100), torch.rand(100)
    refuse = _Refuse(torch.ops.aten.sqrt.default, 1)
    with refuse, rt.enable(budget="1GiB", debug=True) as s:
        keep = [(x * k).sin() for k in range(4)]
        with torch.no_grad():
            q = p.sqrt()
        assert refuse.left == 0 and s.stats.evictions == 1
        assert type(q) is torch.Tensor and torch.equal(q, torch.sqrt(p))
        for k, t in enumerate(keep):
            assert torch.equal(rt.unwrap(t), (x * k).sin())


def test_a_refused_op_on_plain_tensors_with_nothing_to_evict_propagates():
    p = torch.rand(100)
    refuse = _Refuse(torch.ops.aten.sqrt.default, 1)
    refused = pytest.raises(torch.OutOfMemoryError, match="raised by the test")
    with refuse, rt.enable(budget="1GiB"), torch.no_grad(), refused:
        p.sqrt()


def test_uninitialized_memory_for_a_plain_tensor_is_retried():
    """Rule 7: ``empty_like`` of a plain tensor (dropout's mask of a plain input) refused."""
    x, p = torch.randn(100), torch.rand(100)
    refuse = _Refuse(torch.ops.aten.empty_like.default, 1)
    with refuse, rt.enable(budget="1GiB") as s:
        keep = [(x * k).sin() for k in range(4)]
        e = torch.empty_like(p)
        assert refuse.left == 0 and s.stats.evictions == 1
        assert type(e) is torch.Tensor and e.shape == p.shape
        del keep


def test_the_sessions_copy_of_a_written_plain_tensor_is_retried():
    """Rule 7: batch norm in training mode writes its running statistics (plain buffers);
    the session copies them before the op (NOTE [ In-place versions ] rule 2), and that copy
    refused by the allocator is retried after evicting. Everything equals eager."""
    torch.manual_seed(0)
    bn, x = torch.nn.BatchNorm1d(8), torch.randn(16, 8)
    ref_bn = torch.nn.BatchNorm1d(8)
    ref = ref_bn((x * 2).relu())
    refuse = _Refuse(torch.ops.aten.clone.default, 1)
    with refuse, rt.enable(budget="1GiB") as s:
        keep = [(x * k).sin() for k in range(4)]
        y = bn((x * 2).relu())
        assert refuse.left == 0 and s.stats.evictions >= 1
        assert torch.equal(rt.unwrap(y), ref)
        del keep
    assert torch.equal(bn.running_mean, ref_bn.running_mean)
    assert torch.equal(bn.running_var, ref_bn.running_var)


def test_a_refused_recomputation_releases_the_pending_frames_locks():
    """Rule 8: ``t = p * q`` with all three evicted; reading ``t`` recomputes ``p`` (locked
    for ``t``'s frame), then ``q``, which the allocator refuses twice. Nothing else is
    evictable, so the executor's retry gives up; the frames' locks are released and the
    retry evicts ``p``, recomputed again afterwards. The values equal eager's."""
    x = torch.randn(1000)
    refuse = _Refuse(torch.ops.aten.cos.default, 0)
    with refuse, rt.enable(budget="1GiB", debug=True) as s:
        t = x.sin() * x.cos()
        s.evict_all()
        refuse.left = 2
        y = t + 1
        assert refuse.left == 0 and s.stats.relaxations >= 1
        assert torch.equal(rt.unwrap(y), x.sin() * x.cos() + 1)


def test_a_retried_copy_never_evicts_the_ops_inputs():
    """Rule 7's copies are made before ``Core.enter``: a lazy core's retry built the engine
    mid-op, where the op's inputs (already read into its arguments) were candidates; batch
    norm's tracked running mean was evicted and then written, and ``hand_out`` raised (a
    reviewer's repro). Here the copy of the plain running variance is refused once."""
    torch.manual_seed(0)
    x, rm0, rv = torch.randn(16, 8), torch.zeros(8), torch.ones(8)
    rm_ref, rv_ref = rm0 + 1, rv.clone()
    ref = torch.batch_norm(x, None, None, rm_ref, rv_ref, True, 0.1, 1e-5, False)
    refuse = _Refuse(torch.ops.aten.clone.default, 0)
    with refuse, rt.enable(budget="1GiB", debug=True) as s:
        rm = rm0 + 1  # tracked: the only storage a retry could evict
        refuse.left = 1
        y = torch.batch_norm(x, None, None, rm, rv, True, 0.1, 1e-5, False)
        assert refuse.left == 0 and s.stats.evictions == 1
        assert torch.equal(rt.unwrap(y), ref)
        assert torch.equal(rt.unwrap(rm), rm_ref)
    assert torch.equal(rv, rv_ref)
