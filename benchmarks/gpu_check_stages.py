"""The stages of ``gpu_check.py`` (NOTE [ GPU check ] there), in order of value.

Each stage is ``fn(ctx)``: it records checks (``ctx.check``), figures (``ctx.figure``) and rows
(``ctx.row``), raises ``Skip`` when it cannot run here. ``ctx.tiny``: CPU, toy sizes.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_check import CheckFailed, Skip

import tritondtr
from tritondtr.engine.engine import Engine
from tritondtr.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ helpers
def _sync(ctx) -> None:
    if ctx.cuda:
        torch.cuda.synchronize()


def _timed(ctx, fn, repeats: int) -> list[float]:
    """Seconds of ``fn()`` per call, ``repeats`` samples after one untimed call."""
    fn()
    out = []
    for _ in range(repeats):
        _sync(ctx)
        t0 = time.perf_counter()
        fn()
        _sync(ctx)
        out.append(time.perf_counter() - t0)
    return out


@contextlib.contextmanager
def _deterministic(on: bool):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _need_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise Skip("transformers is not installed (pip install transformers)") from None


def _gpt2(ctx, *, layers, width, heads, vocab, positions, dropout, attn="eager"):
    from recorded import hf_model

    model = hf_model(
        "gpt2",
        layers=layers,
        width=width,
        heads=heads,
        vocab=vocab,
        positions=positions,
        dropout=dropout,
    )
    model.config._attn_implementation = attn
    return model.to(ctx.device)


def _gpt2_size(ctx) -> dict:
    """GPT-2 small on a GPU (12 x 768, 50257 tokens, 1024 positions); a toy on the CPU."""
    if ctx.tiny:
        return dict(layers=2, width=64, heads=4, vocab=512, positions=64)
    return dict(layers=12, width=768, heads=12, vocab=50257, positions=1024)


class Trainer:
    """``steps`` AdamW steps of a freshly built model from seed 0; the data from seed 1."""

    def __init__(self, ctx, build, batch: int, seq: int, vocab: int) -> None:
        self.ctx, self.build = ctx, build
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (batch, seq), generator=g).to(ctx.device)

    def run(self, steps: int, session=None, model=None):
        """Losses, final parameters and gradients of ``steps`` steps (under ``session()``,
        a factory of context managers, when given), and the sessions' stats."""
        model = model if model is not None else self.build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, stats = [], []
        for i in range(steps):
            torch.manual_seed(100 + i)
            opt.zero_grad(set_to_none=True)
            cm = session() if session is not None else contextlib.nullcontext()
            with cm as s:
                loss = model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
                loss.backward()
                opt.step()
            if s is not None:
                stats.append(s.stats)
            losses.append(loss.detach().clone())
        params = [p.detach().clone() for p in model.parameters()]
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        return losses, params, grads, stats


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# -------------------------------------------------------------------------------- env
def stage_env(ctx) -> None:
    """Versions, and the backend a CUDA table must use: the compiled Triton kernels."""
    from tritondtr.env import report

    for k, v in report().items():
        ctx.figure(k, v)
    eng = Engine("dtr_eq", device=ctx.device)
    want = "triton" if ctx.cuda else "torch"
    ctx.check("backend of a table on the device", eng.backend.value == want, eng.backend.value)
    for i in range(100):
        eng.new(float(100 + i), 1 << (i % 20), i)
    v = eng.select(200, 4)
    ref = Engine("dtr_eq", device="cpu", backend="torch")
    for i in range(100):
        ref.new(float(100 + i), 1 << (i % 20), i)
    ctx.check("victims of the device table equal the host twin's", v == ref.select(200, 4), str(v))


# -------------------------------------------------------------------------- gpu tests
def stage_gpu_tests(ctx) -> None:
    """The ``gpu`` tests with compiled kernels (``TRITON_INTERPRET=0``); collected only with
    ``--tiny`` (they need CUDA)."""
    import os

    env = dict(os.environ, TRITON_INTERPRET="0" if ctx.cuda else "1")
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"]
    cmd += ["--durations=15"]
    if not ctx.cuda:
        cmd.append("--collect-only")
    log = ctx.out / "gpu_tests.txt"
    with open(log, "w") as f:  # straight to the file: a stage cut at its cap keeps the log
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
    tail = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
    ctx.figure("pytest -m gpu", tail)
    ctx.check("pytest -m gpu", p.returncode == 0, tail)


