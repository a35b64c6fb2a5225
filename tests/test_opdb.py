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
# 4. The default run takes each op's first sample that eager can run; ``-m slow`` runs every
#    sample of every op. ``python tests/test_opdb.py`` runs the sweep and writes docs/opdb.md.
# 5. Outcomes: ``pass``; ``unsupported`` (UnsupportedOpError, allowed when documented);
#    ``mismatch`` and ``error`` (anything else raised under tritondtr) are failures.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_map

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db

from tritondtr.runtime import UnsupportedOpError, enable, unwrap

SEED = 1234
DOCS = Path(__file__).resolve().parent.parent / "docs" / "opdb.md"
_DTYPES = (torch.float64, torch.float32, torch.complex128, torch.complex64, torch.bfloat16,
           torch.float16)
_UNINITIALISED = re.compile(r"(^|\.|_)empty")
_MAX_TRIES = 8  # samples tried before an op counts as "eager cannot run any sample"


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


def _same(a, b, values: bool) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not values or a.numel() == 0:
        return True
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def run_sample(op, sample) -> tuple[str, str]:
    """(outcome, detail) of one sample: see NOTE [ op_db sweep ] rule 5. Raises whatever
    eager raises (the sample is then not usable)."""
    leaves = [t for t in tree_leaves((sample.input, sample.args, sample.kwargs))
              if isinstance(t, torch.Tensor) and t.requires_grad]
    ref_out, ref_grad = _program(op, sample, leaves)
    try:
        with enable(stress=True) as session:
            out, grad = _program(op, sample, leaves)
    except UnsupportedOpError as e:
        return "unsupported", str(e)
    except Exception as e:  # every other failure is reported, with its type
        return "error", f"{type(e).__name__}: {e}"
    values = not _UNINITIALISED.search(op.name)
    if len(out) != len(ref_out) or not all(_same(a, b, values) for a, b in zip(out, ref_out)):
        return "mismatch", "outputs differ from eager"
    if not all(_same(a, b, True) for a, b in zip(grad, ref_grad)):
        bad = [i for i, (a, b) in enumerate(zip(grad, ref_grad)) if not _same(a, b, True)]
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


def sweep_op(op, all_samples: bool = False) -> tuple[str, str, int]:
    """(outcome, detail, samples run) of one op; the worst outcome over its samples."""
    n, outcome, detail = 0, "eager-error", "eager raised on every sample tried"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in samples(op, all_samples):
            try:
                res, why = run_sample(op, s)
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
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([^`]+)` \|(.*)\|$",
                                                             rows, re.M)}


def _check(op, all_samples: bool) -> None:
    outcome, detail, _ = sweep_op(op, all_samples)
    if outcome == "eager-error":
        pytest.skip("eager raises on every sample tried")
    if outcome == "unsupported":
        assert op_id(op) in documented_unsupported(), (
            f"{op_id(op)} raises 'not supported' but is not listed in docs/opdb.md "
            f"(run python tests/test_opdb.py): {detail}")
        return
    assert outcome == "pass", f"{op_id(op)}: {outcome}: {detail}"


@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_op_first_sample(op):
    _check(op, all_samples=False)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_op_all_samples(op):
    _check(op, all_samples=True)


def test_documented_unsupported_within_five_percent():
    """With every op passing or documented as unsupported, the pass rate is >= 95 %."""
    ids = {op_id(op) for op in OPS}
    listed = documented_unsupported()
    assert set(listed) <= ids, f"docs/opdb.md lists unknown ops {sorted(set(listed) - ids)}"
    assert len(listed) <= 0.05 * len(ids), (
        f"{len(listed)} of {len(ids)} ops are unsupported, more than 5 %")


# -------------------------------------------------------------------------- docs/opdb.md
def write_docs(results: dict[str, tuple[str, str, int]], all_samples: bool, seconds: float,
               path: Path = DOCS) -> None:
    """docs/opdb.md from a sweep's results (op id -> (outcome, detail, samples))."""
    from tritondtr.env import report

    env = report()
    counts = {k: sum(1 for r in results.values() if r[0] == k)
              for k in ("pass", "unsupported", "mismatch", "error", "eager-error")}
    tested = len(results) - counts["eager-error"]
    rate = 100.0 * counts["pass"] / max(tested, 1)
    lines = [
        "# PyTorch's operator database under tritondtr",
        "",
        "Generated by `python tests/test_opdb.py"
        + (" --all-samples" if all_samples else "") + "` (do not edit by hand); checked by "
        "`pytest tests/test_opdb.py` (first sample per op; `-m slow`: every sample).",
        "How ops are run and compared: NOTE [ op_db sweep ] in `tests/test_opdb.py`. In short: "
        "every op of `op_db` that supports autograd on the CPU runs its sample inputs under "
        "`tritondtr.runtime.enable(stress=True)` (everything evictable is evicted after every "
        "op), and its outputs and input gradients must be `torch.equal` to eager's.",
        "",
        f"- ops: {len(results)} ({len(EXCLUDED)} more support autograd but have no CPU "
        "backward dtype: " + ", ".join(f"`{op_id(o)}`" for o in EXCLUDED) + ")",
        f"- samples: {'all' if all_samples else 'first runnable one per op'}; sweep took "
        f"{seconds:.0f} s",
        f"- **pass: {counts['pass']} of {tested} ({rate:.1f} %)**; unsupported (clear error): "
        f"{counts['unsupported']}; mismatch: {counts['mismatch']}; other error: "
        f"{counts['error']}; eager rejects every sample tried: {counts['eager-error']}",
        f"- run with: torch {env['torch']}, python {env['python']}, {env['device']}, "
        f"{env['platform']}",
        "",
    ]
    for title, kinds in (("Unsupported ops", ("unsupported",)),
                         ("Failures (mismatch or error: bugs)", ("mismatch", "error")),
                         ("Not tested (eager rejects every sample tried)", ("eager-error",))):
        lines += [f"## {title}", "", "| op | reason |", "|---|---|"]
        rows = [(k, r) for k, r in sorted(results.items()) if r[0] in kinds]
        lines += [f"| `{k}` | {_cell(r[1])} |" for k, r in rows] or ["| (none) | |"]
        lines.append("")
    path.write_text("\n".join(lines))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run the op_db sweep and write docs/opdb.md.")
    p.add_argument("--all-samples", action="store_true", help="every sample, not just one")
    p.add_argument("--ops", nargs="*", help="only these op ids (prints, writes nothing)")
    p.add_argument("--out", type=Path, default=DOCS, help="markdown file to write")
    args = p.parse_args(argv)
    t0, results = time.perf_counter(), {}
    for op in OPS:
        if args.ops and op_id(op) not in args.ops:
            continue
        t = time.perf_counter()
        results[op_id(op)] = r = sweep_op(op, args.all_samples)
        print(f"{op_id(op):45s} {r[0]:12s} {time.perf_counter() - t:6.2f}s  {r[1][:150]}",
              flush=True)
    seconds = time.perf_counter() - t0
    if not args.ops:
        write_docs(results, args.all_samples, seconds, args.out)
    bad = [k for k, r in results.items() if r[0] in ("mismatch", "error")]
    print(f"{len(results)} ops, {len(bad)} failures, {seconds:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
