"""Tiny rank workers for scheduler and weight-sync tests (torch, no model).

* :class:`ProbeWorker` - a training-backend-shaped worker whose results are simple
  functions of the input, so order, placement and collectives can be checked exactly;
  it also holds a seeded state dict for weight-sync round trips.
* :class:`ProbeEngine` - an engine-shaped worker whose generations encode the prompt.
* :class:`ConcurrentProbeEngine` - a ProbeEngine that runs two ``generate`` calls at once.
* :class:`StuckReceiver` - a ProbeWorker whose ``load_weights`` never returns in time.
* :data:`PROBE`, :data:`STUCK`, :data:`PROBE_ENGINE`, :data:`CONCURRENT_PROBE_ENGINE` - plugin
  records of them, for ``build_roles`` in tests and benches.

``ctx.options`` keys (a plain dict: these workers have no options model): ``weights_mb`` (size of
the state dict, default 0), ``weights_seed``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Iterable, Iterator

from rlweave.interfaces.engine import Generation, RolloutEngine, SamplingParams
from rlweave.interfaces.worker import Worker
from rlweave.plugins.types import BackendRecord, EngineRecord

PROBE = BackendRecord(name="probe", summary="test worker", target="rlweave.testing.workers:ProbeWorker")
STUCK = BackendRecord(name="stuck", summary="never loads", target="rlweave.testing.workers:StuckReceiver")
PROBE_ENGINE = EngineRecord(name="probe-engine", summary="test engine", target="rlweave.testing.workers:ProbeEngine")
CONCURRENT_PROBE_ENGINE = EngineRecord(name="concurrent-probe-engine", summary="test engine, two calls at once",
                                       target="rlweave.testing.workers:ConcurrentProbeEngine")


def make_state_dict(megabytes: float, seed: int) -> dict[str, Any]:
    """A deterministic mix of dtypes and shapes totalling about ``megabytes`` MB."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = max(1, int(megabytes * 2**20 / 4 / 3))
    side = max(1, int(n**0.5))
    return {
        "embed.weight": torch.randn(side, side, generator=g),
        "layers.0.mlp.weight": torch.randn(n, generator=g).to(torch.bfloat16),
        "layers.0.mlp.bias": torch.randn(7, generator=g),
        "layers.1.attn.weight": torch.randn(side, side + 3, generator=g).to(torch.float16),
        "layers.1.scale": torch.tensor(seed, dtype=torch.float32),
        "head.counts": torch.arange(1001, dtype=torch.int64),
    }