# ---------------------------------------------------------------------------- bitwise
def stage_bitwise(ctx) -> None:
    """GPT-2 with dropout and AdamW, two steps, at 50 % and 30 % of the unlimited peak: every
    loss, parameter and gradient bit-equal to eager (NOTE [ GPU check ] rule 4)."""
    _need_transformers()
    size = _gpt2_size(ctx)
    batch, seq = (2, 32) if ctx.tiny else (2, 512)
    for attn in ("eager", "sdpa"):

        def build(attn=attn):
            return _gpt2(ctx, dropout=0.1, attn=attn, **size)

        tr = Trainer(ctx, build, batch, seq, size["vocab"])
        modes = (True, False) if ctx.cuda else (False,)
        for det in modes:
            tag = f"{attn}-{'deterministic' if det else 'default'}"
            try:
                _bitwise_case(ctx, tr, tag, det)
            except Exception as e:  # one combination's error does not hide the others
                ctx.check(f"{tag}: ran", False, f"{type(e).__name__}: {e}"[:300])


def _bitwise_case(ctx, tr, tag: str, det: bool) -> None:
    """One (attention, mode) combination of :func:`stage_bitwise`."""
    with _deterministic(det):
        ref = tr.run(2)
        again = tr.run(2)
        repeat = _equal(ref[0] + ref[1] + ref[2], again[0] + again[1] + again[2])
        ctx.figure(f"{tag}: eager repeats itself", repeat)
        free = tr.run(1, lambda: tritondtr.enable(budget=None))
        peak = free[3][0].peak_bytes
        ctx.figure(f"{tag}: tracked peak MiB", round(peak / 2**20, 1))
        for ratio in (0.5, 0.3):
            got = tr.run(2, lambda b=int(peak * ratio): tritondtr.enable(budget=b))
            st = got[3][-1]
            same = _equal(got[0] + got[1] + got[2], ref[0] + ref[1] + ref[2])
            name = f"{tag} at {int(ratio * 100)} %"
            ctx.row("evictions", name, st.evictions, "count")
            ctx.row("rematerializations", name, st.rematerializations, "count")
            ctx.row("bitwise", name, int(same), "bool")
            if repeat:  # else eager is no reference (NOTE [ GPU check ] rule 4)
                ctx.check(f"{name}: bit-equal to eager", same)
                ctx.check(f"{name}: evicted", st.evictions > 0, str(st.evictions))
            else:
                ctx.figure(f"{name}: equal to one eager run", same)


# ----------------------------------------------------------------------------- probes
def stage_probes(ctx) -> None:
    """Points 3, 4, 5 and 7 of the GPU path on the session's device."""
    dev = ctx.device
    # 3. The session is the first CUDA output's, whatever CPU ops came first.
    if ctx.cuda:
        lin = torch.nn.Linear(64, 64).to(dev)
        x = torch.randn(8, 64, device=dev)
        import warnings

        with warnings.catch_warnings(record=True), tritondtr.enable(budget=None) as s:
            mask = torch.ones(4, requires_grad=True) * 2  # a CPU op with grad first
            lin(x).relu().sum().backward()
        ctx.check(
            "session device: the first CUDA output's",
            s.core.device is not None and s.core.device.type == "cuda" and s.stats.peak_bytes > 0,
            f"{s.core.device}",
        )
        del mask
    # 4. A custom op drawing randomness inside, replayed exactly under stress.
    from tests.gpu_probes import probe_custom_rng, probe_nondeterministic, probe_oom

    r = probe_custom_rng(dev)
    ctx.check("custom-op randomness replayed exactly", r["equal"], str(r))
    # 5. Outputs of nondeterministic ops pinned on CUDA.
    r = probe_nondeterministic(dev)
    ctx.check("nondeterministic ops: gradients equal eager", r["grads_equal"], str(r))
    ctx.check("nondeterministic outputs pinned on CUDA only", r["pinned"] == ctx.cuda, str(r))
    # 7. A real out-of-memory error answered by evicting (CUDA only: a memory fraction).
    if ctx.cuda:
        r = probe_oom(dev)
        ctx.check("out-of-memory fallback", r["ok"], str(r))


