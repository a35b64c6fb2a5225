"""The differential fuzzer (NOTE [ Differential fuzzer ] in fuzz_check.py) on a fixed set of
seeds: random programs and small networks under tritondtr (no budget, stress, descending
budgets) equal eager PyTorch exactly. Plus: the checker catches a planted wrong
recomputation, the generator is deterministic and avoids the known limits, and the command
line refuses bad arguments in one line. Longer runs: ``python tests/fuzz_check.py --seeds
0:5000`` (docs/runtime.md, Tests)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import tritondtr.runtime.session as session_module
import tritondtr.runtime.tensor as tensor_module
from tests.fuzz.check import (
    Failure,
    Tally,
    check_program,
    check_run,
    reference,
    report,
    write_repro,
)
from tests.fuzz.cli import main as fuzz_main
from tests.fuzz.limits import (
    KNOWN_LIMITS,
    may_inplace_view_op,
    may_masked_select,
    may_median,
    may_tolist,
    split_points,
)
from tests.fuzz.models import check_model
from tests.fuzz.programs import Program, generate, namespace, run_lines
from tests.fuzz.reduce import main as reduce_main
from tests.fuzz.run import RunConfig
from tests.fuzz.templates.autograd import FUNC_2D, FUNC_ANY
from tests.fuzz.templates.nn import CONV1D, CONV2D
from tests.fuzz.templates.products import LINALG, VALUES_ONLY

PROGRAM_SEEDS = range(100)
MODEL_SEEDS = (0, 1, 2, 4, 5, 9)  # conv2d, manual SGD, 3 steps; seed 3 (5 s) left to campaigns


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("seed", PROGRAM_SEEDS, ids=lambda s: f"program{s}")
def test_program_equals_eager(seed):
    failures = check_program(seed)
    assert not failures, report(failures)


@pytest.mark.parametrize("seed", MODEL_SEEDS, ids=lambda s: f"model{s}")
def test_model_equals_eager(seed):
    failures = check_model(seed)
    assert not failures, report(failures)


def _plant_wrong_recomputation(monkeypatch):
    """Every recomputed floating-point buffer comes back off by one."""
    real = session_module.run_recipe

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        with torch.no_grad():
            for t in out:
                if t.dtype.is_floating_point:
                    t.add_(1)
        return out

    monkeypatch.setattr(session_module, "run_recipe", wrong)


def test_checker_catches_a_planted_wrong_recomputation(monkeypatch):
    _plant_wrong_recomputation(monkeypatch)
    for seed in (0, 1):
        kinds = {f.kind for f in check_program(seed)}
        assert "mismatch" in kinds, (seed, kinds)
    assert "mismatch" in {f.kind for f in check_model(0)}


def test_cli_writes_a_repro_that_the_reducer_shrinks(monkeypatch, tmp_path, capsys):
    _plant_wrong_recomputation(monkeypatch)
    assert fuzz_main(["--seeds", "0:1", "--out", str(tmp_path), "--progress", "0"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL mismatch program seed=0") >= 1, out
    repro = sorted(tmp_path.glob("mismatch-program-0-*.json"))[0]
    original = Failure.from_json(json.loads(repro.read_text()))
    assert reduce_main([str(repro)]) == 0
    reduced = Failure.from_json(json.loads(repro.with_suffix(".reduced.json").read_text()))
    assert reduced.kind == "mismatch"
    assert len(reduced.program.body) < len(original.program.body)
    assert "with tritondtr.enable(" in repro.with_suffix(".reduced.py").read_text()


def test_generator_is_deterministic_per_seed():
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)


def test_known_limits_are_named_and_split_points_follow_the_last_write():
    names = [k.name for k in KNOWN_LIMITS]
    assert len(names) == len(set(names)) and all(k.where for k in KNOWN_LIMITS)
    assert list(split_points([False, True, False, False])) == [2, 3]
    assert list(split_points([False, False, False])) == [1, 2]
    assert list(split_points([False, False, True])) == []


def test_generated_programs_avoid_the_known_limits(monkeypatch):
    """The programs of 70 seeds, run eagerly with the excluded calls watched: in-place view ops
    run (the template is alive) and only on tensors without grad; ``.tolist()``, median and
    masked_select never see what fuzz_limits excludes."""
    seen, bad = [], []

    def watch(name, ok, owner=torch.Tensor):
        real = getattr(owner, name)

        def watched(self, *args, **kwargs):
            seen.append(name)
            if not ok(self):
                bad.append(name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, watched)

    programs = [generate(s) for s in range(70)]
    for name in ("t_", "transpose_", "swapdims_", "unsqueeze_", "squeeze_", "as_strided_"):
        watch(name, may_inplace_view_op)
    watch("tolist", may_tolist)
    watch("median", may_median)
    watch("masked_select", may_masked_select, owner=torch)
    for prog in programs:
        reference(prog)
    assert not bad, bad
    assert {"tolist", "median", "masked_select"} <= set(seen) and len(set(seen)) > 3, sorted(
        set(seen)
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "--seeds"),
        (["--seeds", "5:1"], "START must be below STOP"),
        (["--seeds", "abc"], "expected START:STOP"),
        (["--seeds", "0:2", "--timeout", "-3"], "positive number of seconds"),
        (["--seeds", "0:2", "--bogus"], "unrecognized arguments"),
    ],
    ids=["missing", "reversed", "garbage", "timeout", "unknown"],
)
def test_cli_bad_arguments_are_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        fuzz_main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err.startswith("python -m tests.fuzz: error: ") and err.count("\n") == 1, err
    assert words in err and "Traceback" not in err


def test_cli_out_that_is_a_file_and_reducer_on_a_bad_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("{}")
    assert fuzz_main(["--seeds", "0:1", "--out", str(f)]) == 2
    assert reduce_main([str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 2 and "Traceback" not in err, err
    assert "is not a folder" in err and "not a fuzzer repro" in err


def test_model_repro_is_refused_by_the_reducer(tmp_path, capsys):
    path = write_repro(tmp_path, Failure("mismatch", "model", 3, None, "losses differ"))
    assert reduce_main([str(path)]) == 2
    assert "only a program's failing run can be reduced" in capsys.readouterr().err


def test_widened_templates_are_alive_and_hand_set_grads_are_plain():
    """fuzz_templates2's families appear in the programs of 100 seeds, and a ``.grad`` is set
    by hand only on a first leaf, under no_grad (known limit hand-assigned-wrapper-grad)."""
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


def test_new_families_are_alive():
    """fuzz_templates3's families appear in the programs of 100 seeds."""
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
def test_new_families_catch_a_planted_wrong_value(family, monkeypatch):
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
        _plant_wrong_recomputation(monkeypatch)
    kinds = {f.kind for f in check_run(prog, STRESS, ref)[0]}
    assert "mismatch" in kinds, kinds


def test_documented_refusal_is_expected_and_others_are_failures(monkeypatch):
    """``c.data = plain`` for a tracked ``c`` is refused as docs/runtime.md says: counted, no
    failure, and every name holds eager's value before the line; a refusal the docs do not
    list (planted: every wrapper ``.data`` assignment refused) is a failure."""
    pre = ("a0 = torch.ones(4, 6, dtype=torch.float64)", "a1 = torch.zeros(4, 6)")
    body = ("v1 = a0 * 2", "v1.data = a1", "v2 = v1 + 1")
    prog, ref = reference(Program(0, pre, body, ()))
    tally = Tally()
    assert not check_run(prog, STRESS, ref, tally)[0] and tally.refusals == 1
    planted = (*body[:1], "v3 = a0 * 3", "v1.data = v3")
    prog, ref = reference(Program(0, pre, planted, ()))

    def refuse(self, new):
        raise session_module.UnsupportedOpError(".data", "planted")

    monkeypatch.setattr(
        tensor_module.DTRTensor, "data", property(tensor_module._DATA.__get__, refuse)
    )
    assert {f.kind for f in check_run(prog, STRESS, ref)[0]} == {"refused"}
