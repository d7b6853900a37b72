"""RoleHandle: how an algorithm talks to a role (all ranks of one model).

Every method returns a :class:`~rlweave.scheduler.future.RoleFuture` at once, so calls on
different roles run concurrently; ``.result()`` waits. Dispatch modes of :meth:`call`:

* ``"all"``: same arguments on every rank; result: list of per-rank results.
* ``"rank0"``: rank 0 only; result: rank 0's result.
* ``"dp"``: every :class:`~rlweave.data.batch.Batch` argument (positional or keyword; all
  with the same samples) is cut into token-balanced shards, one per data-parallel block
  (see :mod:`rlweave.scheduler.dispatch`); other arguments go to every rank unchanged.
  Result: the blocks' results gathered back in the original sample order.

A handle is backend-agnostic: it runs on any :class:`~rlweave.scheduler.group.WorkerGroup`
(Ray actors, or workers in this process).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from rlweave.scheduler import dispatch as dsp
from rlweave.scheduler.future import RoleFuture
from rlweave.scheduler.group import WorkerGroup

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch
    from rlweave.interfaces.engine import SamplingParams

DISPATCH_MODES = ("all", "rank0", "dp")

#: worker method (or generic call's name) -> key of ``roles.<role>.timeouts``; any other uses ``other``
TIMEOUT_KEYS = {
    "init_model": "init", "init_engine": "init",
    "generate": "generate",
    "train_step": "train",
    "compute_logprobs": "logprobs", "compute_values": "logprobs", "compute_scores": "logprobs",
    "send_weights": "sync", "receive_weights": "sync", "load_weights": "sync", "weight_dtype": "sync",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "save_hf": "checkpoint",
}


def _first(values: list[Any]) -> Any:
    return values[0]


class RoleHandle:
    """All ranks of one role.

    Attributes: ``name`` (role), ``world_size``, ``parallel`` (sizes), ``dp`` (data-parallel
    blocks), ``group`` (the worker group underneath), ``timeouts``: key of
    :data:`TIMEOUT_KEYS` (and ``other``) -> seconds; every future a call returns waits at most
    that long in ``result()`` unless given its own timeout (no entry: no limit).
    """

    def __init__(self, name: str, group: WorkerGroup, parallel: Mapping[str, int] | None = None, on_close=None,
                 timeouts: Mapping[str, float] | None = None):
        self.name = name
        self.group = group
        self.world_size = group.world_size
        #: ``generate`` calls a replica runs at once (:attr:`WorkerGroup.concurrent_calls`)
        self.concurrent_calls = int(getattr(group, "concurrent_calls", 1))
        self.timeouts = dict(timeouts or {})
        self.parallel = dict(parallel or {})
        self.dp = dsp.dp_size(self.world_size, self.parallel)
        self._leaders = dsp.block_leaders(self.world_size, self.dp)
        self._on_close = on_close
        self._closed = False

    # ------------------------------------------------------------------ core
    def submit_ranks(self, method: str, ranks: list[int], rank_args: list, combine: Callable[[list[Any]], Any],
                     on_actor: bool = False, fn: Callable[..., Any] | None = None,
                     started: float | None = None, control: bool = False) -> RoleFuture:
        """Low level: ``method`` on ``ranks`` (``rank_args[i] = (args, kwargs)`` for
        ``ranks[i]``), results combined by ``combine(list in ranks order)``. ``on_actor``
        targets the rank's wrapper (``address``, ``placement``) instead of the worker. With
        ``fn``, each rank runs ``fn(worker, rank, *args, **kwargs)`` in its own process and
        ``method`` names the call (errors, faults, its :data:`TIMEOUT_KEYS` entry): the one
        generic call through which weight-sync transports run their rank-side ends. ``started``
        (a ``time.perf_counter()`` reading) is when the caller began preparing the call: the
        future's ``dispatch_s`` counts from there. ``control``: on the ranks' control channel
        (:mod:`rlweave.scheduler.group`), never queued behind their other calls where they have one."""
        started = time.perf_counter() if started is None else started
        if self._closed:
            raise RuntimeError(f"role {self.name!r} is shut down; cannot call {method}()")
        limit, setting = self.timeout_for(method)
        fut = RoleFuture(self.group, self.group.submit(method, ranks, rank_args, on_actor=on_actor, fn=fn,
                                                       control=control), combine,
                         default_timeout=limit, setting=setting)
        fut.dispatch_s = time.perf_counter() - started
        return fut

    def timeout_for(self, method: str) -> tuple[float | None, str | None]:
        """``(seconds, "roles.<role>.timeouts.<key>")`` for ``method``, or ``(None, None)``."""
        key = TIMEOUT_KEYS.get(method, "other")
        if key not in self.timeouts:
            return None, None
        return float(self.timeouts[key]), f"roles.{self.name}.timeouts.{key}"

    def _all(self, method: str, *args: Any, combine: Callable[[list[Any]], Any] = list, **kw: Any) -> RoleFuture:
        ranks = list(range(self.world_size))
        return self.submit_ranks(method, ranks, [(args, kw)] * len(ranks), combine)

    def call(self, method: str, *args: Any, dispatch: str = "all", **kw: Any) -> RoleFuture:
        """Run ``method`` of the rank workers; see the module docstring for ``dispatch``."""
        if dispatch == "all":
            return self._all(method, *args, **kw)
        if dispatch == "rank0":
            return self.submit_ranks(method, [0], [(args, kw)], _first)
        if dispatch == "dp":
            return self._dp_call(method, args, kw, combine=None)
        raise ValueError(f"unknown dispatch {dispatch!r}; choose one of {', '.join(DISPATCH_MODES)}")

    def _dp_call(self, method: str, args: tuple, kw: dict, combine: Callable[[list[Any]], Any] | None) -> RoleFuture:
        started = time.perf_counter()
        pos = [i for i, a in enumerate(args) if dsp.is_batch(a)]
        keys = [k for k, v in kw.items() if dsp.is_batch(v)]
        if not pos and not keys:
            raise ValueError(f"{self.name}.{method}(dispatch='dp') needs a Batch argument")
        batch: "Batch" = args[pos[0]] if pos else kw[keys[0]]
        for other in [args[i] for i in pos] + [kw[k] for k in keys]:
            if len(other) != len(batch):
                raise ValueError(f"{self.name}.{method}: Batch arguments differ in length ({len(other)} vs {len(batch)})")
        partitions = batch.balanced_partition(self.dp)
        block = self.world_size // self.dp
        # one data-parallel block: its shard is the whole batch in order (a shallow copy, not a select)
        cut = (lambda b, _part: b.shallow_copy()) if self.dp == 1 else (lambda b, part: b.select(part))
        rank_args = []
        shards_by_block = []
        for part in partitions:
            a = list(args)
            k = dict(kw)
            for i in pos:
                a[i] = cut(args[i], part)
            for key in keys:
                k[key] = cut(kw[key], part)
            shards_by_block.append(a[pos[0]] if pos else k[keys[0]])
            rank_args.extend([(tuple(a), k)] * block)
        ranks = list(range(self.world_size))
        leaders = self._leaders

        def gather(values: list[Any]) -> Any:
            per_block = [values[r] for r in leaders]
            if combine is not None:
                return combine(per_block)
            return dsp.gather(per_block, batch, partitions, shards_by_block)

        return self.submit_ranks(method, ranks, rank_args, gather, started=started)

    # ------------------------------------------------------------ rollout
    def generate(self, prompts: list[list[int]], params: "SamplingParams") -> RoleFuture:
        """``list[list[Generation]]`` in prompt order; prompts are balanced by length over
        the engine replicas (data-parallel blocks); a replica's first rank generates."""
        started = time.perf_counter()
        if not prompts:
            return RoleFuture.ready([])
        partitions = dsp.partition_lengths([len(p) for p in prompts], self.dp)
        used = [(leader, part) for leader, part in zip(self._leaders, partitions) if part]
        rank_args = [(([prompts[i] for i in part], params), {}) for _, part in used]
        n = len(prompts)

        def reassemble(values: list[Any]) -> list[Any]:
            return dsp.reorder_lists(values, [p for _, p in used], n)

        return self.submit_ranks("generate", [r for r, _ in used], rank_args, reassemble, started=started)

    def abort(self) -> RoleFuture:
        """Ask every replica's ``generate`` call in progress to stop at its next decoding step
        (``RolloutEngine.abort``, on the control channel); resolves to the number of calls
        asked, summed over the replicas."""
        return self.submit_ranks("abort", list(self._leaders), [((), {})] * len(self._leaders), sum, control=True)

    def load_weights(self, named_tensors: list) -> RoleFuture:
        """Send ``[(name, tensor), ...]`` to every rank's ``load_weights`` directly (small
        models and tests; bulk updates go through :func:`rlweave.weight_sync.sync_weights`)."""
        return self._all("load_weights", named_tensors)

    def sleep(self, level: int = 1) -> RoleFuture:
        return self._all("sleep", level)

    def wake_up(self) -> RoleFuture:
        return self._all("wake_up")

    # ------------------------------------------------------------ training
    def logprobs(self, batch: "Batch", temperature: float = 1.0, with_entropy: bool = False,
                 with_routing: bool = False) -> RoleFuture:
        """``{"logprobs": (T,), "entropy": (T,) if asked, "routing": (T, layers, top_k) if asked}`` in
        batch order (``with_routing``: MoE models on a backend whose record says ``router_replay``)."""
        kw: dict[str, Any] = {"temperature": temperature, "with_entropy": with_entropy}
        if with_routing:
            kw["with_routing"] = True
        return self._dp_call("compute_logprobs", (batch,), kw, None)

    def values(self, batch: "Batch") -> RoleFuture:
        """Per-token values ``(T,)`` in batch order."""
        return self._dp_call("compute_values", (batch,), {}, None)

    def scores(self, batch: "Batch") -> RoleFuture:
        """Per-sample scores ``(n,)`` in batch order."""
        return self._dp_call("compute_scores", (batch,), {}, None)

    def train(self, batch: "Batch", loss_fn: Any) -> RoleFuture:
        """One optimizer step on ``batch`` scattered over data-parallel ranks; resolves to
        rank 0's metrics (which the backend makes global)."""
        return self._dp_call("train_step", (batch,), {"loss_fn": loss_fn}, _first)

    def save_checkpoint(self, path: str) -> RoleFuture:
        return self._all("save_checkpoint", path)

    def load_checkpoint(self, path: str) -> RoleFuture:
        return self._all("load_checkpoint", path)

    def save_hf(self, path: str) -> RoleFuture:
        return self._all("save_hf", path)

    def offload(self) -> RoleFuture:
        return self._all("offload")

    def onload(self) -> RoleFuture:
        return self._all("onload")

    def ping(self) -> RoleFuture:
        return self._all("ping")

    # ------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def kill(self, release: bool = True) -> None:
        """End every rank now, without asking the workers (a rank that is hung or dead would
        not answer); with ``release`` give the devices back. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.group.kill()
        if release and self._on_close is not None:
            self._on_close()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Synchronous and idempotent: ask every rank's worker to ``shutdown()`` (waiting at
        most ``timeout_s``; errors are ignored), then end the ranks and give their devices back."""
        if self._closed:
            return
        try:
            fut = self._all("shutdown")
            fut.result(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - the ranks are killed below anyway
            pass
        finally:
            self._closed = True
            self.group.kill()
            if self._on_close is not None:
                self._on_close()

    def __repr__(self) -> str:
        return f"RoleHandle({self.name!r}, world_size={self.world_size}, dp={self.dp})"
