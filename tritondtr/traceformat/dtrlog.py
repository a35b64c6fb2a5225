"""Importer for the DTR prototype's execution logs (uwsampl/dtr-prototype, ``simrd/logs``).

The log is JSON lines with string values (format: ``../shared/traces/dtr-prototype/README.md``
and docs/trace-format.md). Handles are names; the importer resolves them to tensor ids and
turns every instruction into trace events, reading it the way the paper's simulator does:

# NOTE [ DTR log import ]
# 1. Everything before the last ``ANNOTATE START`` is dropped (the warm-up iterations); a log
#    without START is read whole.
# 2. ``CONSTANT n`` + ``MEMORY n b``: a constant of b bytes. Reusing a constant's name rebinds
#    it (no release), as the reference parser does.
# 3. ``CALL``: followed, per result in order, by ``MEMORY`` then ``ALIAS``; a result with
#    alias a >= 0 views argument a and allocates nothing. Result names must be new.
# 4. ``MUTATE`` is copy-on-write: one op whose outputs are new versions of the mutated
#    arguments, each as large as the whole storage of the argument it replaces; the name then
#    refers to the new version and the old version loses the name's reference.
# 5. ``COPY d s``: a new handle d to s's tensor (retain). ``COPY_FROM d s``: d's old tensor is
#    released, then d refers to s's tensor (retain). ``RELEASE n``: release; unknown names are
#    ignored, as in the reference.
# 6. At the end, every tensor still referenced under some name becomes an ``output`` event, in
#    the order the names were first bound (the reference iterates its name table).
# 7. ``TIME`` (ns) is the op cost; a numeric string or number, integer or not, is accepted.
#    ``MEMORY`` and ``ALIAS`` are whole numbers (a string or a JSON integer, never truncated).
# 8. ``ANNOTATE BACKWARD`` marks where the backward pass starts: from the first mark after the
#    last START to the end of the log (its one iteration), the fresh outputs of every CALL
#    and MUTATE are flagged ``BACKWARD`` (NOTE [ Runtime annotations ] rule 1 in trace.py;
#    views keep 0, as the recorder leaves them), what the runtime flags for the storages
#    autograd's backward pass makes, so a replay in the runtime's semantics pins them as the
#    runtime would (NOTE [ Backward storages ] in core/backward.py). The paper's semantics
#    ignores flags: its replay, and the Figure 2 agreement, are unchanged. Why: without the
#    flags the twin evicted the backward pass's own gradients as ordinary candidates and
#    recomputed parts of the backward pass again and again (the U-Net log at 30 % of its
#    peak; a U-Net recorded with ``tritondtr.trace`` did the same with its flags stripped);
#    measured: docs/history/simulator-log.md, "The logs' backward mark".
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from .builder import TraceBuilder
from .trace import TensorFlag, Trace, TraceError

__all__ = ["is_dtr_log_line", "read_dtr_log"]

_INSTRUCTIONS = {
    "CONSTANT",
    "MEMORY",
    "CALL",
    "ALIAS",
    "MUTATE",
    "COPY",
    "COPY_FROM",
    "RELEASE",
    "ANNOTATE",
}
_MAX_BYTES = 2**63 - 1  # sizes are int64
_NUMBERS = {  # what each numeric field holds, for the messages
    "TIME": "a number >= 0 (the op's cost in ns)",
    "MEMORY": "a whole number of bytes >= 0 (and below 2**63)",
    "ALIAS": "-1 or the position of the argument the result views",
}


def is_dtr_log_line(line: str) -> bool:
    """Whether ``line`` looks like a DTR log line (a JSON object with an INSTRUCTION)."""
    try:
        j = json.loads(line)
    except ValueError:
        return False
    return isinstance(j, dict) and "INSTRUCTION" in j


class _Lines:
    """Parsed (line number, record) pairs with one-record lookahead and error helpers."""

    def __init__(self, records: list[tuple[int, dict]], source: str) -> None:
        self.records = records
        self.pos = 0
        self.source = source

    def error(self, lineno: int, message: str) -> TraceError:
        return TraceError(f"{self.source}:{lineno}: {message}")

    def next(self, want: str, after: str, lineno: int) -> tuple[int, dict]:
        if self.pos >= len(self.records):
            raise self.error(lineno, f"the log ends where the {want} line for {after} was expected")
        n, rec = self.records[self.pos]
        self.pos += 1
        if rec["INSTRUCTION"] != want:
            raise self.error(n, f"expected a {want} line for {after}, got {rec['INSTRUCTION']}")
        return n, rec


def _field(lines: _Lines, n: int, rec: dict, key: str, kind: type = str):
    if key not in rec:
        raise lines.error(n, f"{rec['INSTRUCTION']} line lacks the field {key!r}")
    value = rec[key]
    if kind is list and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise lines.error(n, f"field {key!r} must be a list of names, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise lines.error(n, f"field {key!r} must be a string, got {value!r}")
    return value


def _number(lines: _Lines, n: int, rec: dict, key: str, *, integer: bool) -> float | int:
    if key not in rec:
        raise lines.error(
            n, f"{rec['INSTRUCTION']} line lacks the field {key!r}: expected {_NUMBERS[key]}"
        )
    raw = rec[key]
    value = _parse_number(raw, integer)
    if (
        value is None
        or not value >= (-1 if key == "ALIAS" else 0)  # NaN fails too
        or not (value <= _MAX_BYTES if integer else math.isfinite(value))
    ):
        raise lines.error(n, f"field {key!r} must be {_NUMBERS[key]}, got {raw!r}")
    return value


def _parse_number(raw, integer: bool) -> float | int | None:
    """A numeric string, as the logs write them, or a JSON number; None for anything else. An
    integer field takes no float (``int(1.5)`` would truncate it) and no field takes a bool."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int) if integer else (str, int, float)):
        return None
    try:
        return int(raw) if integer else float(raw)
    except ValueError:
        return None


