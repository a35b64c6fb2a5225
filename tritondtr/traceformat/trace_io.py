"""Reading and writing traces: JSON lines, columnar ``.npz``, gzip, and DTR logs (detected).

# NOTE [ Trace files ]
# 1. One loader, :func:`load_trace`, for every form. It sniffs the content, not the name:
#    gzip (magic 1f 8b) is unwrapped first; then a zip archive (``PK``) is the columnar form,
#    a first line with ``"format": "tritondtr-trace"`` is our JSON lines form, and a first
#    line with an ``INSTRUCTION`` is a DTR prototype log (:mod:`.dtrlog`).
# 2. The columnar form is a numpy ``.npz`` holding the :class:`Trace` arrays by name plus
#    ``names``/``annotations`` (newline-joined UTF-8 bytes) and ``header`` (JSON bytes with
#    format, version and meta). It loads without pickle.
# 3. The JSON lines form is a header line, then one event per line; tensor ids may be any
#    distinct non-negative integers and are renumbered densely in creation order on load.
# 4. :func:`save_trace` picks the form from the file name: ``.npz`` columnar, ``.jsonl``
#    JSON lines, either with ``.gz`` appended to compress (``.npz`` is zip-compressed already
#    unless ``compress=False``).
# 5. Every reading error is a :class:`TraceError` that starts with the file name (and the line
#    for text forms): a damaged gzip or zip archive, an empty file, text that is not UTF-8,
#    a structural error found by :meth:`Trace.validate`. A missing or unreadable file stays
#    the ``OSError`` that ``open`` raises (it carries the file name). ``tritondtr simulate``
#    prints these messages as they are, one line each.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .builder import TraceBuilder
from .dtrlog import read_dtr_log
from .trace import FORMAT_NAME, FORMAT_VERSION, EventKind, Trace, TraceError

__all__ = ["detect_format", "load_trace", "save_trace"]

_ARRAYS = ("kind", "arg", "op_cost", "op_name", "in_ptr", "inputs", "out_ptr", "size", "alias")
_ANNOTATIONS = ("flags", "writes", "in_flags")  # version 2, optional (NOTE [ Runtime annotations ])
_EVENT_NAMES = {k: k.name.lower() for k in EventKind}
_MAX_BYTES = 2**63 - 1  # sizes are int64
# What a damaged .npz raises: a truncated file has no zip directory; a damaged one fails its
# CRC or its npy header, or has flags zipfile does not implement (NotImplementedError) or
# that claim encryption (RuntimeError).
_ARCHIVE_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)


# --------------------------------------------------------------------------- loading
def _read_bytes(path: str | os.PathLike, source: str) -> bytes:
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:  # truncated, or damaged on the way
            raise TraceError(f"{source}: damaged gzip data ({e})") from None
    return data


def detect_format(data: bytes) -> str:
    """``"npz"``, ``"jsonl"`` or ``"dtr-log"`` for (decompressed) file content."""
    if not data.strip():
        raise TraceError(
            "the file is empty; expected a tritondtr .npz, a JSON lines trace or a DTR "
            "prototype log (docs/trace-format.md)"
        )
    if data[:2] == b"PK":
        return "npz"
    first = data.lstrip()[:4096].split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("format") == FORMAT_NAME:
        return "jsonl"
    if isinstance(head, dict) and "INSTRUCTION" in head:
        return "dtr-log"
    raise TraceError(
        "unrecognised trace: expected a tritondtr .npz, a JSON lines trace whose first line "
        f'has "format": "{FORMAT_NAME}", or a DTR prototype log; first line: '
        f"{first[:120]!r}"
    )


def load_trace(path: str | os.PathLike, *, validate: bool = True) -> Trace:
    """Load a trace in any supported form (NOTE [ Trace files ]); gzip is read transparently.

    Raises :class:`TraceError` naming the file and, for text forms, the line that is wrong;
    ``OSError`` (``FileNotFoundError``...) when the file cannot be read (NOTE [ Trace files ] 5).
    """
    source = os.fspath(path)
    data = _read_bytes(path, source)
    try:
        kind = detect_format(data)
    except TraceError as e:
        raise TraceError(f"{source}: {e}") from None
    if kind == "npz":
        trace = _load_npz(data, source)
    elif kind == "jsonl":
        trace = _load_jsonl(_text_lines(data, source), source)
    else:
        trace = read_dtr_log(_text_lines(data, source), source=source)  # validated there
        validate = False
    trace.meta.setdefault("name", _stem(Path(path).name))
    if validate:
        try:
            trace.validate()
        except TraceError as e:
            raise TraceError(f"{source}: {e}") from None
    return trace


def _stem(name: str) -> str:
    for suffix in (".gz", ".npz", ".jsonl", ".json", ".log"):
        name = name.removesuffix(suffix)
    return name


def _text_lines(data: bytes, source: str) -> Iterator[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TraceError(
            f"{source}:{line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        ) from None
    return iter(text.splitlines())


def _load_npz(data: bytes, source: str) -> Trace:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            missing = [k for k in (*_ARRAYS, "header") if k not in z.files]
            if missing:
                raise TraceError(f"{source}: not a tritondtr trace archive, missing {missing}")
            blobs = {k: bytes(z[k]) for k in ("header", "names", "annotations") if k in z.files}
            arrays = {k: z[k] for k in (*_ARRAYS, *_ANNOTATIONS) if k in z.files}
    except TraceError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise TraceError(
            f"{source}: damaged or truncated .npz archive ({type(e).__name__}: {e})"
        ) from None
    try:
        header = json.loads(blobs["header"].decode("utf-8"))
        names, annotations = (_split(blobs.get(k, b"")) for k in ("names", "annotations"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TraceError(f"{source}: damaged header or names in the archive ({e})") from None
    _check_header(header, source)
    try:
        return Trace(**arrays, names=names, annotations=annotations, meta=header.get("meta", {}))
    except (TypeError, ValueError, OverflowError) as e:
        raise TraceError(f"{source}: an array has the wrong type ({e})") from None


def _split(blob: bytes) -> list[str]:
    text = blob.decode("utf-8")
    return text.split("\n") if text else []


def _check_header(header, source: str) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise TraceError(f"{source}: header is not a {FORMAT_NAME} header: {header!r}")
    try:
        version = int(header.get("version", 0))
    except (TypeError, ValueError):
        raise TraceError(
            f"{source}: header version must be an integer, got {header['version']!r}"
        ) from None
    if version > FORMAT_VERSION:
        raise TraceError(
            f"{source}: trace format version {header['version']} is newer than "
            f"this tritondtr reads ({FORMAT_VERSION}); upgrade tritondtr"
        )


def _load_jsonl(lines: Iterable[str], source: str) -> Trace:
    ids: dict[int, int] = {}
    b: TraceBuilder | None = None

    def tid(n: int, raw) -> int:
        if raw not in ids:
            raise TraceError(f"{source}:{n}: tensor {raw!r} is not an output of an earlier op")
        return ids[raw]

    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except ValueError as e:
            raise TraceError(f"{source}:{n}: not valid JSON ({e})") from None
        if b is None:
            _check_header(rec, f"{source}:{n}")
            b = TraceBuilder(meta=rec.get("meta", {}))
            continue
        if not isinstance(rec, dict):
            raise TraceError(f"{source}:{n}: expected an event (a JSON object), got {text[:80]!r}")
        try:
            ev = rec["ev"]
            if ev in ("call", "constant"):
                outs = rec["out"] if ev == "call" else [rec["out"]]
                for o in outs:
                    if not isinstance(o, int) or o < 0 or o in ids:
                        raise TraceError(
                            f"{source}:{n}: output id {o!r} must be a new non-negative integer"
                        )
                sizes = rec["size"] if ev == "call" else [rec["size"]]
                for s in sizes:
                    if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= _MAX_BYTES:
                        raise TraceError(
                            f"{source}:{n}: output size {s!r} must be a whole number of "
                            "bytes >= 0 (and below 2**63)"
                        )
                if ev == "constant":
                    new = [b.constant(rec["size"], name=rec.get("name", "constant"))]
                else:
                    ins = [tid(n, t) for t in rec["in"]]
                    new = b.call(
                        rec["name"],
                        ins,
                        rec["size"],
                        rec["cost"],
                        rec.get("alias"),
                        flags=rec.get("flags"),
                        writes=rec.get("writes"),
                        in_flags=rec.get("in_flags"),
                    )
                ids.update(zip(outs, new))
            elif ev in ("retain", "release", "output", "forget", "materialize"):
                getattr(b, ev)(tid(n, rec["t"]))
            elif ev == "freeze":
                b.freeze()
            elif ev == "evict_all":
                b.evict_all()
            elif ev == "annotate":
                b.annotate(rec["text"])
            else:
                raise TraceError(
                    f"{source}:{n}: unknown event {ev!r}; expected one of "
                    f"{sorted(_EVENT_NAMES.values())}"
                )
        except KeyError as e:
            raise TraceError(f"{source}:{n}: event lacks the field {e.args[0]!r}") from None
        except TraceError as e:
            if str(e).startswith(source):
                raise
            raise TraceError(f"{source}:{n}: {e}") from None
        except (TypeError, ValueError) as e:
            raise TraceError(f"{source}:{n}: ill-typed field ({e})") from None
    if b is None:
        raise TraceError(f"{source}: empty trace file (no header line)")
    return b.build(outputs="none")


# --------------------------------------------------------------------------- saving
def save_trace(trace: Trace, path: str | os.PathLike, *, compress: bool = True) -> Path:
    """Write ``trace`` in the form named by the suffix (NOTE [ Trace files ] 4)."""
    path = Path(path)
    name = path.name
    gz = name.endswith(".gz")
    base = name[:-3] if gz else name
    if base.endswith(".npz"):
        data = _npz_bytes(trace, compress and not gz)
    elif base.endswith((".jsonl", ".json")):
        data = "".join(_jsonl_lines(trace)).encode("utf-8")
    else:
        raise ValueError(
            f"cannot tell the trace form from {name!r}: use a .npz or .jsonl "
            "suffix, optionally followed by .gz"
        )
    if gz:
        data = gzip.compress(data, compresslevel=6)
    path.write_bytes(data)
    return path


def _npz_bytes(trace: Trace, compress: bool) -> bytes:
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": trace.meta}
    arrays = {k: getattr(trace, k) for k in (*_ARRAYS, *_ANNOTATIONS)}
    for key, texts in (("names", trace.names), ("annotations", trace.annotations)):
        if any("\n" in t for t in texts):
            raise TraceError(f"{key} must not contain newlines")
        arrays[key] = np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    return buf.getvalue()


def _jsonl_lines(trace: Trace) -> Iterator[str]:
    yield json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": trace.meta}) + "\n"
    kind, arg = trace.kind.tolist(), trace.arg.tolist()
    in_ptr, inputs = trace.in_ptr.tolist(), trace.inputs.tolist()
    out_ptr, size, alias = trace.out_ptr.tolist(), trace.size.tolist(), trace.alias.tolist()
    cost, name = trace.op_cost.tolist(), trace.op_name.tolist()
    flags, writes, in_flags = trace.flags.tolist(), trace.writes.tolist(), trace.in_flags.tolist()
    names = trace.names or ["op"]
    for k, a in zip(kind, arg):
        if k == EventKind.CONSTANT:
            t = out_ptr[a]
            rec = {"ev": "constant", "out": t, "size": size[t], "name": names[name[a]]}
        elif k == EventKind.CALL:
            lo, hi = out_ptr[a], out_ptr[a + 1]
            rec = {
                "ev": "call",
                "name": names[name[a]],
                "in": inputs[in_ptr[a] : in_ptr[a + 1]],
                "out": list(range(lo, hi)),
                "size": size[lo:hi],
                "alias": alias[lo:hi],
                "cost": cost[a],
            }
            # NOTE [ Runtime annotations ]: written only where they are not the default.
            if any(flags[lo:hi]):
                rec["flags"] = flags[lo:hi]
            if any(w >= 0 for w in writes[lo:hi]):
                rec["writes"] = writes[lo:hi]
            if any(in_flags[in_ptr[a] : in_ptr[a + 1]]):
                rec["in_flags"] = in_flags[in_ptr[a] : in_ptr[a + 1]]
        elif k == EventKind.ANNOTATE:
            rec = {"ev": "annotate", "text": trace.annotations[a]}
        elif k == EventKind.FREEZE:
            rec = {"ev": "freeze"}
        elif k == EventKind.EVICT_ALL:
            rec = {"ev": "evict_all"}
        else:
            rec = {"ev": _EVENT_NAMES[EventKind(k)], "t": a}
        yield json.dumps(rec, separators=(",", ":")) + "\n"
