"""Traces: builder rules, file round trips (npz / jsonl / gzip), DTR log import and its errors."""

import gzip
import json

import numpy as np
import pytest

from tritondtr.sim import EventKind, TraceBuilder, TraceError, load_trace, save_trace
from tritondtr.traceformat.dtrlog import read_dtr_log
from tritondtr.traceformat.trace import TensorFlag

ARRAYS = ("kind", "arg", "op_cost", "op_name", "in_ptr", "inputs", "out_ptr", "size", "alias")


def small_trace():
    b = TraceBuilder(meta={"model": "tiny"})
    w = b.constant(4096, name="w")
    x = b.constant(1000, name="x")
    (h,) = b.call("aten::mm", [x, w], sizes=[127], cost=20.0)
    (v,) = b.call("aten::view", [h], sizes=[0], aliases=[0], cost=1.0)
    _a, c = b.call("aten::split", [v, h], sizes=[0, 4097], aliases=[1, -1], cost=3.5)
    b.retain(c)
    b.annotate("BACKWARD")
    b.release(h)
    b.release(v)
    b.release(c)
    return b.build()


def assert_same(a, b):
    for k in ARRAYS:
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert a.names == b.names and a.annotations == b.annotations


def test_builder_ids_and_outputs():
    t = small_trace().validate()
    assert t.num_ops == 5 and t.num_tensors == 6
    assert t.size.tolist() == [4096, 1000, 127, 0, 0, 4097]
    assert t.alias.tolist() == [-1, -1, -1, 0, 1, -1]
    outs = t.arg[t.kind == EventKind.OUTPUT].tolist()
    assert outs == [0, 1, 4, 5]  # still referenced, in creation order (h and v released)


@pytest.mark.parametrize("suffix", [".npz", ".jsonl", ".jsonl.gz", ".npz.gz"])
def test_round_trip(tmp_path, suffix):
    t = small_trace()
    path = save_trace(t, tmp_path / f"tiny{suffix}")
    back = load_trace(path)
    assert_same(t, back)
    assert back.meta["model"] == "tiny"


def test_jsonl_renumbers_sparse_ids_and_names_bad_lines(tmp_path):
    lines = [
        {"format": "tritondtr-trace", "version": 1},
        {"ev": "constant", "out": 70, "size": 8},
        {
            "ev": "call",
            "name": "f",
            "in": [70, 70],
            "out": [9, 4],
            "size": [16, 0],
            "alias": [-1, 0],
            "cost": 2,
        },
        {"ev": "release", "t": 9},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines))
    t = load_trace(p)
    assert t.inputs.tolist() == [0, 0] and t.arg[-1] == 1
    p.write_text("\n".join(json.dumps(x) for x in [*lines, {"ev": "release", "t": 123}]))
    with pytest.raises(TraceError, match=r"t\.jsonl:5: tensor 123"):
        load_trace(p)
    p.write_text("\n".join(json.dumps(x) for x in [*lines, {"ev": "release", "t": 9}]))
    with pytest.raises(TraceError, match=r":5: .*no reference"):
        load_trace(p)


@pytest.mark.parametrize(
    "line, lineno, message",
    [
        ({"ev": "constant", "out": 70, "size": 1.5}, 2, "output size 1.5 must be a whole number"),
        ({"ev": "constant", "out": 70, "size": True}, 2, "output size True must be a whole"),
        ({"ev": "constant", "out": 70, "size": -8}, 2, "output size -8 must be a whole number"),
        (
            {"ev": "constant", "out": 70, "size": 2**63},
            2,
            "output size 9223372036854775808 .*below 2\\*\\*63",
        ),
        ([1, 2], 2, "expected an event \\(a JSON object\\)"),
        ({"format": "tritondtr-trace", "version": "x"}, 1, "header version must be an integer"),
    ],
    ids=["float-size", "bool-size", "negative-size", "huge-size", "list-event", "bad-version"],
)
def test_jsonl_bad_fields_name_the_line(tmp_path, line, lineno, message):
    lines = [line] if lineno == 1 else [{"format": "tritondtr-trace", "version": 1}, line]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines))
    with pytest.raises(TraceError, match=rf"t\.jsonl:{lineno}: {message}"):
        load_trace(p)


def test_damaged_files_name_the_file(tmp_path):
    """Damage below the format (gzip, zip, UTF-8) is a TraceError naming the file (NOTE
    [ Trace files ] 5), not the zipfile, gzip or codec exception."""
    p = tmp_path / "t.jsonl"
    save_trace(small_trace(), p)
    text = p.read_bytes().split(b"\n")
    p.write_bytes(b"\n".join([*text[:2], b'{"ev": "annotate", "text": "\xff"}', *text[2:]]))
    with pytest.raises(TraceError, match=r"t\.jsonl:3: not UTF-8 text \(byte 0xff"):
        load_trace(p)
    gz = save_trace(small_trace(), tmp_path / "t.npz.gz")
    gz.write_bytes(gz.read_bytes()[:-20])
    with pytest.raises(TraceError, match=r"t\.npz\.gz: damaged gzip data"):
        load_trace(gz)
    z = save_trace(small_trace(), tmp_path / "t.npz")
    data = z.read_bytes()
    z.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"t\.npz: damaged or truncated \.npz archive"):
        load_trace(z)
    z.write_bytes(b"\n \n")
    with pytest.raises(TraceError, match=r"t\.npz: the file is empty; expected a tritondtr"):
        load_trace(z)


def test_validate_rejects_inputs_from_the_future():
    t = small_trace()
    t.inputs[0] = 5
    with pytest.raises(TraceError, match="op 2: input tensor 5"):
        t.validate()


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


def test_million_op_binary_trace_loads(tmp_path):
    n = 1_000_000
    b_kind = np.zeros(n, np.int8)
    b_kind[0] = EventKind.CONSTANT
    t = small_trace().__class__(
        kind=b_kind,
        arg=np.arange(n),
        op_cost=np.ones(n),
        op_name=np.zeros(n),
        in_ptr=np.concatenate([[0], np.arange(n)]),
        inputs=np.arange(n - 1),
        out_ptr=np.arange(n + 1),
        size=np.full(n, 4096),
        alias=np.full(n, -1),
        names=["op"],
    )
    path = save_trace(t, tmp_path / "chain.npz")
    back = load_trace(path)  # validated: a few array passes, no Python loop per op
    assert back.num_ops == n and np.array_equal(back.inputs, t.inputs)
