"""How fast this CPU runs bf16 matmuls compared with fp32, measured once per process.

CPUs differ by orders of magnitude here: with AMX or AVX512-BF16, oneDNN runs bf16 matmuls
faster than fp32; on an AVX2-only CPU bf16 goes through generic kernels and is far slower
than fp32, most of all for some operand layouts (``bench/RESULTS.md``, "bf16 speed probe",
has the ratios per CPU). Anything that would compute in bf16 on a CPU, or pick a bf16 path
by itself (the FSDP backend's ``auto`` CPU options), asks :func:`bf16_speed` first and
treats bf16 as slow when :attr:`Bf16Speed.slow` says so.

The probe times the three products of a ``SIZE x SIZE`` linear layer in training (forward
``x @ W.t()``, input gradient ``g @ W``, weight gradient ``g.t() @ x``: each operand layout a
training step uses) in fp32 and in bf16, on one intra-op thread (the per-core kernel speed:
with several threads a busy neighbour process stretches short fp32 timings and would hide
the difference), keeping the best of a few runs of each after a warm-up; the ratio is that
of the summed bf16 and fp32 times. It costs well under a second on the slowest CPU, a few
milliseconds on a fast one, and runs once per process; the intra-op thread count is
restored afterwards. The environment
variable ``RLWEAVE_CPU_BF16_RATIO`` (a number: bf16 time over fp32 time) replaces the
measurement, for tests and for machines known in advance.

Importing this module imports no torch; :func:`bf16_speed` and :func:`measure` do.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

ENV = "RLWEAVE_CPU_BF16_RATIO"
SLOW_RATIO = 2.0
"""bf16 counts as slow on a CPU where a linear layer's bf16 matmuls take at least this many
times as long as the same fp32 ones. The CPUs measured so far sit far on either side (bf16 faster than
fp32, or about two orders of magnitude slower), so the value leaves room for timing noise;
a CPU that only emulates bf16 at about fp32 speed is not slow by it, and bf16 paths gain
nothing there either, but lose little."""
SIZE = 256


@dataclass(frozen=True)
class Bf16Speed:
    """One CPU's bf16 matmul speed relative to fp32.

    ``ratio``: time of a linear layer's matmuls (forward and both gradients) in bf16 over
    the same in fp32 (below 1: bf16 is faster);
    ``capability``: torch's CPU capability string (``"AVX2"``, ``"AVX512"``, ...);
    ``onednn_bf16``: whether oneDNN has bf16 kernels for this CPU (None: unknown);
    ``source``: ``"measured"``, the environment variable's name, or ``"given"`` (tests)."""

    ratio: float
    capability: str = "unknown"
    onednn_bf16: bool | None = None
    source: str = "given"

    @property
    def slow(self) -> bool:
        """bf16 compute on this CPU is slow enough that fp32 paths should be preferred."""
        return self.ratio >= SLOW_RATIO

    def describe(self) -> str:
        """One phrase for a log line, e.g. ``bf16 matmuls (a linear layer's forward and
        backward) run 20x slower than fp32 on this CPU (AVX2, no bf16 kernels in oneDNN)``."""
        what = self.capability
        if self.onednn_bf16 is not None:
            what += ", bf16 kernels in oneDNN" if self.onednn_bf16 else ", no bf16 kernels in oneDNN"
        if self.source not in ("measured", "given"):
            what += f"; ratio from {self.source}"
        if self.ratio >= 1.0:
            speed = f"{self.ratio:.0f}x slower than" if self.ratio >= 10 else f"{self.ratio:.1f}x as slow as"
        else:
            speed = f"{1.0 / self.ratio:.1f}x faster than"
        return f"bf16 matmuls (a linear layer's forward and backward) run {speed} fp32 on this CPU ({what})"


def _capability() -> tuple[str, bool | None]:
    import torch

    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    cap = get() if get is not None else "unknown"
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = None
    return cap, onednn


def _linear_time(dtype, size: int, reps: int, budget_s: float) -> float:
    """Summed best times of the three products of a ``size x size`` linear layer (forward,
    input gradient, weight gradient), each the best of up to ``reps`` timed runs after one
    warm-up, stopping early (after at least one timed run) once ``budget_s / 3`` seconds
    have been spent on it."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w, grad = (torch.randn(size, size, generator=g).to(dtype) for _ in range(3))
    out = torch.empty(size, size, dtype=dtype)
    total = 0.0
    for a, b in ((x, w.t()), (grad, w), (grad.t(), x)):
        start = time.perf_counter()
        torch.mm(a, b, out=out)  # warm-up: kernel selection, JIT, first touch of the output
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            t1 = time.perf_counter()
            best = min(best, t1 - t0)
            if t1 - start > budget_s / 3:
                break
        total += best
    return max(total, 1e-9)


def measure(size: int = SIZE, reps: int = 5, budget_s: float = 0.15) -> Bf16Speed:
    """Measure now (not cached): a ``size x size`` linear layer's matmul times in fp32 and
    bf16 on one intra-op thread, about ``budget_s`` seconds at most per dtype after the
    warm-up runs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32 = _linear_time(torch.float32, size, reps, budget_s)
        bf16 = _linear_time(torch.bfloat16, size, reps, budget_s)
    finally:
        torch.set_num_threads(threads)
    cap, onednn = _capability()
    return Bf16Speed(ratio=bf16 / fp32, capability=cap, onednn_bf16=onednn, source="measured")


@functools.lru_cache(maxsize=1)
def _measured_once() -> Bf16Speed:
    return measure()


def bf16_speed() -> Bf16Speed:
    """This CPU's :class:`Bf16Speed`: from ``RLWEAVE_CPU_BF16_RATIO`` when set (read on every
    call), else measured on the first call and cached for the process.

    Raises ValueError when the variable is set but not a positive number."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return _measured_once()
    try:
        ratio = float(raw)
    except ValueError:
        ratio = float("nan")
    if not ratio > 0 or ratio == float("inf"):
        raise ValueError(f"{ENV}={raw!r}: expected a positive number, the time of bf16 matmuls over fp32 ones "
                         f"on this CPU (below 1: bf16 is faster; {SLOW_RATIO:g} or more: bf16 is treated as slow)")
    cap, onednn = _capability()
    return Bf16Speed(ratio=ratio, capability=cap, onednn_bf16=onednn, source=ENV)


def slow_bf16_warning(who: str, dtype: str, device: str) -> str | None:
    """The warning for ``who`` (e.g. ``"role rollout rank 0 (vllm engine)"``) about to compute
    in ``dtype`` on ``device``, when that is bf16 on a CPU where bf16 is slow; else None."""
    if device != "cpu" or str(dtype).removeprefix("torch.") not in ("bfloat16", "bf16"):
        return None
    speed = bf16_speed()
    if not speed.slow:
        return None
    return f"{who} computes in bf16 on CPU, but {speed.describe()}; use dtype float32 on this CPU"
