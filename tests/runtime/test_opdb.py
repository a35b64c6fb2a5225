"""PyTorch's operator database under the runtime's stress setting, compared with eager.

For every op of ``op_db`` that supports autograd on the CPU, a sample's program (clone every
input tensor, run the op, pull random cotangents back through it) runs once in eager mode and
once under ``tritondtr.runtime.enable(stress=True)``, which evicts everything evictable after
every op, so the op's output and every saved tensor of its backward are recomputed. Outputs
and gradients must be ``torch.equal`` (NaN where eager has NaN); an op that tritondtr cannot
run must raise :class:`~tritondtr.runtime.UnsupportedOpError` and be listed in docs/opdb.md.

# NOTE [ op_db sweep ]
# 1. The population is every OpInfo with ``supports_autograd`` and a CPU backward dtype
#    (float64 preferred, then float32, complex128, complex64, bfloat16, float16).
# 2. Inputs are cloned *inside* the context, so they are tracked and evicted too; eager runs
#    the same program. Random ops see ``torch.manual_seed(SEED)`` right before the op in both.
# 3. Values are compared exactly. Ops whose output is uninitialised memory (``empty`` family,
#    see ``_UNINITIALISED``) are compared by shape and dtype only.
# 4. The default run takes every sample of every op (``test_op_all_samples``, ~1.5 min on 2
#    cores with one torch thread) and, as a quick subset that ``-m "not slow"`` keeps, each
#    op's first sample that eager can run. ``python tests/runtime/test_opdb.py --all-samples`` runs
#    the sweep and writes docs/opdb.md (from every sample).
# 5. Outcomes: ``pass``; ``unsupported`` (UnsupportedOpError, allowed when documented);
#    ``mismatch``, ``error`` (anything else raised under tritondtr) and ``crash`` (the process
#    died; ops in ``ISOLATED`` run in a child process) are failures.
# 6. Known failures (``KNOWN_FAILURES``, with their cause) are strict xfails and listed in
#    docs/opdb.md; they count against the 95 % like unsupported ops.
# 7. Ops whose eager results differ from run to run (``EAGER_NONDETERMINISTIC``, with the
#    evidence) are compared with rtol = atol = 1e-12 instead of exactly.
# 8. A second pass runs each op's first sample with ``budget=None, debug=True``: nothing is
#    evicted, so storages stay resident side by side, and debug mode asserts after every op
#    that no two resident tracked storages share a buffer. Stress hides an op that returns a
#    view its schema calls fresh (the storages are never resident together); this pass does
#    not (``unsafe_split`` was such an op: a wrong LSTM loss under a budget).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map

pytest.importorskip("expecttest")
from torch.testing._internal import common_utils
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo import core as opinfo_core

from tritondtr.runtime import UnsupportedOpError, enable, unwrap

SEED = 1234
DOCS = Path(__file__).resolve().parents[2] / "docs" / "opdb.md"
_DTYPES = (
    torch.float64,
    torch.float32,
    torch.complex128,
    torch.complex64,
    torch.bfloat16,
    torch.float16,
)
_UNINITIALISED = re.compile(r"(^|\.|_)empty")
FAILURES = ("mismatch", "error", "crash")
_MAX_TRIES = 8  # samples tried before an op counts as "eager cannot run any sample"

KNOWN_FAILURES: dict[str, str] = {
    # NOTE [ op_db sweep ] rule 6: open problems; strict xfails, so a fix makes the test fail
    # until its entry is removed here.
    "tensor_split": (
        "error, not a mismatch: with a tensor of indices the composite op reads "
        "the indices' memory in C++ without dispatching (const_data_ptr), which "
        "no dispatch-level runtime sees, and PyTorch raises 'data is not "
        "allocated yet'; pass the indices as a list or as "
        "tritondtr.runtime.unwrap(indices) (docs/runtime.md)"
    ),
}
_GELSY = (
    "LAPACK gelsy (the CPU default driver) gives other last bits depending on buffer "
    "alignment: 89 of 200 eager runs on the same inputs differed from the first"
)
EAGER_NONDETERMINISTIC: dict[str, str] = {
    # NOTE [ op_db sweep ] rule 7: eager differs from itself; values within 1e-12 relative.
    "linalg.lstsq": _GELSY,
    "linalg.lstsq.grad_oriented": _GELSY,
}
ISOLATED = {"sparse.mm.reduce"}  # can kill the interpreter: run in a child process


def _dtype(op) -> torch.dtype | None:
    ds = op.supported_backward_dtypes("cpu")
    return next((d for d in _DTYPES if d in ds), None)


def op_id(op) -> str:
    """``name`` or ``name.variant``: the id of a test and of a row in docs/opdb.md."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = [op for op in op_db if op.supports_autograd and _dtype(op) is not None]
