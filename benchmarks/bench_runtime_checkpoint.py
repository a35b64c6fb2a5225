"""Is tritondtr faster than ``torch.utils.checkpoint`` at the same measured peak memory?

For models with a natural segmentation (the zoo's MLP and CNN, ``nn.Sequential``, split with
``checkpoint_sequential``; the demo's GPT, every block checkpointed; a Hugging Face GPT-2,
every block checkpointed by ``activation_checkpointing_enable``), the checkpointed step's
peak is measured in tritondtr's accounting (``enable(budget=None)`` around it: every storage
the step creates, recomputation included). tritondtr then runs the *unmodified* model under a
budget chosen so that its measured peak is at most that peak, and both step times are
compared (checkpoint runs in plain eager mode, as users run it).

# NOTE [ Checkpoint comparison ]
# 1. Budget search: start at the checkpoint's peak P; while tritondtr's measured peak exceeds
#    it (by the outputs of the op in flight, NOTE [ Budget accounting ]), lower the budget by
#    the excess, and by at least P / 512, doubled at each try (the peak
#    moves in steps of evicted tensors: on hf-gpt2 it stayed 8 bytes over P at four budgets
#    8 bytes apart), at most 8 times. The rows give both peaks and every try.
# 2. Rows per model: ``step_time`` (ms) for ``eager``, ``checkpoint`` and ``tritondtr``;
#    ``peak`` (bytes) for all three; ``vs_checkpoint`` = tritondtr / checkpoint step time
#    (target: <= 1, issue 4 section 5; issue 9 part 5 adds the GPT-2 of rule 4). ``size``
#    is eager's peak in bytes.
# 3. ``wrapper-floor`` (``floor.py``): the plain step under a minimal wrapper subclass, timed
#    in the same rounds; no memory is saved (its ``peak`` row is eager's). Where it is slower
#    than ``checkpoint``, no runtime of tritondtr's design can reach the target on that model.
# 4. ``hf-gpt2``: ``transformers.GPT2LMHeadModel`` built from config by ``recorded.hf_model``
#    (6 blocks, width 256, 4 heads, vocabulary 512, eager attention, dropout 0, seed 0), one
#    batch of 4 x 128 tokens, ``use_cache=False`` in both runs, SGD. Checkpointed as its
#    users do it: ``model.activation_checkpointing_enable`` (``gradient_checkpointing_enable``,
#    its deprecated alias, before transformers 5) with ``use_reentrant=False``, which wraps
#    every ``GPT2Block`` call in ``torch.utils.checkpoint.checkpoint``. Without
#    ``transformers`` it is skipped with a printed reason. ``--scale`` and ``--batch`` do
#    not apply to it.
# 5. The LSTM and the TreeLSTM of the zoo have no segmentation checkpoint can use (one fused
#    op; a data-dependent tree) and are not in this comparison.
# 6. Where the time goes, from the same rounds: ``step_time`` of ``not-binding`` (the plain
#    step under a budget of twice eager's peak: tracked, nothing evicted); for the budgeted
#    run, ``recompute`` and ``select`` (ms per step, medians of the session's
#    ``recompute_s`` and ``select_s``), ``evictions`` and ``remats``; and ``bound`` =
#    ``wrapper-floor`` + ``recompute``: the step of a runtime that cost only what any
#    wrapper subclass costs and recomputed what tritondtr recomputed, with no work of its own
#    (no tracking, no choice). ``bound_vs_checkpoint`` above 1: no change to the eviction
#    path or to the per-op bookkeeping can meet the target on that model; less recomputation
#    or a dispatch path without Python wrappers would have to.
# 7. On CUDA, ``device_peak`` rows: ``torch.cuda.max_memory_allocated`` over one more step of
#    each run (everything the process held: parameters, gradients, optimizer state, the
#    allocator's rounding), beside ``peak``, which is tritondtr's tracked accounting.

examples:
  python benchmarks/bench_runtime_checkpoint.py               # ~2 min on 2 CPU cores
  python benchmarks/bench_runtime_checkpoint.py --device cuda --models gpt
  python benchmarks/bench_runtime_checkpoint.py --models hf-gpt2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # and the root, for tests.zoo

from bench_runtime_budget import in_rounds, inside, under  # noqa: E402
from floor import WrapperFloor  # noqa: E402
from harness import Env, Row, Stats, describe_device, write_csv, write_json  # noqa: E402

MODELS = ("mlp", "cnn", "gpt", "hf-gpt2")
# NOTE [ Checkpoint comparison ] rule 4.
HF_GPT2 = dict(layers=6, width=256, heads=4, vocab=512, positions=128, dropout=0.0)
HF_BATCH = 4


class _Segmented(nn.Module):
    """``seq`` run by ``checkpoint_sequential`` in ``segments`` segments."""

    def __init__(self, seq: nn.Sequential, segments: int) -> None:
        super().__init__()
        self.seq, self.segments = seq, segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)


def load(name: str, scale: int, device: str, batch: int, checkpointed: bool):
    """(model, step) of one model, plain or checkpointed."""
    if name == "gpt":
        from tritondtr.demo.tinygpt import GPTConfig, TinyGPT

        torch.manual_seed(0)
        config = GPTConfig(block=128, width=128, layers=8, heads=4)
        model = TinyGPT(config).to(device)
        model.checkpoint = checkpointed
        x = torch.randint(0, config.vocab, (batch, config.block), device=device)
        y = torch.randint(0, config.vocab, (batch, config.block), device=device)

        def loss():
            return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    elif name == "hf-gpt2":
        from recorded import hf_model

        model = hf_model("gpt2", **HF_GPT2).to(device)
        if checkpointed:
            _hf_checkpoint(model)
        ids = torch.randint(0, HF_GPT2["vocab"], (HF_BATCH, HF_GPT2["positions"]), device=device)

        def loss():
            return model(input_ids=ids, labels=ids, use_cache=False).loss
    else:
        from tests import zoo

        case = zoo.make(name, seed=0, scale=scale)
        model = case.model.to(device)
        inputs = tuple(t.to(device) for t in case.inputs)
        run = _Segmented(model, max(2, round(len(model) ** 0.5))) if checkpointed else model

        def loss():
            return case.loss(run, inputs)

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    return model, step


def _hf_checkpoint(model) -> None:
    """Every block of a Hugging Face model checkpointed as its users do it, non-reentrant
    (NOTE [ Checkpoint comparison ] rule 4)."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def _available(name: str) -> bool:
    """False, with the reason printed, for a model whose package is missing."""
    if name != "hf-gpt2":
        return True
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("  hf-gpt2 skipped: transformers is not installed (pip install tritondtr[hf])")
        return False
    return True


