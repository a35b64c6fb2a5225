"""The session's device: which outputs it tracks, what memory it may use, what it measured.

# NOTE [ Session device ]
# 1. ``enable(device=...)`` names the device whose outputs the session tracks (``"cuda"``
#    means the current CUDA device at entry). Outputs on any other device stay plain tensors:
#    not tracked, not counted, never evicted.
# 2. Without ``device=``, the first tracked output's device becomes the session's, except that
#    while CUDA is available a CPU output never does: on a GPU machine the session waits for
#    the first CUDA output, whatever CPU ops came first (a mask, data preparation at the top of
#    a step). Before this rule such an op made the session a CPU session, every CUDA
#    activation stayed plain and the budget silently did nothing.
# 3. An output left plain because it is on another device than the session's warns once per
#    session, naming the op and both devices, unless ``device=`` was given (the user chose).
#    The warning says how to track CPU tensors on a GPU machine (``device="cpu"``).
# 4. The choice is made once, at the first output that fixes it, and never changes: the
#    core's storages and its accounting are of one device.

# NOTE [ Memory share budgets ]
# 1. ``budget="auto"`` is 90 % of the device memory free at entry; ``budget="P%"`` (0 < P <=
#    100) is P % of it. Free memory is, on CUDA, the driver's free bytes of the session's
#    device (``torch.cuda.mem_get_info``: other processes count as used) plus what this
#    process's caching allocator holds unused (reserved - allocated): it is free to this
#    process, and without it a session per step would see the last step's cached blocks as
#    taken and shrink its budget step after step. On a CPU, ``MemAvailable`` of /proc/meminfo.
# 2. The 10 % headroom of ``auto`` is for what the budget does not count and the step still
#    allocates: parameter gradients, optimizer state made at the first step, the outputs of
#    the op in flight (NOTE [ Budget accounting ] in core/core.py), the allocator's rounding
#    and fragmentation. Where that is more than 10 %, a device out-of-memory error inside an
#    op is answered by evicting (the session's out-of-memory fallback), and a smaller share
#    (``"70%"``) or a byte budget gives a run that never relies on it.
# 3. The share is resolved once, at entry, when the device is known: a session whose device
#    is not given and not yet fixed resolves it on the current CUDA device when CUDA is
#    available (the device rule 2 will most likely pick; a program whose tensors live on
#    another GPU than the current one names it, ``device="cuda:1"``), else on the CPU.
#    ``stats.budget`` is the bytes it resolved to; NOTE [ Device peak ] reads the same device.

# NOTE [ Device peak ]
# On CUDA, a session resets the allocator's peak statistics of its device at entry and reads
# ``torch.cuda.max_memory_allocated`` at exit (and whenever ``stats.device_peak_bytes`` is
# read while it is active): every byte the process allocated on that device during the
# session, parameters, gradients, optimizer state and the allocator's rounding included,
# beside ``peak_bytes``, the tracked storages alone. Resetting the peak is a process-wide
# side effect of the allocator's statistics (as every ``reset_peak_memory_stats`` caller
# has); it is documented in docs/runtime.md. On a CPU there is no such counter: None.

# NOTE [ Side streams ]
# 1. The caching allocator hands a freed block out again to the stream it was allocated on,
#    without waiting for other streams that read it. A tracked buffer the session frees (an
#    eviction, a release) may have been read by an op on another stream: a side stream of
#    the program (``with torch.cuda.stream(s)``), FSDP2's or DDP's communication streams.
# 2. So once any op of a CUDA session runs with a current stream other than the device's
#    default stream, every later op records its tracked inputs' buffers as used by its
#    current stream (``Tensor.record_stream``): their blocks are reused only after that
#    stream's work, whichever stream frees them. Recording on the block's own stream is a
#    no-op of the allocator.
# 3. Until then nothing is recorded: a program on the default stream pays nothing but one
#    stream query per op on CUDA.
# 4. A recomputation on a side stream records its recipe's inputs the same way, and the
#    default stream then waits for it (on the device): the program synchronized its streams
#    before the recomputation existed, so a later reader on the default stream must not see
#    the buffer before the replay wrote it.

# NOTE [ Precision flags ]
# 1. On CUDA the bits of a matmul or a convolution depend on process-wide flags: TF32 for
#    matmuls (``torch.backends.cuda.matmul.allow_tf32``, ``set_float32_matmul_precision``)
#    and convolutions (``torch.backends.cudnn.allow_tf32``), and the reduced-precision
#    reductions of fp16 / bf16 matmuls. A replay under other flags than its first execution
#    gives other bits.
# 2. A CUDA session reads them when it starts and, before every recomputation, checks that
#    they are unchanged; if not, the recomputation is refused with an error that names the
#    flags (a silent wrong gradient is the one result the runtime must never give). Set them
#    before ``enable``. Reading them per op to replay each op under its own flags would cost
#    every op of every CUDA session; a change inside a session is rare.
# 3. Not covered: flags changed and changed back between an op and its replay (the op ran
#    under the other flags, the check sees the first ones again).
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass

import torch

__all__ = ["MemoryShare", "free_bytes", "parse_device", "parse_share"]

AUTO_SHARE = 0.9  # NOTE [ Memory share budgets ] rule 2
_SHARE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*")


@dataclass(frozen=True)
class MemoryShare:
    """A budget given as a share of the free memory at entry (NOTE [ Memory share budgets ]).

    Attributes:
        fraction: in (0, 1].
        text: what the user wrote (``"auto"``, ``"80%"``), for messages.
    """

    fraction: float
    text: str

    def resolve(self, device: torch.device) -> int:
        """The budget in bytes on ``device`` now."""
        return int(free_bytes(device) * self.fraction)


def parse_share(value: str) -> MemoryShare | None:
    """``"auto"`` or ``"P%"`` as a :class:`MemoryShare`; None if ``value`` is neither (a byte
    count, for :func:`tritondtr.units.parse_bytes`). Raises ValueError for a share outside
    (0, 100] %."""
    if value.strip().lower() == "auto":
        return MemoryShare(AUTO_SHARE, "auto")
    m = _SHARE.fullmatch(value)
    if m is None:
        if "%" in value:
            raise ValueError(
                f"budget {value!r}: a share of free memory is a number followed by '%', "
                "such as '80%'"
            )
        return None
    p = float(m.group(1))
    if not 0.0 < p <= 100.0:
        raise ValueError(
            f"budget {value!r}: a share of the free memory at entry must lie in (0, 100] %; "
            "for more than the free memory give a byte count ('90GiB')"
        )
    return MemoryShare(p / 100.0, value.strip())


def parse_device(value: str | torch.device | None) -> torch.device | None:
    """``enable(device=...)`` validated (NOTE [ Session device ] rule 1)."""
    if value is None:
        return None
    if not isinstance(value, (str, torch.device)):
        raise ValueError(
            f"device must be a torch.device or a string such as 'cuda', 'cuda:1' or 'cpu', "
            f"got {type(value).__name__} {value!r}"
        )
    try:
        d = torch.device(value)
    except RuntimeError:
        raise ValueError(
            f"device {value!r} names no device; use 'cuda', 'cuda:N' or 'cpu'"
        ) from None
    if d.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device {value!r}: tritondtr tracks CPU or CUDA tensors; use 'cuda', 'cuda:N' or 'cpu'"
        )
    return d


def concrete(device: torch.device) -> torch.device:
    """``cuda`` without an index as the current CUDA device; checks that it exists."""
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but CUDA is not available here; use device='cpu' or leave "
            "it out"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"device={str(device)!r} but this machine has {torch.cuda.device_count()} CUDA "
            f"device(s) (0..{torch.cuda.device_count() - 1})"
        )
    return torch.device("cuda", index)


def cuda_available() -> bool:
    """Whether CUDA is available, as the session's device rule reads it (NOTE [ Session
    device ] rule 2); the CPU tests on a GPU machine set it to False."""
    return torch.cuda.is_available()


def default_device() -> torch.device:
    """The device a session without ``device=`` will most likely take (NOTE [ Memory share
    budgets ] rule 3)."""
    if cuda_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def free_bytes(device: torch.device) -> int:
    """Free memory on ``device`` now, in bytes (NOTE [ Memory share budgets ] rule 1)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free) + int(cached)  # the allocator's cache is this process's to reuse
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise ValueError(
        "budget='auto' or a share needs the free memory, which this system does not report "
        "(no MemAvailable in /proc/meminfo); give a byte count such as '4GiB'"
    )