def read_dtr_log(lines: Iterable[str], source: str = "<log>") -> Trace:
    """Import a DTR prototype log (an iterable of text lines) as a :class:`Trace`.

    Raises :class:`TraceError` as ``source:line: what was wrong`` for malformed JSON, unknown
    instructions, missing or ill-typed fields, out-of-order MEMORY/ALIAS lines and names used
    before they are bound. See NOTE [ DTR log import ].
    """
    records: list[tuple[int, dict]] = []
    for lineno, text in enumerate(lines, start=1):
        text = text.strip()
        if not text:
            continue
        try:
            rec = json.loads(text)
        except ValueError as e:
            raise TraceError(f"{source}:{lineno}: not valid JSON ({e})") from None
        if not isinstance(rec, dict) or "INSTRUCTION" not in rec:
            raise TraceError(f"{source}:{lineno}: expected a JSON object with an INSTRUCTION")
        if not isinstance(rec["INSTRUCTION"], str) or rec["INSTRUCTION"] not in _INSTRUCTIONS:
            raise TraceError(
                f"{source}:{lineno}: unknown instruction {rec['INSTRUCTION']!r}; "
                f"expected one of {sorted(_INSTRUCTIONS)}"
            )
        records.append((lineno, rec))
    starts = [
        i
        for i, (_, r) in enumerate(records)
        if r["INSTRUCTION"] == "ANNOTATE" and r.get("ANNOTATION") == "START"
    ]
    lines_ = _Lines(records[starts[-1] + 1 :] if starts else records, source)
    b = TraceBuilder(
        meta={
            "source": source,
            "format": "dtr-prototype log",
            "cost_unit": "ns",
            "first_line": lines_.records[0][0] if lines_.records else None,
        }
    )
    names: dict[str, int] = {}  # name -> tensor id, in first-binding order (rule 6)
    backward = False  # rule 8: past the backward pass's start

    def lookup(n: int, name: str, what: str) -> int:
        if name not in names:
            raise lines_.error(n, f"{what} uses {name!r}, which no earlier line defined")
        return names[name]

    while lines_.pos < len(lines_.records):
        n, rec = lines_.records[lines_.pos]
        lines_.pos += 1
        ins = rec["INSTRUCTION"]
        if ins == "CONSTANT":
            name = _field(lines_, n, rec, "NAME")
            m, mem = lines_.next("MEMORY", f"constant {name!r}", n)
            if _field(lines_, m, mem, "NAME") != name:
                raise lines_.error(m, f"MEMORY names {mem['NAME']!r}, expected {name!r}")
            names[name] = b.constant(_number(lines_, m, mem, "MEMORY", integer=True), name=name)
        elif ins == "CALL":
            op = _field(lines_, n, rec, "NAME")
            args = [lookup(n, a, f"CALL {op}") for a in _field(lines_, n, rec, "ARGS", list)]
            results = _field(lines_, n, rec, "RESULT", list)
            cost = _number(lines_, n, rec, "TIME", integer=False)
            sizes, aliases = [], []
            for r in results:
                if r in names:
                    raise lines_.error(n, f"CALL {op} result {r!r} is already bound")
                m, mem = lines_.next("MEMORY", f"result {r!r}", n)
                a, ali = lines_.next("ALIAS", f"result {r!r}", n)
                for k, x in ((m, mem), (a, ali)):
                    if _field(lines_, k, x, "NAME") != r:
                        raise lines_.error(
                            k, f"{x['INSTRUCTION']} names {x['NAME']!r}, expected result {r!r}"
                        )
                alias = _number(lines_, a, ali, "ALIAS", integer=True)
                if alias >= len(args):
                    raise lines_.error(
                        a, f"ALIAS {alias} of {r!r}: CALL {op} has only {len(args)} arguments"
                    )
                sizes.append(_number(lines_, m, mem, "MEMORY", integer=True))
                aliases.append(alias)
            if not results:
                raise lines_.error(n, f"CALL {op} has no RESULT")
            outs = b.call(op, args, sizes, cost, aliases, flags=_flags(backward, aliases))
            for r, t in zip(results, outs):
                names[r] = t
        elif ins == "MUTATE":
            op = _field(lines_, n, rec, "NAME")
            arg_names = _field(lines_, n, rec, "ARGS", list)
            args = [lookup(n, a, f"MUTATE {op}") for a in arg_names]
            raw = rec.get("MUTATE")
            try:
                mutated = [int(i) for i in raw]
            except (TypeError, ValueError):
                raise lines_.error(
                    n, f"field 'MUTATE' must list argument indices, got {raw!r}"
                ) from None
            if not mutated or any(not 0 <= i < len(args) for i in mutated):
                raise lines_.error(
                    n, f"MUTATE indices {raw!r} must be argument positions 0..{len(args) - 1}"
                )
            cost = _number(lines_, n, rec, "TIME", integer=False)
            sizes = [b.storage_size(args[i]) for i in mutated]
            outs = b.call(op, args, sizes, cost, flags=_flags(backward, [-1] * len(sizes)))
            for i, new in zip(mutated, outs):
                old = names[arg_names[i]]
                names[arg_names[i]] = new
                _release(lines_, n, b, old, arg_names[i])
        elif ins == "COPY":
            dst, src = _field(lines_, n, rec, "DST"), _field(lines_, n, rec, "SRC")
            if dst in names:
                raise lines_.error(n, f"COPY to {dst!r}, which is already bound (use COPY_FROM)")
            t = lookup(n, src, "COPY")
            names[dst] = t
            b.retain(t)
        elif ins == "COPY_FROM":
            dst, src = _field(lines_, n, rec, "DST"), _field(lines_, n, rec, "SRC")
            old, t = lookup(n, dst, "COPY_FROM"), lookup(n, src, "COPY_FROM")
            names[dst] = t
            _release(lines_, n, b, old, dst)
            b.retain(t)
        elif ins == "RELEASE":
            name = _field(lines_, n, rec, "NAME")
            if name in names:
                _release(lines_, n, b, names[name], name)
        elif ins == "ANNOTATE":
            text = _field(lines_, n, rec, "ANNOTATION")
            b.annotate(text)
            backward = backward or text == "BACKWARD"
        else:  # MEMORY, ALIAS
            raise lines_.error(n, f"{ins} line outside a CONSTANT or CALL block")
    done: set[int] = set()
    for t in names.values():
        if t not in done and b.refcount(t) > 0:
            b.output(t)
            done.add(t)
    return b.build(outputs="none").validate()


def _flags(backward: bool, aliases: list[int]) -> list[int] | None:
    """Rule 8: the flags of outputs with these aliases (-1: a fresh storage), None (all 0)
    before the backward pass."""
    if not backward:
        return None
    return [int(TensorFlag.BACKWARD) if a < 0 else 0 for a in aliases]


def _release(lines: _Lines, n: int, b: TraceBuilder, t: int, name: str) -> None:
    if b.refcount(t) <= 0:
        raise lines.error(n, f"{name!r} is released more often than it was referenced")
    b.release(t)