EXCLUDED = [op for op in op_db if op.supports_autograd and _dtype(op) is None]


# ----------------------------------------------------------------------------- one program
def _program(op, sample, leaves):
    """The program compared: clone inputs, run ``op``, pull cotangents back.

    Returns (plain outputs, plain gradients or None per leaf)."""

    def clone(t):
        return t.clone() if isinstance(t, torch.Tensor) else t

    inp, args, kwargs = tree_map(clone, (sample.input, sample.args, sample.kwargs))
    torch.manual_seed(SEED)
    out = sample.output_process_fn_grad(op(inp, *args, **kwargs))
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    diff = [t for t in outs if t.requires_grad]
    grads = [None] * len(leaves)
    if diff and leaves:
        gen = torch.Generator().manual_seed(SEED)
        with torch.no_grad():  # plain cotangents (NOTE [ What is tracked ] rule 2)
            cots = [_randlike(t, gen) for t in diff]
        grads = list(torch.autograd.grad(diff, leaves, cots, allow_unused=True))
    return [unwrap(t) for t in outs], [None if g is None else unwrap(g) for g in grads]


def _randlike(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if t.dtype.is_complex:
        real = torch.randn(t.shape, generator=gen, dtype=t.real.dtype)
        return torch.complex(real, torch.randn(t.shape, generator=gen, dtype=t.real.dtype))
    return torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)


def _same(a, b, values: bool, tol: bool = False) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if a.layout != torch.strided:  # sparse gradients (sparse.mm.reduce): compare the values
        a, b = a.to_dense(), b.to_dense()
    if not values or a.numel() == 0:
        return True
    if tol:
        return torch.allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


STRESS = {"stress": True}
RESIDENT_DEBUG = {"budget": None, "debug": True}  # NOTE [ op_db sweep ] rule 8


