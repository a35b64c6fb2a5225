"""Shared test setup.

TRITON_INTERPRET is set first, before anything imports the Triton kernels, so that they run
on CPU tensors under the interpreter. An explicit setting is kept: on a GPU machine run
``TRITON_INTERPRET=0 pytest -m gpu`` to test the compiled kernels.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked ``@pytest.mark.gpu`` skip cleanly without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
