"""Which heuristic reaches torch.utils.checkpoint's memory at less than its recomputation?

GPT-2 small's forward and backward (12 x 768, 50257 tokens, fp32, eager attention, no
dropout, batch B x 1024: the GPU check's ``gpt2`` stage at a CPU's batch) recorded twice on the
CPU with the H100 model's op costs: plainly, and with every block checkpointed as Hugging Face
users do it. Then the plain step replayed on the twin (the runtime's own DTR core, exactly what
``tritondtr.enable`` would do) per heuristic at two budgets: checkpoint's tracked peak, and that
peak less the step's largest op output (the budget bounds the bytes before an op, not its
outputs: NOTE [ Budget accounting ] rule 2), so that the twin's peak equals checkpoint's.
Prints a markdown table.

# NOTE [ Checkpoint on the twin ]
# 1. Costs are the H100 model's (``tritondtr.runtime.cost.H100_SXM``), not this CPU's times:
#    a GPU's ratio of matmul to elementwise time, which is what DTR's choices depend on.
# 2. Compute is the sum of the recorded ops' costs; checkpoint's overhead is its recorded
#    step (the recomputed block forwards included) over the plain one, DTR's is the plain
#    step plus the twin's recomputation, over the plain one.
# 3. Needs ``transformers`` (``pip install tritondtr[hf]``); ~90 s at batch 2 on 2 CPU cores.

examples:
  python benchmarks/bench_sim_checkpoint.py             # batch 2 x 1024
  python benchmarks/bench_sim_checkpoint.py --batch 1
  python benchmarks/bench_sim_checkpoint.py --traces gpt2_step.npz gpt2_step_checkpoint.npz
      # the two steps the GPU check records, with the device's measured costs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

HEURISTICS = ("dtr_eq", "dtr", "msps", "lru", "size")


def _gpt2_small():
    from recorded import hf_model

    torch.manual_seed(0)
    model = hf_model(
        "gpt2", layers=12, width=768, heads=12, vocab=50257, positions=1024, dropout=0.0
    )
    model.config._attn_implementation = "eager"
    return model


def _recorded(checkpointed: bool, ids: torch.Tensor):
    """(trace, tracked peak bytes, largest op output bytes) of one step."""
    import tritondtr
    from tritondtr.runtime.cost import H100_SXM

    model = _gpt2_small()
    if checkpointed:
        from bench_runtime_checkpoint import _hf_checkpoint

        _hf_checkpoint(model)
    with tritondtr.trace(budget=None, cost=H100_SXM) as rec:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    st = rec.session.stats
    return rec.trace, st.peak_bytes, st.max_op_out_bytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2, help="sequences of 1024 tokens (default 2)")
    ap.add_argument(
        "--traces",
        nargs=2,
        type=Path,
        metavar=("PLAIN", "CHECKPOINTED"),
        help="recorded steps to read instead of recording (the GPU check's two .npz files)",
    )
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch must be >= 1, got {args.batch}")
    from tritondtr.sim.twin import replay_runtime

    torch.set_num_threads(1)
    if args.traces is not None:
        from tritondtr.traceformat.trace_io import load_trace

        for path in args.traces:
            if not path.is_file():
                ap.error(f"--traces: no file {path}")
        plain, ck = (load_trace(path) for path in args.traces)
        peak, largest = (plain.meta["runtime"][k] for k in ("peak_bytes", "max_op_out_bytes"))
        ck_peak = ck.meta["runtime"]["peak_bytes"]
        what = f"{args.traces[0].name}, its recorded costs ({plain.meta.get('cost_model')})"
    else:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("bench_sim_checkpoint: needs transformers (pip install tritondtr[hf])")
            return 2
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 50257, (args.batch, 1024), generator=g)
        plain, peak, largest = _recorded(False, ids)
        ck, ck_peak, _ = _recorded(True, ids)
        what = f"GPT-2 small, batch {args.batch} x 1024, H100 costs"
    compute = float(np.sum(plain.op_cost))
    ck_over = float(np.sum(ck.op_cost)) / compute
    print(f"{what}; plain tracked peak {peak:,} B")
    print(f"checkpoint: {ck_over:.3f}x compute at {ck_peak / peak:.3f} of the peak; the largest")
    print(f"op output is {largest / peak:.3f} of the peak\n")
    print("| heuristic | budget (of the peak) | peak | recomputations | compute |")
    print("|---|---:|---:|---:|---:|")
    print(f"| checkpoint | - | {ck_peak / peak:.3f} | - | {ck_over:.3f}x |")
    for h in HEURISTICS:
        for budget in (ck_peak - largest, ck_peak):
            st, _ = replay_runtime(plain, h, budget)
            over = (compute + st.remat_compute) / compute
            tag = "" if st.status == "ok" else f" ({st.status})"
            print(
                f"| {h} | {budget / peak:.3f} | {st.peak_bytes / peak:.3f} | {st.remats}{tag} "
                f"| {over:.3f}x |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