def _started_with(name: str) -> bool | None:
    """Whether this process's initial environment had ``name`` (None: not on Linux)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            return any(v.startswith(name.encode() + b"=") for v in f.read().split(b"\0"))
    except OSError:
        return None


class ProbeWorker(Worker):
    """Results are functions of the input; see the module docstring."""

    def init_model(self) -> None:
        self.init_distributed()
        mb = float(self.ctx.options.get("weights_mb", 0))
        self.state = make_state_dict(mb, int(self.ctx.options.get("weights_seed", 0))) if mb else {}

    def placement(self) -> dict[str, Any]:
        out = {"role": self.ctx.role, "rank": self.rank, "world_size": self.world_size, "pid": os.getpid(),
               "device": self.ctx.device, "master": f"{self.ctx.master_addr}:{self.ctx.master_port}"}
        ray = sys.modules.get("ray")  # set inside a Ray actor; not imported just for this
        out["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()] if ray is not None and ray.is_initialized() else []
        out["started_with_glibc_tunables"] = _started_with("GLIBC_TUNABLES")
        return out

    def realloc_page_faults(self) -> int:
        """Page faults of writing 32 MiB just after freeing 64 MiB in this rank's process."""
        from rlweave.scheduler.ray_impl.malloc import realloc_page_faults

        return realloc_page_faults()

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def nap(self, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def die(self) -> None:
        os._exit(3)

    def compute_logprobs(self, batch, temperature: float = 1.0, with_entropy: bool = False) -> dict[str, Any]:
        lp = batch.token["input_ids"].double() / temperature
        out = {"logprobs": lp, "rank": [self.rank] * len(batch)}
        if with_entropy:
            out["entropy"] = -lp
        return out

    def compute_scores(self, batch):
        import torch

        return torch.stack([s.double().sum() for s in batch.sequences()]) if len(batch) else torch.zeros(0)

    def echo_ids(self, batch) -> list[str]:
        return list(batch.ids)

    def echo_batch(self, batch):
        return batch

    def train_step(self, batch, loss_fn) -> dict[str, float]:
        return {"samples": float(len(batch)), "rank": float(self.rank)}

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        if self.rank == 0:
            yield from self.state.items()

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self.state = {name: t.clone() for name, t in named_tensors}

    def get_state(self) -> dict[str, Any]:
        return self.state


class StuckReceiver(ProbeWorker):
    """``load_weights`` sleeps ``ctx.options['stuck_s']`` (default 300 s) before reading."""

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        time.sleep(float(self.ctx.options.get("stuck_s", 300)))
        super().load_weights(named_tensors)


def engine_busy(worker: Any, rank: int) -> bool:  # noqa: ARG001
    """Generic call (send it on the control channel): whether the engine's ``generate`` runs."""
    return bool(worker.step_gate.busy)


def process_threads_around_compute(worker: Any, rank: int) -> tuple[int, int, int]:  # noqa: ARG001
    """Generic call: this process's thread count before and after a parallel torch op on the
    calling thread, and its intra-op thread count (tests of the OpenMP pools of calls run on
    threads of their own, :mod:`rlweave.devices.openmp`)."""
    import torch

    before = len(os.listdir("/proc/self/task"))
    torch.ones(1 << 20).add_(1)  # a million elements: a parallel region when threads > 1
    return before, len(os.listdir("/proc/self/task")), torch.get_num_threads()


def process_threads(worker: Any, rank: int) -> int:  # noqa: ARG001
    """Generic call: this process's thread count."""
    return len(os.listdir("/proc/self/task"))


class ProbeEngine(RolloutEngine):
    """Generation ``k`` of a prompt is ``reversed(prompt) + [k, rank]``, every token stamped
    with the weight version. With option ``step_s`` > 0 a call instead takes
    ``max_new_tokens`` decoding steps of ``step_s`` seconds each (generation ``k`` is
    ``[k] * max_new_tokens``), with a step boundary after each (``control_plane``: weight
    syncs land there), and :meth:`abort` stops it at the next one."""

    control_plane = True

    def init_engine(self) -> None:
        self.state: dict[str, Any] = {}
        self._abort = threading.Event()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        step_s = float((self.ctx.options or {}).get("step_s", 0))
        with self.step_gate.running():
            if step_s <= 0:
                return [[Generation(token_ids=list(reversed(p)) + [k, self.rank], logprobs=[0.0] * (len(p) + 2),
                                    finish_reason="length", versions=[self.weight_version] * (len(p) + 2))
                         for k in range(params.n)] for p in prompts]
            self._abort.clear()
            versions: list[int] = []
            while len(versions) < params.max_new_tokens and not self._abort.is_set():
                time.sleep(step_s)
                versions.append(self.weight_version)
                self.step_gate.boundary()
            reason = "length" if len(versions) == params.max_new_tokens else "aborted"
            return [[Generation(token_ids=[k] * len(versions), logprobs=[0.0] * len(versions), finish_reason=reason,
                                versions=list(versions)) for k in range(params.n)] for _ in prompts]

    def abort(self) -> int:
        busy = self.step_gate.busy
        self._abort.set()
        return int(busy)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        with self.step_gate.update():
            self.state = {name: t.clone() for name, t in named_tensors}

    def weight_dtype(self) -> str | None:
        """Option ``weight_dtype`` (None by default)."""
        return (self.ctx.options or {}).get("weight_dtype")

    def get_state(self) -> dict[str, Any]:
        return self.state


class ConcurrentProbeEngine(ProbeEngine):
    """A :class:`ProbeEngine` whose ``generate`` calls run two at a time (``concurrent_calls``),
    each on its own thread, stepping side by side."""

    concurrent_calls = 2