def _peak(step) -> int:
    run, stats = under(step, budget=None)
    run()
    return stats[-1].peak_bytes


def bench_model(name: str, args, env: Env) -> list[Row]:
    dev = describe_device(args.device)
    _, plain = load(name, args.scale, args.device, args.batch, checkpointed=False)
    _, ckpt = load(name, args.scale, args.device, args.batch, checkpointed=True)
    eager_peak, ckpt_peak = _peak(plain), _peak(ckpt)
    budget, tries = ckpt_peak, []
    for k in range(9):  # NOTE [ Checkpoint comparison ] rule 1
        run, stats = under(plain, budget=budget)
        run()
        tries.append((budget, stats[-1].peak_bytes))
        if stats[-1].peak_bytes <= ckpt_peak:
            break
        budget -= max(stats[-1].peak_bytes - ckpt_peak, (ckpt_peak >> 8) << k >> 1)
    dtr_run, dtr_stats = under(plain, budget=budget)
    runs = {
        "eager": plain,
        "checkpoint": ckpt,
        "tritondtr": dtr_run,
        "wrapper-floor": inside(WrapperFloor, plain),
        "not-binding": under(plain, budget=2 * eager_peak)[0],  # rule 6
    }
    timings = in_rounds(runs, args.device, args.repeats, args.max_time)  # timed in rounds
    peaks = {
        "eager": eager_peak,
        "checkpoint": ckpt_peak,
        "tritondtr": max(s.peak_bytes for s in dtr_stats),
        "wrapper-floor": eager_peak,
        "not-binding": eager_peak,
    }
    params = f"model={name};scale={args.scale};budget={budget}"
    note = "budget search (budget, peak): " + ", ".join(f"({b}, {p})" for b, p in tries)
    rows = []
    for provider, t in timings.items():
        rows.append(
            Row.of(
                "step_time",
                provider,
                eager_peak,
                t.stats(1e3),
                "ms",
                device=dev,
                env=env,
                timing=t,
                params=params,
            )
        )
        rows.append(
            Row.of(
                "peak",
                provider,
                eager_peak,
                Stats.of([peaks[provider]]),
                "bytes",
                device=dev,
                env=env,
                params=params,
                note=note if provider == "tritondtr" else "",
            )
        )
    if args.device.startswith("cuda"):  # rule 7: what the device held, one more step each
        for provider, fn in runs.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            held = Stats.of([torch.cuda.max_memory_allocated()])
            rows.append(
                Row.of(
                    "device_peak",
                    provider,
                    eager_peak,
                    held,
                    "bytes",
                    device=dev,
                    env=env,
                    params=params,
                )
            )
    ratio = timings["tritondtr"].stats().median / timings["checkpoint"].stats().median
    rows.append(
        Row.of(
            "vs_checkpoint",
            "tritondtr",
            eager_peak,
            Stats.of([ratio]),
            "x",
            device=dev,
            env=env,
            params=params,
        )
    )
    # rule 6: where the budgeted step's time goes, and the bound
    recompute = statistics.median(s.recompute_s for s in dtr_stats) * 1e3
    select = statistics.median(s.select_s for s in dtr_stats) * 1e3
    bound = timings["wrapper-floor"].stats(1e3).median + recompute
    ckpt_ms = timings["checkpoint"].stats(1e3).median
    st = dtr_stats[-1]
    for what, value, unit in (
        ("recompute", recompute, "ms"),
        ("select", select, "ms"),
        ("evictions", st.evictions, "count"),
        ("remats", st.rematerializations, "count"),
        ("bound", bound, "ms"),
        ("bound_vs_checkpoint", bound / ckpt_ms, "x"),
    ):
        rows.append(
            Row.of(
                what,
                "tritondtr",
                eager_peak,
                Stats.of([value]),
                unit,
                device=dev,
                env=env,
                params=params,
            )
        )
    print(
        f"  {name:7s} eager {timings['eager'].stats(1e3).median:8.2f} ms peak {eager_peak:>11,d}"
        f" | checkpoint {timings['checkpoint'].stats(1e3).median:8.2f} ms peak "
        f"{ckpt_peak:>11,d} | tritondtr {timings['tritondtr'].stats(1e3).median:8.2f} ms "
        f"peak {peaks['tritondtr']:>11,d} (budget {budget:,d}, {st.rematerializations} "
        f"remats) | tritondtr/checkpoint {ratio:.2f}x\n"
        f"          not-binding {timings['not-binding'].stats(1e3).median:8.2f} ms, recompute "
        f"{recompute:.2f} ms, select {select:.2f} ms | wrapper-floor + recompute "
        f"{bound:.2f} ms: {bound / ckpt_ms:.2f}x checkpoint",
        flush=True,
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument(
        "--scale",
        type=int,
        default=4,
        help="width scale of the zoo's mlp and "
        "cnn (default: 4); gpt is tritondtr.demo.tinygpt's TinyGPT, 8 layers, width 128, "
        "128 tokens; hf-gpt2: NOTE [ Checkpoint comparison ] rule 4",
    )
    p.add_argument("--batch", type=int, default=8, help="gpt batch (default: 8)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--repeats", type=int, default=7, help="samples per provider (default: 7)")
    p.add_argument("--max-time", type=float, default=10.0, help="seconds per provider")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--tag", default=None, help="file name tag (default: device)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    env = Env.capture()
    print(f"# tritondtr vs torch.utils.checkpoint, {describe_device(args.device)}")
    rows: list[Row] = []
    args.models = [m for m in args.models if _available(m)]
    if not args.models:
        return 0
    for name in args.models:
        rows += bench_model(name, args, env)
    device = torch.device(args.device).type
    tag = args.tag or (
        f"cpu-{os.cpu_count()}core-{torch.get_num_threads()}thread"
        if device == "cpu"
        else torch.cuda.get_device_name().lower().replace(" ", "-")
    )
    write_csv(rows, args.out / f"runtime_checkpoint_{tag}.csv")
    write_json(rows, args.out / f"runtime_checkpoint_{tag}.json")
    lines = [
        f"Hardware: {describe_device(args.device)}",
        "",
        "| model | eager ms | checkpoint ms | tritondtr ms | wrapper-floor ms | not-binding ms "
        "| recompute ms | eager peak | checkpoint peak | tritondtr peak "
        "| tritondtr / checkpoint (target <= 1) | (wrapper-floor + recompute) / checkpoint |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in args.models:
        get = {(r.what, r.provider): r for r in rows if r.params.startswith(f"model={name};")}
        ms = [
            get["step_time", k].median
            for k in ("eager", "checkpoint", "tritondtr", "wrapper-floor", "not-binding")
        ]
        ms.append(get["recompute", "tritondtr"].median)
        pk = [int(get["peak", k].median) for k in ("eager", "checkpoint", "tritondtr")]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{m:.1f}" for m in ms)
            + " | "
            + " | ".join(f"{b / 2**20:.2f} MiB" for b in pk)
            + f" | {get['vs_checkpoint', 'tritondtr'].median:.2f}x"
            + f" | {get['bound_vs_checkpoint', 'tritondtr'].median:.2f}x |"
        )
    (args.out / f"runtime_checkpoint_{tag}.md").write_text("\n".join(lines) + "\n")
    ms = {
        k: [
            next(
                r.median
                for r in rows
                if r.what == "step_time" and r.provider == k and r.params.startswith(f"model={m};")
            )
            for m in args.models
        ]
        for k in ("eager", "checkpoint", "tritondtr", "wrapper-floor")
    }
    _bars(
        list(args.models),
        {k: [v / e for v, e in zip(ms[k], ms["eager"])] for k in ms},
        "step time / eager",
        "tritondtr vs torch.utils.checkpoint at the same peak\n" + describe_device(args.device),
        args.out / f"runtime_checkpoint_{tag}.png",
    )
    print("\n".join(lines))
    return 0


def _bars(
    groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: Path
) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups)
    ax.set(ylabel=ylabel)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