def tracks(session_device: torch.device | None, cuda_available: bool, out: torch.device) -> bool:
    """Whether an output on ``out`` may fix a session whose device is not yet fixed (NOTE [
    Session device ] rule 2): any strided non-meta device, except a CPU one while CUDA is
    available."""
    if session_device is not None:
        return out == session_device
    if out.type == "meta":
        return False
    return not (cuda_available and out.type == "cpu")


def warn_other_device(op: str, out: torch.device, session: torch.device | None) -> None:
    """NOTE [ Session device ] rule 3."""
    where = (
        f"the session tracks {session} tensors"
        if session is not None
        else "CUDA is available, so the session waits for the first CUDA output"
    )
    warnings.warn(
        f"tritondtr: {op} made an output on {out}, which stays a plain tensor (not tracked, "
        f"not counted against the budget): {where}. To track CPU tensors on a GPU machine "
        "pass enable(device='cpu'); to silence this, name the device with enable(device=...).",
        stacklevel=4,
    )


def reset_peak(device: torch.device) -> None:
    """NOTE [ Device peak ]: at entry."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_peak(device: torch.device | None) -> int | None:
    """NOTE [ Device peak ]: bytes, or None off CUDA."""
    if device is None or device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def precision_flags() -> tuple:
    """NOTE [ Precision flags ] rule 1: the flags that change a CUDA matmul's or conv's bits."""
    m = torch.backends.cuda.matmul
    return (
        ("torch.backends.cuda.matmul.allow_tf32", bool(m.allow_tf32)),
        ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision()),
        ("torch.backends.cudnn.allow_tf32", bool(torch.backends.cudnn.allow_tf32)),
        ("allow_fp16_reduced_precision_reduction", m.allow_fp16_reduced_precision_reduction),
        ("allow_bf16_reduced_precision_reduction", m.allow_bf16_reduced_precision_reduction),
    )


def check_precision(at_start: tuple, op: str) -> None:
    """NOTE [ Precision flags ] rule 2: raise if a flag changed since the session started."""
    now = precision_flags()
    if now != at_start:
        changed = ", ".join(
            f"{name}: {a!r} -> {b!r}" for (name, a), (_, b) in zip(at_start, now) if a != b
        )
        raise RuntimeError(
            f"tritondtr: cannot recompute {op}: CUDA precision flags changed inside the "
            f"session ({changed}), so its replay would give other bits than its first run. "
            "Set these flags before tritondtr.enable(...) and leave them during the session."
        )


_LINKS: dict[str, float] = {}  # device -> bytes per second (link_bandwidth)


def link_bandwidth(device: torch.device) -> float:
    """Bytes per second of a copy between ``device`` and host memory (pinned on CUDA), for
    ``enable(offload=True)`` (NOTE [ Offload ] in core/core.py): the slower direction of a
    64 MiB copy, the best of 3, measured once per device and kept. On a CPU device, a copy
    within memory."""
    key = str(device)
    bw = _LINKS.get(key)
    if bw is not None:
        return bw
    from torch.utils._python_dispatch import _disable_current_modes

    n, cuda = 64 * 2**20, device.type == "cuda"
    with _disable_current_modes():  # plain tensors, whatever mode is active
        dev = torch.empty(n, dtype=torch.uint8, device=device)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
        rates = []
        for dst, src in ((dev, host), (host, dev)):
            best = math.inf
            for _ in range(3):
                if cuda:
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                dst.copy_(src)
                if cuda:
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - t0)
            rates.append(n / max(best, 1e-9))
        del dev, host
    bw = _LINKS[key] = min(rates)
    return bw