def run_sample(op, sample, settings: dict = STRESS) -> tuple[str, str]:
    """(outcome, detail) of one sample under ``enable(**settings)``: see NOTE [ op_db sweep ]
    rule 5. Raises whatever eager raises (the sample is then not usable)."""
    leaves = [
        t
        for t in tree_leaves((sample.input, sample.args, sample.kwargs))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    ref_out, ref_grad = _program(op, sample, leaves)
    try:
        with enable(**settings) as session:
            out, grad = _program(op, sample, leaves)
    except UnsupportedOpError as e:
        return "unsupported", str(e)
    except Exception as e:  # every other failure is reported, with its type
        return "error", f"{type(e).__name__}: {e}"
    values = not _UNINITIALISED.search(op.name)
    tol = op_id(op) in EAGER_NONDETERMINISTIC
    if len(out) != len(ref_out) or not all(_same(a, b, values, tol) for a, b in zip(out, ref_out)):
        return "mismatch", "outputs differ from eager"
    if not all(_same(a, b, True, tol) for a, b in zip(grad, ref_grad)):
        bad = [i for i, (a, b) in enumerate(zip(grad, ref_grad)) if not _same(a, b, True, tol)]
        return "mismatch", f"gradients of inputs {bad} differ from eager"
    st = session.stats
    return "pass", f"{st.evictions} evictions, {st.rematerializations} rematerializations"


def samples(op, all_samples: bool):
    """Yield the samples to run: the first one eager can run, or all of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(op.sample_inputs("cpu", _dtype(op), requires_grad=True))
        for k, s in enumerate(it):
            if not all_samples and k >= _MAX_TRIES:
                return
            yield s


def sweep_op(op, all_samples: bool = False, settings: dict = STRESS) -> tuple[str, str, int]:
    """(outcome, detail, samples run) of one op; the worst outcome over its samples."""
    n, outcome, detail = 0, "eager-error", "eager raised on every sample tried"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in samples(op, all_samples):
            try:
                res, why = run_sample(op, s, settings)
            except Exception:  # eager itself rejects this sample: try the next
                continue
            n += 1
            if outcome in ("eager-error", "pass") or res != "pass":
                outcome, detail = res, why
            if res != "pass" or not all_samples:
                break
    return outcome, detail, n


# ------------------------------------------------------------------------------ the tests
def documented_unsupported(path: Path = DOCS) -> dict[str, str]:
    """op id -> reason, from the table of unsupported ops in docs/opdb.md."""
    if not path.exists():
        return {}
    text = path.read_text().split("## Unsupported ops", 1)
    rows = text[1].split("\n## ", 1)[0] if len(text) > 1 else ""
    return {
        m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([^`]+)` \|(.*)\|$", rows, re.M)
    }


@functools.cache
def _isolated_sweep(key: str, all_samples: bool) -> tuple[str, str, int]:
    return sweep_isolated(all_samples, {key}, log=lambda _: None)[key]


def _isolated_outcome(key: str, all_samples: bool) -> tuple[str, str, int]:
    """An ``ISOLATED`` op's outcome, from one child process for both tests where it can be: a
    sweep of every sample that passed (or in which eager rejected every sample) says the same
    of the first sample; any other outcome runs the first sample's sweep in a child of its
    own. A child starts in ~4 s (it imports torch and ``op_db``)."""
    every = _isolated_sweep(key, True)
    if all_samples or every[0] in ("pass", "eager-error"):
        return every
    return _isolated_sweep(key, False)


def _check(op, all_samples: bool, settings: dict = STRESS) -> None:
    if op_id(op) in ISOLATED:
        if settings is not STRESS:
            pytest.skip("runs in a child process, under stress only")
        outcome, detail, _ = _isolated_outcome(op_id(op), all_samples)
    else:
        outcome, detail, _ = sweep_op(op, all_samples, settings)
    if outcome == "eager-error":
        pytest.skip("eager raises on every sample tried")
    if outcome == "unsupported":
        if " on torch < " in detail:  # refused on older torch only (docs/runtime.md)
            return
        assert op_id(op) in documented_unsupported(), (
            f"{op_id(op)} raises 'not supported' but is not listed in docs/opdb.md "
            f"(run python tests/runtime/test_opdb.py): {detail}"
        )
        return
    assert outcome == "pass", f"{op_id(op)}: {outcome}: {detail}"


@pytest.fixture(autouse=True, scope="module")
def _cheap_sample_and_seed_bookkeeping():
    """Two costs of torch's test machinery that the sweep does not need, gone (each was about
    half the first-sample tests' time under pytest, more with many modules imported):

    - ``op.sample_inputs`` looks for the ``unittest.TestCase`` running it, twice per op, with
      ``inspect.stack()``, which reads the source of every frame of pytest's deep stack. No
      test here is a TestCase, so that search finds none: it returns None directly.
    - ``torch.manual_seed`` also seeds CUDA, XPU and MTIA; on a machine without one, torch
      queues that seeding for a later initialisation, with a formatted stack trace, each time.
      The sweep seeds about three times per sample (``_program`` twice, ``sample_inputs``
      once); the CPU generator the ops use is still seeded."""
    patch = pytest.MonkeyPatch()
    for module in (common_utils, opinfo_core):  # private to torch: absent is fine
        patch.setattr(module, "extract_test_fn", lambda: None, raising=False)
    for name in ("cuda", "xpu", "mtia"):
        backend = getattr(torch, name, None)
        if backend is not None and not backend.is_available():
            patch.setattr(backend, "manual_seed_all", lambda seed: None)
    yield
    patch.undo()


def _params():
    for op in OPS:
        why = KNOWN_FAILURES.get(op_id(op))
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        yield pytest.param(op, marks=marks, id=op_id(op))


@pytest.mark.parametrize("op", list(_params()))
def test_op_first_sample(op):
    _check(op, all_samples=False)


@pytest.mark.slow
@pytest.mark.parametrize("op", list(_params()))
def test_op_all_samples(op):
    _check(op, all_samples=True)


@pytest.mark.parametrize("op", list(_params()))
def test_op_first_sample_resident_debug(op):
    """NOTE [ op_db sweep ] rule 8: no op's outputs share a buffer the runtime counts twice."""
    _check(op, all_samples=False, settings=RESIDENT_DEBUG)


def test_pass_rate_at_least_95_percent():
    """Every op passes, is documented as unsupported or is a known failure (the other tests
    check which): the pass rate is >= 95 % when those two lists are <= 5 % of the ops."""
    ids = {op_id(op) for op in OPS}
    listed = documented_unsupported()
    assert set(listed) <= ids, f"docs/opdb.md lists unknown ops {sorted(set(listed) - ids)}"
    assert set(KNOWN_FAILURES) <= ids, sorted(set(KNOWN_FAILURES) - ids)
    failing = len(listed) + len(KNOWN_FAILURES)
    assert failing <= 0.05 * len(ids), f"{failing} of {len(ids)} ops do not pass, over 5 %"


# -------------------------------------------------------------------------- docs/opdb.md
def write_docs(
    results: dict[str, tuple[str, str, int]], all_samples: bool, seconds: float, path: Path = DOCS
) -> None:
    """docs/opdb.md from a sweep's results (op id -> (outcome, detail, samples))."""
    from tritondtr.env import report

    env = report()
    counts = {
        k: sum(1 for r in results.values() if r[0] == k)
        for k in ("pass", "unsupported", "eager-error", *FAILURES)
    }
    tested = len(results) - counts["eager-error"]
    rate = 100.0 * counts["pass"] / max(tested, 1)
    lines = [
        "# PyTorch's operator database under tritondtr",
        "",
        "Generated by `python tests/runtime/test_opdb.py"
        + (" --all-samples" if all_samples else "")
        + "` (do not edit by hand); checked by "
        "`pytest tests/runtime/test_opdb.py` (every sample; `-m 'not slow'`: the first per op).",
        "How ops are run and compared: NOTE [ op_db sweep ] in `tests/runtime/test_opdb.py`. "
        "In short: every op of `op_db` that supports autograd on the CPU runs its sample inputs "
        "under `tritondtr.runtime.enable(stress=True)` (everything evictable is evicted after "
        "every op), and its outputs and input gradients must be `torch.equal` to eager's.",
        "",
        f"- ops: {len(results)} ({len(EXCLUDED)} more support autograd but have no CPU "
        "backward dtype: " + ", ".join(f"`{op_id(o)}`" for o in EXCLUDED) + ")",
        f"- samples: {'all' if all_samples else 'first runnable one per op'}; sweep took "
        f"{seconds:.0f} s",
        f"- **pass: {counts['pass']} of {tested} ({rate:.1f} %)**; unsupported (clear error): "
        f"{counts['unsupported']}; mismatch: {counts['mismatch']}; other error: "
        f"{counts['error']}; crash: {counts['crash']}; eager rejects every sample tried: "
        f"{counts['eager-error']}",
        f"- run with: torch {env['torch']}, python {env['python']}, {env['device']}, "
        f"{env['platform']}",
        "",
    ]
    for title, kinds in (
        ("Unsupported ops", ("unsupported",)),
        ("Failures (mismatch, error or crash: bugs)", FAILURES),
        ("Not tested (eager rejects every sample tried)", ("eager-error",)),
    ):
        lines += [f"## {title}", "", "| op | outcome | cause |", "|---|---|---|"]
        rows = [(k, r) for k, r in sorted(results.items()) if r[0] in kinds]
        lines += [
            f"| `{k}` | {r[0]}: {_cell(r[1])} | {_cause(k, r[0], r[1])} |" for k, r in rows
        ] or ["| (none) | | |"]
        lines.append("")
    path.write_text("\n".join(lines))


def _cause(key: str, outcome: str, detail: str) -> str:
    if outcome == "unsupported" and "Differentiate it" in detail:
        return (
            "refused only when differentiated (NOTE [ Op semantics ] rule 7 in "
            "tritondtr/runtime/semantics.py); runs under torch.no_grad()"
        )
    if outcome == "unsupported":
        return "the op (or its decomposition) runs the refused aten op on a tracked tensor"
    return KNOWN_FAILURES.get(key, "not analysed yet")


def _cell(text: str) -> str:
    m = re.match(
        r"tritondtr: (\S+) is not supported on tracked tensors: (.*?)\. "
        r"(Call|Differentiate) it",
        text,
    )
    if m:  # UnsupportedOpError: the aten op (maybe inside the op's decomposition) and why
        text = f"`{m.group(1)}`: {m.group(2)}"
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def _worker(start: int, all_samples: bool, only: set[str]) -> None:
    """Sweep ``OPS[start:]`` printing one JSON line when an op starts and when it ends."""
    for op in OPS[start:]:
        if only and op_id(op) not in only:
            continue
        print(json.dumps(["start", op_id(op)]), flush=True)
        t = time.perf_counter()
        r = sweep_op(op, all_samples)
        print(json.dumps(["done", op_id(op), *r, time.perf_counter() - t]), flush=True)


def sweep_isolated(all_samples: bool, only: set[str], log=print) -> dict:
    """The sweep in child processes: an op that kills its process (a segfault) is recorded
    as a ``crash`` and the sweep goes on after it in a new process."""
    results: dict[str, tuple[str, str, int]] = {}
    ids = [op_id(op) for op in OPS]
    start = 0
    while start < len(ids):
        cmd = [sys.executable, __file__, "--worker", str(start)]
        cmd += ["--all-samples"] if all_samples else []
        cmd += ["--ops", *only] if only else []
        current = None
        with subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        ) as child:
            for line in child.stdout:
                msg = json.loads(line)
                if msg[0] == "start":
                    current = msg[1]
                    continue
                current = None
                results[msg[1]] = tuple(msg[2:5])
                log(f"{msg[1]:45s} {msg[2]:12s} {msg[5]:6.2f}s  {msg[3][:150]}")
        if current is None:
            break
        results[current] = (
            "crash",
            f"the process died (exit status {child.returncode}) while the op ran under tritondtr",
            0,
        )
        log(f"{current:45s} crash")
        start = ids.index(current) + 1
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run the op_db sweep and write docs/opdb.md.")
    p.add_argument("--all-samples", action="store_true", help="every sample, not just one")
    p.add_argument("--ops", nargs="*", help="only these op ids (prints, writes nothing)")
    p.add_argument("--out", type=Path, default=DOCS, help="markdown file to write")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    only = set(args.ops or ())
    if args.worker is not None:
        _worker(args.worker, args.all_samples, only)
        return 0
    t0 = time.perf_counter()
    results = sweep_isolated(args.all_samples, only)
    seconds = time.perf_counter() - t0
    if not only:
        write_docs(results, args.all_samples, seconds, args.out)
    bad = [k for k, r in results.items() if r[0] in FAILURES]
    print(f"{len(results)} ops, {len(bad)} failures, {seconds:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
