"""What does the engine's stale batched choice (NOTE [ Stale batched choice ]) cost the policy?

Measured on the twin (so the same recorded program for every setting): rematerializations,
scorings and replay time of exact choice (``reuse=0``) against one scoring reused for up to
4 and 16 clock ticks, on recorded traces of the zoo (scale 4) and the GRU loop of
recorded.py, at 70 / 50 / 30 % of the runtime's peak.

examples:
  python benchmarks/bench_sim_reuse.py     # ~1 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from recorded import gru_step, record, zoo, zoo_step  # noqa: E402

from tritondtr.sim import runtime_peak  # noqa: E402
from tritondtr.sim.twin import replay_runtime  # noqa: E402

REUSE = (0, 4, 16)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Prints a markdown table; takes no options.",
    ).parse_args(argv)
    torch.set_num_threads(1)
    steps = {f"{n}-s4": zoo_step(n, 4) for n in zoo.ZOO}
    steps["gru40"] = gru_step()
    print("| trace | ratio | remats (reuse 0 / 4 / 16) | scorings | replay ms |")
    print("|---|---|---|---|---|")
    for name, step in steps.items():
        trace = record(step).trace
        peak = runtime_peak(trace)
        for r in (0.7, 0.5, 0.3):
            out = []
            for reuse in REUSE:
                st, core = replay_runtime(trace, "dtr_eq", int(r * peak), reuse=reuse)
                scorings = core.engine.selections if core.engine is not None else 0
                tag = "" if st.status == "ok" else f" ({st.status})"
                out.append((f"{st.remats}{tag}", str(scorings), f"{st.wall_s * 1e3:.0f}"))
            cols = [" / ".join(o[k] for o in out) for k in range(3)]
            print(f"| {name} | {r} | {cols[0]} | {cols[1]} | {cols[2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
