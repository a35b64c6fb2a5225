"""The line templates (templates/): every family appears in the programs of a hundred seeds,
and the lines of the torch.func, linalg, convolution and ``.data`` families run under stress
as in eager and report a planted wrong value."""

from __future__ import annotations

import pytest
import torch

import tritondtr.runtime.tensor as tensor_module
from tests.fuzz.check import check_run, reference
from tests.fuzz.planted import plant_wrong_recomputation
from tests.fuzz.programs import Program, generate, namespace, run_lines
from tests.fuzz.run import RunConfig
from tests.fuzz.templates.autograd import FUNC_2D, FUNC_ANY
from tests.fuzz.templates.nn import CONV1D, CONV2D
from tests.fuzz.templates.products import LINALG, VALUES_ONLY


def test_families_are_alive_and_hand_set_grads_are_plain():
    """The families of batched products, losses, complex views, Functions, writes through
    views, saved tensor hooks and ``.grad`` writes appear in the programs of 100 seeds, and a
    ``.grad`` is set by hand only on a first leaf, under no_grad (known limit
    hand-assigned-wrapper-grad)."""
    sources = [generate(s).source() for s in range(100)]
    text = "\n".join(sources)
    for marker in ("bmm(", "reduction=", "view_as_complex(", "SaveOut.apply(", "TwoOut.apply("):
        assert marker in text, marker
    for marker in (".unfold(-1, 2, 2); _t", "saved_tensors_hooks", "requires_grad_(False)"):
        assert marker in text, marker
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if ".grad = torch" in line:
            assert line.lstrip().startswith("a") and "no_grad" in lines[i - 1], line


def test_data_func_linalg_and_conv_families_are_alive():
    """The families of ``.data`` assignments, torch.func, linalg and convolutions appear in
    the programs of 100 seeds."""
    text = "\n".join(generate(s).source() for s in range(100))
    for marker in (".data = v", ".data = a", "vmap(", "func.grad(", "autograd.functional."):
        assert marker in text, marker
    for marker in ("linalg.cholesky(", "linalg.qr(", "F.conv1d(", "F.conv2d(", "_pool"):
        assert marker in text, marker


_W = "_w = lambda *s: torch.linspace(-1, 1, torch.Size(s).numel(), dtype=torch.float64)"
_I1 = "i1 = a0.flatten()[:24].reshape(1, 2, 12)"
_I2 = "i2 = a0.flatten()[:24].reshape(1, 2, 3, 4)"
_M = "m = a0.flatten()[:16].reshape(4, 4); s = m @ m.mT + 4 * torch.eye(4, dtype=m.dtype)"
FAMILY_LINES = {
    "func": [f"v{k} = " + f.format(x="a0") for k, f in enumerate(FUNC_ANY + FUNC_2D)],
    "linalg": [_M] + [f"v{k} = " + f.format(m="m", s="s") for k, f in enumerate(LINALG)],
    "values-only": [_M] + [f"v{k} = " + f.format(m="m", s="s") for k, f in enumerate(VALUES_ONLY)],
    "conv": [_W + ".reshape(s)", _I1, _I2]
    + [
        f"c{k} = " + f.format(i="i1", w="_w", st=2, pd=1, dl=2, mode="reflect", interp1="linear")
        for k, f in enumerate(CONV1D)
    ]
    + [
        f"d{k} = "
        + f.format(i="i2", w="_w", st=2, pd=1, dl=1, mode="circular", h=3, wd=4, interp2="bilinear")
        for k, f in enumerate(CONV2D)
    ],
    "data": ["v1 = a0 * 2", "v2 = a0.exp()", "v1.data = v2", "v3 = v1 * 3"],
}
STRESS = RunConfig(stress=True, heuristic="dtr_eq")


def _family_program(lines: list[str]) -> Program:
    """``lines`` that eager runs on leaf ``a0``, then a backward of every result with grad."""
    pre = (
        "torch.manual_seed(0)",
        "a0 = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)",
    )
    ns = namespace()
    run_lines(ns, pre)
    body = [line for line in lines if run_lines(ns, [line])[1] is None]
    grads = [n for n, v in ns.items() if n != "a0" and isinstance(v, torch.Tensor) and v.grad_fn]
    body.append("L9 = (" + " + ".join(f"{n}.sum()" for n in grads) + ").double(); L9.backward()")
    return Program(0, pre, tuple(body), ())


@pytest.mark.parametrize("family", sorted(FAMILY_LINES))
def test_families_catch_a_planted_wrong_value(family, monkeypatch):
    """Each family's lines, run eagerly then under stress: equal; then with every recomputed
    buffer off by one (or, for ``.data``, the wrapper's setter reverted to autograd's, which
    left the wrapper on its old storage): a mismatch."""
    prog, ref = reference(_family_program(FAMILY_LINES[family]))
    assert ref is not None and len(prog.body) > len(FAMILY_LINES[family]) // 2, prog.body
    assert not check_run(prog, STRESS, ref)[0]
    if family == "data":
        monkeypatch.setattr(
            tensor_module.DTRTensor,
            "data",
            property(tensor_module._DATA.__get__, tensor_module._DATA.__set__),
        )
    else:
        plant_wrong_recomputation(monkeypatch)
    kinds = {f.kind for f in check_run(prog, STRESS, ref)[0]}
    assert "mismatch" in kinds, kinds
