"""Backend switch and argument validation of scoring and selection."""

import pytest
import torch

from tritondtr import Heuristic, MetadataTable
from tritondtr.policy.backend import Backend, resolve_backend


def test_auto_is_torch_on_cpu():
    assert resolve_backend("auto", torch.device("cpu"), Heuristic.DTR) is Backend.TORCH


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"), Heuristic.DTR)


def test_unknown_names_are_explained():
    table = MetadataTable(4, device="cpu")
    table.add(1.0, 1, 0)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        table.select("dtr", 1, backend="cuda")
    with pytest.raises(ValueError, match="unknown heuristic 'dtrr'"):
        table.select("dtrr", 1)
    with pytest.raises(ValueError, match="k must be a positive int"):
        table.select("dtr", 1, k=0)
    with pytest.raises(ValueError, match="now must be an int"):
        table.select("dtr", "later")


def test_select_returns_host_int64():
    table = MetadataTable(4, device="cpu")
    table.add(1.0, 10, 0)
    ids = table.select("dtr", 5)
    assert ids.dtype == torch.int64 and ids.device.type == "cpu"
