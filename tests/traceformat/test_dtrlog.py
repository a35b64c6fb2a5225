"""The DTR log import (tritondtr.traceformat.dtrlog, NOTE [ DTR log import ]): every
instruction, the backward mark, errors naming the line, and gzip logs."""

import gzip
import json

import pytest

from tritondtr.sim import EventKind, TraceError, load_trace
from tritondtr.traceformat.dtrlog import read_dtr_log
from tritondtr.traceformat.trace import TensorFlag


def log(*records, start=True):
    recs = ([{"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}] if start else []) + list(records)
    return [json.dumps(r) for r in recs]


CONST = [
    {"INSTRUCTION": "CONSTANT", "NAME": "w"},
    {"INSTRUCTION": "MEMORY", "NAME": "w", "MEMORY": "64"},
]


def call(name, args, results, time="10", mem=("32",), alias=("-1",)):
    out = [{"INSTRUCTION": "CALL", "NAME": name, "ARGS": args, "RESULT": results, "TIME": time}]
    for r, m, a in zip(results, mem, alias):
        out += [
            {"INSTRUCTION": "MEMORY", "NAME": r, "MEMORY": m},
            {"INSTRUCTION": "ALIAS", "NAME": r, "ALIAS": a},
        ]
    return out


def test_every_instruction():
    lines = [
        {"INSTRUCTION": "CONSTANT", "NAME": "junk"},  # before START: dropped
        {"INSTRUCTION": "MEMORY", "NAME": "junk", "MEMORY": "1"},
        {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"},
        *CONST,
        *call("relu", ["w"], ["a"]),
        *call("view", ["a"], ["b"], mem=("32",), alias=("0",)),
        {"INSTRUCTION": "COPY", "DST": "w2", "SRC": "w"},
        {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "BACKWARD"},
        {"INSTRUCTION": "MUTATE", "NAME": "add_", "ARGS": ["b", "w"], "MUTATE": ["0"], "TIME": "5"},
        {"INSTRUCTION": "COPY_FROM", "DST": "w2", "SRC": "a"},
        {"INSTRUCTION": "RELEASE", "NAME": "nobody"},
        {"INSTRUCTION": "RELEASE", "NAME": "a"},
    ]
    t = read_dtr_log([json.dumps(r) for r in lines], "x.log")
    assert t.names == ["w", "relu", "view", "add_"]
    assert t.num_tensors == 4  # w, a, b (view of a), the new version of b
    assert t.size.tolist() == [64, 32, 0, 32]  # the mutated copy is a's whole storage
    assert t.op_cost.tolist() == [0.0, 10.0, 10.0, 5.0]
    kinds = [EventKind(k).name for k in t.kind]
    assert kinds == [
        "CONSTANT",
        "CALL",
        "CALL",
        "RETAIN",
        "ANNOTATE",
        "CALL",
        "RELEASE",
        "RELEASE",
        "RETAIN",
        "RELEASE",
        "OUTPUT",
        "OUTPUT",
        "OUTPUT",
    ]
    # RELEASE of b's old version (mutate), w2's old binding w (copy_from), then a.
    assert t.arg[t.kind == EventKind.RELEASE].tolist() == [2, 0, 1]
    # Outputs in first-binding order of the names still bound: w (w), a (w2), b' (b).
    assert t.arg[t.kind == EventKind.OUTPUT].tolist() == [0, 1, 3]


def test_backward_mark_flags_what_follows():
    """NOTE [ DTR log import ] rule 8: after ``ANNOTATE BACKWARD`` every fresh output of a
    CALL or MUTATE is a backward storage, views keep 0 (as the recorder leaves them); nothing
    before it is, a log without the mark has none, and a mark before the last START is
    dropped with its iteration."""
    bw = int(TensorFlag.BACKWARD)
    forward = [*CONST, *call("relu", ["w"], ["a"])]
    backward = [
        *call("threshold_backward", ["w", "a"], ["g", "v"], mem=("32", "0"), alias=("-1", "0")),
        {"INSTRUCTION": "MUTATE", "NAME": "add_", "ARGS": ["g", "w"], "MUTATE": ["0"], "TIME": "5"},
    ]
    mark = {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "BACKWARD"}
    t = read_dtr_log([json.dumps(r) for r in [*forward, mark, *backward]], "x.log")
    # w (constant), a (relu), g and its view v (threshold_backward), g's new version (add_)
    assert t.flags.tolist() == [0, 0, bw, 0, bw]
    t = read_dtr_log([json.dumps(r) for r in [*forward, *backward]], "x.log")
    assert not t.flags.any()
    start = {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}
    t = read_dtr_log([json.dumps(r) for r in [mark, start, *forward, *backward]], "x.log")
    assert not t.flags.any()


@pytest.mark.parametrize(
    "records, lineno, message",
    [
        (
            [{"INSTRUCTION": "CALL", "NAME": "f", "ARGS": ["nope"], "RESULT": ["r"], "TIME": "1"}],
            2,
            "'nope'",
        ),
        ([CONST[0], {"INSTRUCTION": "MEMORY", "NAME": "other", "MEMORY": "1"}], 3, "expected 'w'"),
        ([*CONST, *call("f", ["w"], ["r"])[:2]], 4, "ends where the ALIAS"),
        ([*CONST, *call("f", ["w"], ["r"], time="soon")], 4, "'TIME' must be a number"),
        (
            [*CONST, {"INSTRUCTION": "CALL", "NAME": "f", "ARGS": ["w"], "RESULT": ["r"]}],
            4,
            "CALL line lacks the field 'TIME': expected a number >= 0",
        ),
        ([*CONST, *call("f", ["w"], ["r"], time="nan")], 4, "'TIME' must be a number >= 0"),
        ([CONST[0], {**CONST[1], "MEMORY": "-64"}], 3, "'MEMORY' must be a whole number of bytes"),
        ([CONST[0], {**CONST[1], "MEMORY": 1.5}], 3, "'MEMORY' must be .*got 1.5$"),
        ([CONST[0], {**CONST[1], "MEMORY": True}], 3, "'MEMORY' must be .*got True$"),
        ([CONST[0], {**CONST[1], "MEMORY": str(2**63)}], 3, "'MEMORY' must be .*below 2"),
        ([CONST[0], {"INSTRUCTION": "MEMORY", "NAME": "w"}], 3, "MEMORY line lacks the field"),
        ([*CONST, *call("f", ["w"], ["r"], alias=("3",))], 6, "has only 1 arguments"),
        ([{"INSTRUCTION": "FROB"}], 2, "unknown instruction 'FROB'"),
        ([{"INSTRUCTION": ["CALL"]}], 2, r"unknown instruction \['CALL'\]"),
        ([{"INSTRUCTION": "ALIAS", "NAME": "x", "ALIAS": "-1"}], 2, "outside a CONSTANT or CALL"),
        ([*CONST, {"INSTRUCTION": "COPY", "DST": "w", "SRC": "w"}], 4, "already bound"),
        (
            [
                *CONST,
                {"INSTRUCTION": "RELEASE", "NAME": "w"},
                {"INSTRUCTION": "RELEASE", "NAME": "w"},
            ],
            5,
            "released more often",
        ),
        (
            [
                *CONST,
                {"INSTRUCTION": "MUTATE", "NAME": "g", "ARGS": ["w"], "MUTATE": ["1"], "TIME": "1"},
            ],
            4,
            "argument positions",
        ),
    ],
    ids=[
        "unknown-arg",
        "memory-name",
        "truncated",
        "bad-time",
        "missing-time",
        "nan-time",
        "negative-memory",
        "float-memory",
        "bool-memory",
        "huge-memory",
        "missing-memory",
        "alias-range",
        "unknown-instr",
        "list-instr",
        "stray-alias",
        "copy-bound",
        "double-release",
        "mutate-index",
    ],
)
def test_log_errors_name_the_line(records, lineno, message):
    with pytest.raises(TraceError, match=rf"x\.log:{lineno}: .*{message}"):
        read_dtr_log(log(*records), "x.log")


def test_not_json_names_the_line():
    with pytest.raises(TraceError, match=r"x\.log:2: not valid JSON"):
        read_dtr_log([*log(), "{nope"], "x.log")


def test_gzip_log_is_detected(tmp_path):
    p = tmp_path / "m.log.gz"
    p.write_bytes(gzip.compress("\n".join(log(*CONST)).encode()))
    t = load_trace(p)
    assert t.num_tensors == 1 and t.meta["name"] == "m"