# ----------------------------------------------------------------------------- link
def stage_link(ctx) -> None:
    """The host link an offload would use: copy bandwidth host -> device and back, from
    pinned and from pageable host memory, at 1 / 16 / 256 MiB (median of 5), and how much of a
    256 MiB device -> host copy on a side stream hides under matmuls on the compute stream.
    With ``--tiny``: host-to-host copies, no overlap."""
    sizes = [1, 4] if ctx.tiny else [1, 16, 256]
    mib = 2**20
    for size in sizes:
        n = size * mib
        dev = torch.empty(n, dtype=torch.uint8, device=ctx.device)
        kinds = {"pinned": torch.empty(n, dtype=torch.uint8, pin_memory=ctx.cuda)}
        kinds["pageable"] = torch.empty(n, dtype=torch.uint8)
        for kind, host in kinds.items():
            for way, (dst, src) in (("to device", (dev, host)), ("to host", (host, dev))):
                t = statistics.median(_timed(ctx, lambda d=dst, s=src: d.copy_(s), 5))
                gbs = n / t / 1e9
                ctx.row("bandwidth", f"{way} {kind} {size} MiB", round(gbs, 2), "GB/s")
                if size == sizes[-1]:
                    ctx.figure(f"{way} {kind} {size} MiB", f"{gbs:.1f} GB/s")
    if not ctx.cuda:
        return
    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    host = torch.empty(256 * mib, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(256 * mib, dtype=torch.uint8, device=ctx.device)
    side = torch.cuda.Stream()

    def compute():
        for _ in range(8):
            a @ a

    def copy():
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    def both():
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)
        compute()
        torch.cuda.current_stream().wait_stream(side)

    t_c, t_x, t_b = (statistics.median(_timed(ctx, f, 5)) for f in (compute, copy, both))
    hidden = (t_c + t_x - t_b) / min(t_c, t_x)
    _link_host_costs(ctx, dev, host, side)
    for what, t in (("matmuls alone", t_c), ("copy alone", t_x), ("both", t_b)):
        ctx.row("overlap", what, round(t * 1e3, 3), "ms")
    ctx.row("overlap", "hidden fraction of the shorter", round(hidden, 3), "ratio")
    ctx.figure(
        "overlap",
        f"matmuls {t_c * 1e3:.2f} ms, copy {t_x * 1e3:.2f} ms, both "
        f"{t_b * 1e3:.2f} ms: {hidden:.0%} of the shorter hidden",
    )


def _link_host_costs(ctx, dev, host, side) -> None:
    """What an offload pays on the host per copy: issuing a 1 MiB device -> host copy on a
    side stream with its event, polling that event, and a pinned allocation of 3 / 96 MiB
    fresh (``cudaHostAlloc``: sizes the stage has not used) and again, from PyTorch's caching
    host allocator."""
    mib = 2**20
    src, dst = dev[:mib], host[:mib]
    reps = 200

    def issue():
        with torch.cuda.stream(side):
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        return ev

    issue().synchronize()
    t0 = time.perf_counter()
    events = [issue() for _ in range(reps)]
    t_issue = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for ev in events:
        ev.query()
    t_query = (time.perf_counter() - t0) / reps
    ctx.row(
        "host_cost", "issue a 1 MiB copy on a side stream + event", round(t_issue * 1e6, 2), "us"
    )
    ctx.row("host_cost", "query a completed event", round(t_query * 1e6, 2), "us")
    for size in (3, 96):
        n = size * mib
        t0 = time.perf_counter()
        first = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        t_fresh = time.perf_counter() - t0
        del first
        t0 = time.perf_counter()
        again = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        t_cached = time.perf_counter() - t0
        del again
        ctx.row("host_cost", f"pinned {size} MiB, fresh", round(t_fresh * 1e6, 1), "us")
        ctx.row("host_cost", f"pinned {size} MiB, cached", round(t_cached * 1e6, 1), "us")
        ctx.figure(
            f"pinned {size} MiB fresh / cached", f"{t_fresh * 1e6:.0f} / {t_cached * 1e6:.0f} us"
        )
    ctx.figure("issue a side-stream copy + event", f"{t_issue * 1e6:.1f} us")


