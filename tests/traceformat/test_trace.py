"""Traces (tritondtr.traceformat): builder rules, file round trips (npz / jsonl / gzip), the
errors of damaged or invalid files, and a million-op binary trace."""

import json

import numpy as np
import pytest

from tritondtr.sim import EventKind, TraceBuilder, TraceError, load_trace, save_trace

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
