"""The fuzzer's tests run programs that warn by design (deprecated or odd calls eager accepts):
warnings are silenced for each of them."""

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