# -------------------------------------------------------------------------------- zoo
def stage_zoo(ctx) -> None:
    """The zoo's steps on the device at 50 %, and at 30 % with offload (NOTE [ Offload ]),
    bit-equal to eager (deterministic algorithms)."""
    from tests import zoo

    names = ["mlp", "cnn", "gpt", "lstm", "treelstm"]
    scale = 1 if ctx.tiny else 8

    def case(name):
        c = zoo.make(name, seed=0, scale=scale)
        c.model.to(ctx.device)
        c.inputs = tuple(x.to(ctx.device) if torch.is_tensor(x) else x for x in c.inputs)
        return c

    with _deterministic(ctx.cuda):
        for name in names:
            c = case(name)
            opt = torch.optim.Adam(c.model.parameters(), lr=1e-3)
            ref_loss = zoo.train_step(c, opt)
            ref = [p.detach().clone() for p in c.model.parameters()]
            c = case(name)
            with tritondtr.enable(budget=None) as s:
                c.loss(c.model, c.inputs).backward()
            peak = s.stats.peak_bytes
            c = case(name)
            opt = torch.optim.Adam(c.model.parameters(), lr=1e-3)
            with tritondtr.enable(budget=peak // 2) as s:
                loss = zoo.train_step(c, opt)
            got = [p.detach().clone() for p in c.model.parameters()]
            same = torch.equal(loss, ref_loss) and _equal(got, ref)
            ctx.row("evictions", f"{name} at 50 %", s.stats.evictions, "count")
            ctx.check(f"{name}: bit-equal to eager at 50 %", same)
            # NOTE [ Offload ] in core/core.py: to pinned host memory and back, measured link
            c = case(name)
            opt = torch.optim.Adam(c.model.parameters(), lr=1e-3)
            with tritondtr.enable(budget=peak * 3 // 10, offload=True) as s:
                loss = zoo.train_step(c, opt)
            got = [p.detach().clone() for p in c.model.parameters()]
            same = torch.equal(loss, ref_loss) and _equal(got, ref)
            st = s.stats
            ctx.row("offloads", f"{name} at 30 %, offload=True", st.offloads, "count")
            ctx.row("fetches", f"{name} at 30 %, offload=True", st.fetches, "count")
            ctx.check(f"{name}: bit-equal to eager at 30 % with offload", same)


# ------------------------------------------------------------------------------ gpt2
def stage_gpt2(ctx) -> None:
    """GPT-2 small in fp32 at the largest batch x 1024 tokens that fits: eager, per-block
    checkpoint, not binding, 70 / 50 / 30 %, 50 / 30 % over several steps in one session
    with and without offload, measured costs at 50 %, and a budget matched to checkpoint's
    device peak: step time, device peak, evictions, rematerializations, offloads and
    prefetches, decisions, device syncs."""
    _need_transformers()
    size = _gpt2_size(ctx)
    seq = size["positions"]
    batches = (2, 1) if ctx.tiny else (24, 16, 12, 8, 4, 2)
    repeats = 2 if ctx.tiny else 3

    def build():
        return _gpt2(ctx, dropout=0.0, **size)

    model, tr, batch = None, None, None
    for b in batches:  # the largest batch whose eager step fits
        try:
            model = build()
            tr = Trainer(ctx, lambda m=model: m, b, seq, size["vocab"])
            tr.run(1, model=model)
            batch = b
            break
        except torch.OutOfMemoryError:
            model = tr = None
            if ctx.cuda:
                torch.cuda.empty_cache()
    if batch is None:
        raise CheckFailed("no batch fits")
    ctx.figure("batch x tokens", f"{batch} x {seq}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=tr.ids, labels=tr.ids, use_cache=False).loss.backward()
        opt.step()

    def measure(name, session=None):
        stats = []

        def fn():
            cm = session() if session is not None else contextlib.nullcontext()
            with cm as s:
                step()
            if s is not None:
                stats.append(s.stats)

        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            times = _timed(ctx, fn, repeats)
        except torch.OutOfMemoryError as e:  # a row, not the end of the stage
            ctx.row("step_time", name, "oom", "ms", str(e)[:120])
            ctx.figure(name, "out of memory")
            if ctx.cuda:
                torch.cuda.empty_cache()
            return None, None, None
        ms = statistics.median(times) * 1e3
        dpeak = torch.cuda.max_memory_allocated() if ctx.cuda else None
        ctx.row("step_time", name, round(ms, 2), "ms")
        if dpeak is not None:
            ctx.row("device_peak", name, dpeak, "bytes")
        st = stats[-1] if stats else None
        if st is not None:
            for what in ("peak_bytes", "evictions", "rematerializations", "device_syncs"):
                ctx.row(what, name, getattr(st, what), "bytes" if "bytes" in what else "count")
            ctx.row("recompute_s", name, round(st.recompute_s, 4), "s")
            ctx.row("select_s", name, round(st.select_s, 4), "s")
        ctx.figure(
            f"{name}",
            f"{ms:.1f} ms"
            + (f", device peak {format_bytes(dpeak)}" if dpeak is not None else "")
            + (
                f", tracked {format_bytes(st.peak_bytes)}, {st.evictions} evictions, "
                f"{st.rematerializations} remats, {st.device_syncs} syncs"
                if st is not None
                else ""
            ),
        )
        return ms, dpeak, st

    eager_ms, _, _ = measure("eager")
    _, nb_dpeak, nb = measure("not-binding", lambda: tritondtr.enable(budget=None))
    if nb is None:
        raise CheckFailed("the not-binding session ran out of memory at the batch eager fits")
    peak = nb.peak_bytes
    for r in (0.7, 0.5, 0.3):
        measure(f"{int(r * 100)} %", lambda r=r: tritondtr.enable(budget=int(peak * r)))
    # Offload (NOTE [ Asynchronous offload ], NOTE [ Host copies on CUDA ]): one session
    # for several steps, so that the steps after the first prefetch in the previous one's
    # order; recompute only the same way, for a like-for-like row.
    for r in (0.5, 0.3):
        for offload in (False, True):
            name = f"{int(r * 100)} %, steps in one session" + (", offload" if offload else "")
            _steps_in_one_session(ctx, name, step, repeats, budget=int(peak * r), offload=offload)
    # The default cost on CUDA is the analytic H100 model; "measured" times the launch.
    measure("measured 50 %", lambda: tritondtr.enable(budget=peak // 2, cost="measured"))
    measure("device table 50 %", lambda: tritondtr.enable(budget=peak // 2, table="device"))
    from bench_runtime_checkpoint import _hf_checkpoint

    _hf_checkpoint(model)
    ck_ms, ck_dpeak, _ = measure("checkpoint")
    meta = dict(model="gpt2-small", batch=batch, tokens=seq, device=ctx.device)
    # Both traces with each op's device time (NOTE [ Recording a trace ] rule 6; CUDA only)
    cost = "events" if ctx.cuda else "measured"
    ck_path = ctx.out / "gpt2_step_checkpoint.npz"  # the same step, every block checkpointed
    with tritondtr.trace(ck_path, budget=None, cost=cost, meta=meta):
        step()
    off = getattr(model, "activation_checkpointing_disable", None)
    (off or model.gradient_checkpointing_disable)()
    if ck_dpeak is not None and nb_dpeak is not None and ck_ms is not None:
        # What the device holds beside the tracked storages, and the outputs of the op in
        # flight above the budget (NOTE [ Budget accounting ] rule 2: GPT-2's logits, 4.6 GiB
        # at 24 x 1024 tokens; the first H200 run left them out and peaked 1.28x checkpoint).
        outside = nb_dpeak - peak
        budget = max(ck_dpeak - outside - nb.max_op_out_bytes, 1)
        ms, dpeak, _ = measure("matched", lambda: tritondtr.enable(budget=budget))
        if ms is not None:
            ctx.figure("matched vs checkpoint: time", round(ms / ck_ms, 3))
            ctx.figure("matched vs checkpoint: device peak", round(dpeak / ck_dpeak, 3))
    if ck_ms is not None:
        ctx.figure("checkpoint vs eager: time", round(ck_ms / eager_ms, 3))
    # The step as a trace with each op's device time (``events``: NOTE [ Recording a trace ]
    # rule 6), for the twin and the policy sweeps offline (python
    # benchmarks/bench_sim_checkpoint.py --traces gpt2_step.npz gpt2_step_checkpoint.npz).
    path = ctx.out / "gpt2_step.npz"
    with tritondtr.trace(path, budget=None, cost=cost, meta=meta) as rec:
        step()
    ctx.figure(
        "trace", f"{rec.trace.num_tensors} tensors, {path.stat().st_size:,} bytes: {path.name}"
    )


def _steps_in_one_session(ctx, name: str, step, repeats: int, **enable) -> None:
    """Rows for ``repeats`` timed steps after one untimed step, all in one session: the
    median step time, the device peak, and the session's counters (offload's among them).
    With offload the first two steps, taped, the second's end choosing the copy price scale
    by rehearsal (NOTE [ Copy price scale ], NOTE [ Rehearsal ]), are timed apart (a row of
    their own), so the timed steps run at the scale chosen."""
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        with tritondtr.enable(**enable) as s:
            taped = _timed(ctx, step, 1) if enable.get("offload") else None
            times = _timed(ctx, step, repeats)
    except torch.OutOfMemoryError as e:
        ctx.row("step_time", name, "oom", "ms", str(e)[:120])
        if ctx.cuda:
            torch.cuda.empty_cache()
        return
    ms = statistics.median(times) * 1e3
    st = s.stats
    ctx.row("step_time", name, round(ms, 2), "ms")
    if taped is not None:
        note = "the second step: taped, and at its end every candidate scale rehearsed"
        ctx.row("rehearsed_step_time", name, round(taped[0] * 1e3, 2), "ms", note)
    if ctx.cuda:
        ctx.row("device_peak", name, torch.cuda.max_memory_allocated(), "bytes")
    for what in ("evictions", "rematerializations", "offloads", "fetches", "prefetches"):
        ctx.row(what, name, getattr(st, what), "count")
    ctx.row("link_wait_ns", name, round(st.link_wait_ns), "ns")
    ctx.row("copy_scale", name, st.copy_scale, "x")
    ctx.figure(
        name,
        f"{ms:.1f} ms, {st.evictions} evictions, {st.rematerializations} remats, "
        f"{st.offloads} offloads, {st.prefetches} prefetches, {st.fetches} fetches, "
        f"copy price x{st.copy_scale:g}",
    )


# --------------------------------------------------------------------------- scoring
def stage_scoring(ctx) -> None:
    """Scoring throughput against ``torch-cuda`` at 1e3 .. 1e7 and 2^24, victims checked by
    the scoring benchmark itself (its exit status 2 on a mismatch)."""
    import bench_scoring

    sizes = ["1e3", "1e4"] if ctx.tiny else ["1e3", "1e4", "1e5", "1e6", "1e7", str(2**24)]
    providers = ["torch", "numpy"] if ctx.tiny else ["triton", "triton-unprepared", "torch-cuda"]
    tmp = ctx.out / "_scoring"
    rc = bench_scoring.main(
        ["--sizes", *sizes, "--providers", *providers, "--out", str(tmp), "--tag", "check"]
    )
    ctx.check("scoring: every provider's victims equal the twin's", rc == 0, f"exit {rc}")
    import csv

    for path in sorted(tmp.glob("*.csv")):
        with open(path) as f:
            for r in csv.DictReader(f):
                ctx.row(r["what"], f"{r['provider']} N={r['size']}", r["median"], r["unit"])
    for path in tmp.glob("*"):
        path.unlink()
    tmp.rmdir()


# -------------------------------------------------------------------- selection twin
def stage_selection_twin(ctx) -> None:
    """The compiled selection against the torch twin at 1e5 .. 1e7 slots, k = 1 and 8."""
    from scoring_baselines import synthetic_columns

    from tritondtr import policy
    from tritondtr.policy.scoring import random_base

    sizes = [1000, 4097] if ctx.tiny else [100_000, 1_000_000, 10_000_000]
    backend = "triton" if ctx.cuda else "torch"
    for n in sizes:
        cols, now = synthetic_columns(n, seed=n)
        dev = {k: v.to(ctx.device) for k, v in cols.items()}
        for h in ("dtr_eq", "dtr", "msps", "lru", "size"):
            for k in (1, 8):
                got = policy.select(h, dev, now, k=k, backend=backend).tolist()
                ref = policy.select(h, cols, now, k=k, backend="torch").tolist()
                ctx.check(f"N={n} {h} k={k}", got == ref, f"{got} != {ref}")
                sel = policy.selection(h, dev, k=k, backend=backend)
                if sel is not None:  # prepared: the second call launches directly
                    rb = random_base(0, now)
                    got = [sel.victims(now, rb), sel.victims(now, rb)]
                    ctx.check(f"N={n} {h} k={k} prepared", got == [ref, ref], f"{got} != {ref}")


# ------------------------------------------------------------------ decision latency
def stage_latency(ctx) -> None:
    """One decision (a full scoring and selection) on a host table, on a device table (its
    private stream) and on the compute stream (the old way), with the GPU idle and behind a
    queued backlog of the model's kernels."""
    from scoring_baselines import synthetic_columns

    from tritondtr import policy
    from tritondtr.engine.table import MetadataTable

    sizes = [1000] if ctx.tiny else [1000, 10_000, 100_000, 1_000_000]
    backend = "triton" if ctx.cuda else "torch"
    a = torch.randn(4096, 4096, device=ctx.device) if ctx.cuda else None

    def backlog():  # ~tens of ms of queued matmuls on the compute stream
        if a is not None:
            for _ in range(20):
                a @ a

    for n in sizes:
        cols, now = synthetic_columns(n, seed=1)
        host = MetadataTable(n, device="cpu")
        host.add_many(**{k: v.numpy() for k, v in cols.items()})
        tables = {"host": (host, "torch")}
        if ctx.cuda:
            devt = MetadataTable(n, device=ctx.device)
            devt.add_many(**{k: v.numpy() for k, v in cols.items()})
            tables["device-private-stream"] = (devt, backend)
        for name, (table, b) in tables.items():
            table.select("dtr_eq", now, 1, backend=b)
            for busy in (False, True) if ctx.cuda else (False,):
                lat = []
                for _ in range(5 if ctx.tiny else 20):
                    _sync(ctx)
                    if busy:
                        backlog()
                    t0 = time.perf_counter()
                    table.select("dtr_eq", now, 1, backend=b)
                    lat.append(time.perf_counter() - t0)
                us = statistics.median(lat) * 1e6
                cfg = f"{name} N={n} {'behind backlog' if busy else 'idle'}"
                ctx.row("decision_latency", cfg, round(us, 1), "us")
                ctx.figure(cfg, f"{us:.0f} us")
        if ctx.cuda:  # the old way: the selection on the compute stream, read with .cpu()
            dcols = devt.columns()
            for busy in (False, True):
                lat = []
                for _ in range(20):
                    _sync(ctx)
                    if busy:
                        backlog()
                    t0 = time.perf_counter()
                    policy.select("dtr_eq", dcols, now, k=1, backend=backend)
                    lat.append(time.perf_counter() - t0)
                us = statistics.median(lat) * 1e6
                cfg = f"compute-stream N={n} {'behind backlog' if busy else 'idle'}"
                ctx.row("decision_latency", cfg, round(us, 1), "us")
                ctx.figure(cfg, f"{us:.0f} us")
    _sync(ctx)


# ---------------------------------------------------------------------- decision cost
def stage_decision_cost(ctx) -> None:
    """Where one decision's host time goes (NOTE [ One-launch selection ] rule 7 in
    kernels/topk_select.py): each step of a k = 1 selection timed alone, then the whole
    decision unprepared (``policy.select``), prepared (``Selection.victims``) and on a device
    table. Host steps are per call over a loop, the device's own time by CUDA events."""
    import os

    from tritondtr import policy

    if not policy.triton_available():
        raise Skip("no triton")
    if not ctx.cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise Skip("the kernels need CUDA or TRITON_INTERPRET=1")
    for n in [1000] if ctx.tiny else [1000, 1_000_000]:
        _decision_cost_at(ctx, n)
        _sync(ctx)


def _decision_cost_at(ctx, n: int) -> None:
    from scoring_baselines import synthetic_columns
    from tritondtr.kernels import topk_select
    from tritondtr.kernels.heuristic_scores import check_columns

    from tritondtr import kernels, policy
    from tritondtr.engine.table import MetadataTable
    from tritondtr.policy.scoring import random_base

    reps = 20 if ctx.tiny else 300
    dev = torch.device(ctx.device)

    def per_call(fn) -> float:
        """Median host microseconds per call of ``fn`` over 5 loops (synchronised after)."""
        fn()
        _sync(ctx)
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter() - t0) / reps)
            _sync(ctx)
        return statistics.median(samples) * 1e6

    cols, now = synthetic_columns(n, seed=1)
    dcols = {k: v.to(dev) for k, v in cols.items()}
    five = tuple(dcols[c] for c in MetadataTable.COLUMNS)
    rb = random_base(0, now)
    sel = kernels.Selection("dtr_eq", five, k=1)
    want = policy.select("dtr_eq", cols, now, k=1, backend="torch").tolist()
    ctx.check(f"N={n}: the prepared selection's victim", sel.victims(now, rb) == want)
    meta = dict(sel._meta, num_warps=4, enable_fp_fusion=False)
    counter = topk_select._counter(dev, topk_select._current_stream(dev))
    args = (*sel._args, counter, sel.out, sel.n, sel.k, now, rb)
    jit = topk_select._select_kernel[sel._grid[:1]]
    steps = {
        "check_columns": lambda: check_columns("dtr_eq", five, now, rb),
        "3 x torch.empty": lambda: [torch.empty(8, device=dev) for _ in range(3)],
        "launch: triton jit": lambda: jit(*args, **meta),
        "launch: prepared": lambda: sel(now, rb),
        "read: .cpu()": lambda: sel.out.cpu(),
        "read: .cpu() and mask": lambda: (lambda x: x[x >= 0])(sel.out.cpu()),
        "decision: policy.select": lambda: policy.select(
            "dtr_eq", dcols, now, k=1, backend="triton" if ctx.cuda else "torch"
        ).tolist(),
        "decision: prepared victims": lambda: sel.victims(now, rb),
    }
    if ctx.cuda:
        out_host = torch.empty(1, dtype=torch.int64, pin_memory=True)

        def pinned():
            out_host.copy_(sel.out, non_blocking=True)
            torch.cuda.current_stream(dev).synchronize()

        def guard():
            with torch.cuda.device(dev):
                pass

        table = MetadataTable(n, device=ctx.device)
        table.add_many(**{k: v.numpy() for k, v in cols.items()})
        steps.update(
            {
                "device guard": guard,
                "current_stream()": lambda: torch.cuda.current_stream(dev),
                "raw current stream": lambda: torch._C._cuda_getCurrentRawStream(dev.index),
                "read: pinned + stream sync": pinned,
                "decision: device table": lambda: table.select("dtr_eq", now, 1),
            }
        )
    for name, fn in steps.items():
        us = per_call(fn)
        ctx.row("decision_cost", f"{name} N={n}", round(us, 2), "us")
        if name.startswith("decision"):
            ctx.figure(f"{name} N={n}", f"{us:.1f} us")
    if ctx.cuda:  # the kernel's own time: launches queued behind a sleep run back to back
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000_000)  # ~50 ms at 2 GHz: longer than queueing the launches
        start.record()
        for _ in range(reps):
            sel(now, rb)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / reps
        ctx.row("decision_cost", f"kernel on the device N={n}", round(us, 2), "us")
        ctx.figure(f"kernel on the device N={n}", f"{us:.1f} us")


# ------------------------------------------------------------------------- dispatch
def stage_dispatch(ctx) -> None:
    """Dispatch cost per op: a chain of 200 small ``add``s, eager and in a session."""
    k, numel = 200, 64
    x0 = torch.randn(numel, device=ctx.device, requires_grad=True)

    def chain():
        x = x0
        for _ in range(k):
            x = x + 1.0
        return x

    def tracked():
        with tritondtr.enable(budget=None):
            chain()

    eager = statistics.median(_timed(ctx, chain, 5 if ctx.tiny else 15))
    dtr = statistics.median(_timed(ctx, tracked, 5 if ctx.tiny else 15))
    us = (dtr - eager) / k * 1e6
    ctx.row("dispatch_per_op", "add, 64 elements, not binding", round(us, 2), "us")
    ctx.row("eager_per_op", "add, 64 elements", round(eager / k * 1e6, 2), "us")
    ctx.figure("dispatch us per op (added)", round(us, 2))
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    tracked()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    ctx.log(f"profile of {k} tracked adds, by own time:\n{text.getvalue()}")


# ------------------------------------------------------------------------------- sim
def stage_sim(ctx) -> None:
    """The simulator's GPU target: a 1M-tensor trace replayed with full-scan selection on the
    device, under a minute. ``chain(5e5)`` (forward and backward: 1M tensors) at ratio 0.9:
    ~5e4 decisions. Not ``random_dag`` at 0.9, which NOTE [ Scaling benchmark ] rule 4 names: it
    thrashes at every ratio tried (0.5 to 0.99, 2e3 to 5e4 tensors) and stops early.
    ``--tiny``: 2,000 tensors on the CPU."""
    from tritondtr.sim import generators as gen
    from tritondtr.sim.simulate import simulate

    n = 2_000 if ctx.tiny else 500_000
    t0 = time.perf_counter()
    trace = gen.chain(n)
    ctx.row("generate_s", f"chain({n:.0e})", round(time.perf_counter() - t0, 2), "s")
    r = simulate(trace, "dtr_eq", ratio=0.9, backend="auto", device=ctx.device)
    what = f"{trace.num_tensors} tensors, ratio 0.9"
    ctx.row("replay_s", what, round(r.wall_s, 2), "s")
    ctx.row("selections", what, r.selections, "count")
    ctx.figure(
        f"{trace.num_tensors:,} tensors at 0.9",
        f"{r.wall_s:.1f} s, {r.status}, {r.selections} selections",
    )
    ctx.check("the replay finished", r.status == "ok", r.status)
    if not ctx.tiny:
        ctx.figure("target: under a minute", "met" if r.wall_s < 60 else "missed")


STAGES = [
    ("env", 60, stage_env),
    ("decision-cost", 40, stage_decision_cost),
    ("gpu-tests", 180, stage_gpu_tests),
    ("bitwise", 90, stage_bitwise),
    ("probes", 40, stage_probes),
    ("zoo", 60, stage_zoo),
    ("gpt2", 200, stage_gpt2),
    ("scoring", 60, stage_scoring),
    ("selection-twin", 30, stage_selection_twin),
    ("latency", 30, stage_latency),
    ("dispatch", 20, stage_dispatch),
    ("link", 30, stage_link),
    ("sim", 120, stage_sim),
]
"""(name, cap in seconds, function), highest value first (NOTE [ GPU check ] rule 1)."""
