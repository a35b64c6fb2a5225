"""The fuzzer's command lines, ``python -m tests.fuzz`` and ``python -m tests.fuzz.reduce``: a
failure's repro that the reducer shrinks, and bad arguments or files refused in one line on
stderr with exit status 2."""

from __future__ import annotations

import json

import pytest

from tests.fuzz.check import Failure, write_repro
from tests.fuzz.cli import main as fuzz_main
from tests.fuzz.planted import plant_wrong_recomputation
from tests.fuzz.reduce import main as reduce_main


def test_cli_writes_a_repro_that_the_reducer_shrinks(monkeypatch, tmp_path, capsys):
    plant_wrong_recomputation(monkeypatch)
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
