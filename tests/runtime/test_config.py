"""The options of ``enable`` (RuntimeConfig): a bad value is refused with a message that says
what was expected, and a budget may be written as a string."""

import pytest

import tritondtr.runtime as rt


@pytest.mark.parametrize(
    "kwargs",
    [
        {"budget": -1},
        {"budget": "12 parsecs"},
        {"budget": 1.5},
        {"budget": True},
        {"heuristic": "nope"},
        {"backend": "gpu-magic"},
        {"stress": True, "budget": "1MiB"},
        {"never_evict": 3},
        {"debug": "yes"},
    ],
    ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()),
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError, match=r"expected|must|unknown|takes no budget|cannot read"):
        rt.enable(**kwargs)


def test_budget_strings():
    assert rt.enable("512MiB").config.budget == 512 * 2**20
    assert rt.enable("1.5GB").config.budget == 1_500_000_000
    assert rt.enable(1234).stats.budget == 1234
