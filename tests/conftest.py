"""Shared test setup.

TRITON_INTERPRET is set first, before anything imports the Triton kernels, so that they run
on CPU tensors under the interpreter. An explicit setting is kept: on a GPU machine run
``TRITON_INTERPRET=0 pytest -m gpu`` to test the compiled kernels.

Torch runs one intra-op thread: the tests check values, never speed, and on a 2-core machine
shared with other jobs torch's OpenMP regions stalled for ~0.1 s per op at random while a
worker thread was descheduled (docs/benchmarks.md, "How fast is one eviction decision?"):
one slow test took over 10 minutes that way instead of seconds. ``TRITONDTR_TEST_THREADS``
overrides the count.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

torch.set_num_threads(int(os.environ.get("TRITONDTR_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _cpu_sessions_on_a_gpu_machine(request, monkeypatch):
    """On a GPU machine, a test not marked ``gpu`` runs its sessions as on a CPU machine: they
    track the CPU tensors those tests make (NOTE [ Session device ] rule 2 would have them
    wait for a CUDA output)."""
    if torch.cuda.is_available() and "gpu" not in request.keywords:
        from tritondtr.runtime import device

        monkeypatch.setattr(device, "cuda_available", lambda: False)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.gpu`` skip cleanly without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (small ops: more threads only add contention on
    a shared CPU); the count is put back after the module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
