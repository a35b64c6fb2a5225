"""The frameworks change process-wide state that other tests must not inherit."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Environment variables (accelerate and transformers set some), torch's thread count and
    its deterministic-algorithms flag are put back after each test."""
    env = dict(os.environ)
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
