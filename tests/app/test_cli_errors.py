"""``tritondtr simulate`` on bad input: one line on stderr naming the option or the file (and the
line for text formats) and what is wrong, exit status 2, no traceback, nothing on stdout.
Arguments are checked before any file is read. The Python API raises the same text."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tritondtr.cli import main
from tritondtr.sim import TraceBuilder, TraceError, load_trace, save_trace, simulate

PREFIX = "tritondtr simulate: error: "


def run_cli(tmp_path, capsys, *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``tritondtr simulate argv``, run in-process."""
    base = ["simulate", "--no-progress", "--no-plot", "--out", str(tmp_path / "out")]
    try:
        rc = main([*base, "--heuristics", "dtr_eq", *argv])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, *parts: str) -> str:
    assert rc == 2, (rc, err)
    assert out == ""  # nothing was loaded or printed before the error
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(PREFIX) and "Traceback" not in err, err
    for part in parts:
        assert part in err, (part, err)
    return err[len(PREFIX) : -1]


def tiny_trace():
    b = TraceBuilder(meta={"model": "tiny"})
    w = b.constant(4096, name="w")
    x = b.constant(1000, name="x")
    b.call("aten::mm", [x, w], sizes=[127], cost=20.0)
    return b.build()


def dtr_log(path, *records):
    lines = [{"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}, *records]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


CONSTANT = [
    {"INSTRUCTION": "CONSTANT", "NAME": "x"},
    {"INSTRUCTION": "MEMORY", "NAME": "x", "MEMORY": "64"},
]
RESULT = [
    {"INSTRUCTION": "MEMORY", "NAME": "y", "MEMORY": "32"},
    {"INSTRUCTION": "ALIAS", "NAME": "y", "ALIAS": "-1"},
]


def truncated_npz(tmp_path):
    data = save_trace(tiny_trace(), tmp_path / "t.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    return tmp_path / "t.npz"


def negative_npz(tmp_path):
    t = tiny_trace()
    t.size[2] = -5
    return save_trace(t, tmp_path / "neg.npz")


def empty_file(tmp_path):
    (tmp_path / "empty.npz").write_bytes(b"")
    return tmp_path / "empty.npz"


def jsonl_bad_line(tmp_path):
    lines = save_trace(tiny_trace(), tmp_path / "t.jsonl").read_text().splitlines()
    (tmp_path / "t.jsonl").write_text("\n".join([*lines[:2], "{not json", *lines[2:]]))
    return tmp_path / "t.jsonl"


def jsonl_negative_size(tmp_path):
    lines = save_trace(tiny_trace(), tmp_path / "t.jsonl").read_text().splitlines()
    event = {**json.loads(lines[1]), "size": -8}
    (tmp_path / "t.jsonl").write_text("\n".join([lines[0], json.dumps(event), *lines[2:]]))
    return tmp_path / "t.jsonl"


def log_without_time(tmp_path):
    call = {"INSTRUCTION": "CALL", "NAME": "f", "ARGS": ["x"], "RESULT": ["y"]}
    return dtr_log(tmp_path / "m.log", *CONSTANT, call, *RESULT)


def log_negative_memory(tmp_path):
    memory = {**CONSTANT[1], "MEMORY": "-64"}
    return dtr_log(tmp_path / "m.log", CONSTANT[0], memory)


BAD_FILES = [
    (truncated_npz, ["t.npz: damaged or truncated .npz archive"]),
    (negative_npz, ["neg.npz: tensor 2: negative size -5"]),
    (empty_file, ["empty.npz: the file is empty; expected a tritondtr .npz"]),
    (jsonl_bad_line, ["t.jsonl:3: not valid JSON"]),
    (jsonl_negative_size, ["t.jsonl:2: output size -8 must be a whole number of bytes >= 0"]),
    (log_without_time, ["m.log:4: CALL line lacks the field 'TIME': expected a number"]),
    (log_negative_memory, ["m.log:3: field 'MEMORY' must be a whole number", "got '-64'"]),
]


@pytest.mark.parametrize("make, parts", BAD_FILES, ids=[m.__name__ for m, _ in BAD_FILES])
def test_bad_trace_file(tmp_path, capsys, make, parts):
    path = make(tmp_path)
    message = assert_one_line_error(*run_cli(tmp_path, capsys, str(path)), str(path), *parts)
    with pytest.raises(TraceError) as api:  # the Python API: the same text
        load_trace(path)
    assert str(api.value) == message


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.npz"
    message = assert_one_line_error(*run_cli(tmp_path, capsys, str(path)))
    assert message == f"{path}: No such file or directory"
    with pytest.raises(FileNotFoundError):
        load_trace(path)


def test_the_installed_command_exits_2_with_one_line(tmp_path):
    """The same through ``python -m tritondtr``: the exit status a shell sees, nothing else on
    stderr (no warning, no traceback)."""
    path = truncated_npz(tmp_path)
    cmd = [sys.executable, "-m", "tritondtr", "simulate", str(path), "--out", str(tmp_path)]
    root = str(Path(__file__).resolve().parents[2])  # this checkout's tritondtr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"{PREFIX}{path}: damaged or truncated .npz archive " + (
        "(BadZipFile: File is not a zip file)\n"
    )


def test_a_bad_second_file_stops_before_the_first_sweep(tmp_path, capsys):
    good = save_trace(tiny_trace(), tmp_path / "good.npz")
    assert_one_line_error(*run_cli(tmp_path, capsys, str(good), str(empty_file(tmp_path))))
    assert not (tmp_path / "out" / "results.csv").exists()


BAD_ARGUMENTS = [
    (
        ["--ratios", "0"],
        "argument --ratios: a ratio of the baseline peak must be a finite "
        "number > 0, got 0 (see tritondtr simulate --help)",
    ),
    (
        ["--ratios", "-1"],
        "argument --ratios: a ratio of the baseline peak must be a finite number > 0, got -1 (see",
    ),
    (["--ratios=0.5,-1"], "got -1 in '0.5,-1'"),
    (["--ratios", "nan"], "got nan"),
    (["--ratios", "inf"], "got inf"),
    (["--ratios", ""], "argument --ratios: expected numbers like 1.0,0.5, got ''"),
    (["--ratios", "half"], "argument --ratios: expected numbers like 1.0,0.5, got 'half'"),
    (["--budget", "0.4"], "argument --budget: '0.4' is 0.4 bytes, not a whole number"),
    (["--budget", "1e400"], "argument --budget: '1e400' is more bytes than tritondtr counts"),
    (["--budget=-1GiB"], "argument --budget: a byte count must be >= 0, got '-1GiB'"),
    (["--budget", "nan"], "argument --budget: a byte count must be a finite number"),
    (["--heuristics", "dtr,nope"], "argument --heuristics: unknown heuristic 'nope'"),
    (
        ["--overhead-limit", "0.5"],
        "argument --overhead-limit: expected a multiple of the baseline compute >= 1.0",
    ),
]


@pytest.mark.parametrize(
    "argv, message", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS]
)
def test_bad_argument_is_checked_before_any_file_is_read(tmp_path, capsys, argv, message):
    missing = tmp_path / "nope.npz"  # never opened: the argument is reported, not the file
    err = assert_one_line_error(*run_cli(tmp_path, capsys, str(missing), *argv), message)
    assert str(missing) not in err


def test_ratio_and_budget_api_raise_the_same_text():
    trace = tiny_trace()
    with pytest.raises(ValueError, match=r"^a ratio of the baseline peak must be a finite number"):
        simulate(trace, "dtr_eq", ratio=float("inf"))
    with pytest.raises(ValueError, match=r"^'0.4' is 0.4 bytes, not a whole number"):
        simulate(trace, "dtr_eq", budget="0.4")


@pytest.mark.parametrize(
    "content, message",
    [(None, "No such file or directory"), ("{", "not a figure2-reference.json")],
    ids=["missing", "not-json"],
)
def test_bad_reference_file(tmp_path, capsys, content, message):
    good = save_trace(tiny_trace(), tmp_path / "good.npz")
    ref = tmp_path / "ref.json"
    if content is not None:
        ref.write_text(content)
    run = run_cli(tmp_path, capsys, str(good), "--reference", str(ref))
    assert_one_line_error(*run, f"--reference {ref}: {message}")


def test_budget_strings_a_user_writes_work(tmp_path, capsys):
    good = save_trace(tiny_trace(), tmp_path / "good.npz")
    rc, _, err = run_cli(tmp_path, capsys, str(good), "--budget", " 6 kib ", "--budget", "0")
    assert rc == 0, err
    rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert [r.split(",")[3:5] for r in rows[1:]] == [["6144", "ok"], ["0", "oom"]]


def test_bound_without_scipy_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a)
    )
    path = tmp_path / "t.npz"
    save_trace(tiny_trace(), path)
    rc, out, err = run_cli(tmp_path, capsys, str(path), "--semantics", "runtime", "--bound")
    assert_one_line_error(rc, out, err, "--bound", "pip install 'tritondtr[milp]'")
