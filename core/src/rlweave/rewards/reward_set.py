"""Several weighted rewards, computed in worker processes.

Contract of :meth:`RewardSet.score`: for each sample (``{"prompt", "response", **record
fields}``) every reward entry is called as ``fn(**sample, **entry.args)``. A call that raises,
returns a non-number, runs past ``runtime.timeout_s`` or kills its process is worth
``runtime.failure_reward`` (for that reward; the others still count), is listed in the
sample's breakdown under ``"failed"``, and is reported by one warning per reward and kind of
failure per ``score()``. The total is ``sum(weight * value)``. The run goes on, unless more
than ``runtime.max_failed_share`` of one reward's calls in this ``score()`` failed: then
``score()`` raises :class:`~rlweave.rewards.failures.RewardFailureError` (how many of how
many, which reward and its key, the first failure and its sample), which stops the run (see
:mod:`rlweave.rewards.failures`).

:meth:`RewardSet.score` is :meth:`RewardSet.run_calls` (the worker calls, in sample order) then
:meth:`RewardSet.tally` (totals, breakdown, warnings and the failure-share stop over all the samples
given): a caller may run the calls of a batch's samples in several parts, as they become ready, and
tally them once, with the same result as one ``score()`` of the batch.

Calls run in sandboxed worker processes (``runtime.sandbox``, see
:mod:`rlweave.sandbox.pool`): a memory limit, a CPU budget per call, a private directory,
process starts refused and network allowed by default.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from rlweave.rewards.failures import failure_stop
from rlweave.rewards.loader import load_reward_fn, resolve_reward_target
from rlweave.sandbox.pool import RewardPool
from rlweave.rewards.sections import RewardEntry, RewardsRuntime

log = logging.getLogger("rlweave.rewards")


class RewardSet:
    """The run's rewards (``rewards[]`` and ``reward_runtime`` of the config).

    Args:
        entries: reward entries (``RewardEntry`` or plain dicts); at least one.
        runtime: timeout, failure reward, worker count, sandbox and failure-share stop
            (default ``RewardsRuntime()``).
        plugin_manager: where reward plugin names are looked up (see
            :func:`rlweave.rewards.loader.reward_records`); ``None`` = built-in rewards only.
        start_method: multiprocessing start method of the workers.

    Names in the breakdown are the entries' names; a name used twice gets ``#2``, ``#3``...
    Every reward is imported here first, so a typo fails before any worker starts.
    """

    def __init__(
        self,
        entries: list[RewardEntry] | list[dict[str, Any]],
        runtime: RewardsRuntime | None = None,
        plugin_manager: Any = None,
        start_method: str = "spawn",
    ) -> None:
        self.entries = [e if isinstance(e, RewardEntry) else RewardEntry.model_validate(e) for e in entries]
        if not self.entries:
            raise ValueError("no rewards configured: add at least one entry under 'rewards:'")
        self.runtime = runtime or RewardsRuntime()
        targets = []
        for k, entry in enumerate(self.entries):
            try:
                targets.append(resolve_reward_target(entry.name, plugin_manager))
                load_reward_fn(entry.name, plugin_manager)
            except (ValueError, ImportError, TypeError) as exc:
                raise type(exc)(f"rewards[{k}]: {exc}") from exc
        self.names: list[str] = []
        seen: Counter[str] = Counter()
        for entry in self.entries:
            seen[entry.name] += 1
            self.names.append(entry.name if seen[entry.name] == 1 else f"{entry.name}#{seen[entry.name]}")
        self._pool = RewardPool(
            targets, workers=self.runtime.workers, timeout_s=self.runtime.timeout_s, start_method=start_method,
            sandbox=self.runtime.sandbox,
        )
        self.stats: Counter[str] = Counter()  #: cumulative counts: calls, error, timeout, crash
        self._lock = threading.Lock()  # the pool runs one set of calls at a time

    def score(self, samples: list[dict[str, Any]]) -> tuple[list[float], list[dict[str, Any]]]:
        """Weighted total per sample and a per-sample breakdown ``{name: value, "failed": [names]}``.

        Raises :class:`~rlweave.rewards.failures.RewardFailureError` when more than
        ``runtime.max_failed_share`` of one reward's calls failed (see the module docstring)."""
        return self.tally(samples, self.run_calls(samples))

    def run_calls(self, samples: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """The outcome of every reward on every sample (``("ok", value)``, ``("error", message)``,
        ``("timeout", ...)``, ``("crash", ...)``), sample-major: sample ``i``'s are
        ``[i * m : (i + 1) * m]`` for the ``m`` entries. Safe to call from several threads (the
        calls run one set at a time); nothing is counted or raised for failures here (see
        :meth:`tally`). Raises ``KeyError`` for a sample without ``prompt`` or ``response`` and
        :class:`~rlweave.sandbox.pool.RewardWorkerError` when the workers cannot start."""
        for n, sample in enumerate(samples):
            if "prompt" not in sample or "response" not in sample:
                raise KeyError(f"reward sample {n} needs 'prompt' and 'response' (has {sorted(sample)})")
        calls = [(j, {**sample, **entry.args}) for sample in samples for j, entry in enumerate(self.entries)]
        if not calls:
            return []
        with self._lock:
            return self._pool.run(calls)

    def tally(self, samples: list[dict[str, Any]],
              outcomes: list[tuple[str, Any]]) -> tuple[list[float], list[dict[str, Any]]]:
        """Totals and breakdown of ``samples`` from their :meth:`run_calls` outcomes (in the same
        order, possibly gathered from several calls): counts :attr:`stats`, warns once per reward
        and kind of failure, and raises :class:`~rlweave.rewards.failures.RewardFailureError` when
        more than ``runtime.max_failed_share`` of one reward's calls among ``samples`` failed."""
        if len(outcomes) != len(samples) * len(self.entries):
            raise ValueError(f"{len(outcomes)} reward outcomes for {len(samples)} samples x "
                             f"{len(self.entries)} rewards")
        totals: list[float] = []
        breakdown: list[dict[str, Any]] = []
        problems: dict[tuple[str, str], list[str]] = {}
        first_failure: dict[str, tuple[str, int]] = {}  # name -> (message, sample index)
        m = len(self.entries)
        for n, sample in enumerate(samples):
            row: dict[str, Any] = {"failed": []}
            total = 0.0
            for j, entry in enumerate(self.entries):
                status, payload = outcomes[n * m + j]
                name = self.names[j]
                if status == "ok":
                    value = float(payload)
                else:
                    value = float(self.runtime.failure_reward)
                    row["failed"].append(name)
                    problems.setdefault((name, status), []).append(f"{sample.get('id', n)}: {payload}")
                    first_failure.setdefault(name, (str(payload), n))
                    self.stats[status] += 1
                row[name] = value
                total += entry.weight * value
            self.stats["calls"] += m
            totals.append(total)
            breakdown.append(row)
        for (name, status), msgs in problems.items():
            first = msgs[0].strip().splitlines()
            log.warning(
                "reward %r: %d of %d call(s) failed (%s), scored %g; first: %s",
                name, len(msgs), len(samples), status, self.runtime.failure_reward,
                " | ".join(first[:1] + first[-1:]) if len(first) > 1 else first[0],
            )
        fields = sorted({k for sample in samples for k in sample})
        for j, name in enumerate(self.names):  # the failure-share stop, in the order of rewards[]
            if name in first_failure:
                kinds = Counter({status: len(msgs) for (n, status), msgs in problems.items() if n == name})
                first, index = first_failure[name]
                error = failure_stop(name, kinds, len(samples), first, self.runtime.max_failed_share, fields,
                                     key=f"rewards.{j}.name", index=index, record_id=samples[index].get("id"))
                if error is not None:
                    raise error
        return totals, breakdown

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        self._pool.close()

    def __enter__(self) -> RewardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
