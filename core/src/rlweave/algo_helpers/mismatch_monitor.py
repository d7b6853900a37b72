"""Watching the train/inference mismatch: a warning naming the likely cause when the gap between
the engine's and the trainer's log-probs jumps.

Every step the toolkit hands the ``mismatch/*`` metrics (:mod:`rlweave.algo_parts.mismatch`) to
:meth:`MismatchMonitor.observe`. The gap is ``mismatch/k3`` (KL(engine || trainer) on the
engine's samples). It *jumps* when it reaches :data:`FLOOR` and is at least :data:`FACTOR`
times its running mean over the earlier steps (any step at or above the floor, at the first
step). Then each likely cause is named on the console (logger ``rlweave.algo``), each cause once
per run:

* ``stale``: tokens one or more versions old carry more of the gap than fresh ones
  (``mismatch/stale1/k3``, ``stale2/k3`` against ``stale0/k3``): the engine sampled with older
  weights (``run.mode``, ``run.max_staleness``; a weight sync that did not land);
* ``dtype``: the engine computes in another dtype than the trainer
  (``roles.rollout.options.dtype`` or the rollout's model dtype against the policy's model dtype
  and mixed precision);
* ``sampling``: the engine's log-probs are of another distribution than the trainer's:
  ``top_p`` < 1 or ``top_k`` on (log-probs of the truncated distribution), or
  ``logprobs_mode: raw`` with a temperature other than 1;
* ``unknown``: none of these.

Apart from jumps, when the rollout correction drops at least :data:`DROPPED` of a step's samples
(``mismatch/samples_masked_frac``: a band narrower than the gap, e.g. ``geo_mask``'s default
around a bf16 engine), it says so once per run, naming the correction and its options' key: a
correction that drops most samples leaves each update a fraction of its size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

log = logging.getLogger("rlweave.algo")

#: a gap below this (k3, nats per token) never warns: the rounding of matched stacks stays under it
FLOOR = 1e-3
#: a jump: the gap at least this many times its running mean
FACTOR = 4.0
#: weight of the newest step in the running mean
EMA = 0.2
#: a correction dropping at least this share of a step's samples is warned about
DROPPED = 0.5


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _dtypes(run_config: Any) -> tuple[str | None, str | None]:
    """``(engine dtype, trainer compute dtype)`` from a run config, None where it does not say."""
    roles = _get(run_config, "roles") or {}
    top = _get(_get(run_config, "model"), "dtype")

    def model_dtype(role: str) -> str | None:
        return _get(_get(roles.get(role), "model"), "dtype") or top

    engine = _get(_get(roles.get("rollout"), "options") or {}, "dtype")
    engine = model_dtype("rollout") if engine in (None, "auto") else engine
    trainer = model_dtype("policy")
    if _get(_get(roles.get("policy"), "options") or {}, "mixed_precision") == "bf16":
        trainer = "bfloat16"
    return engine, trainer


def config_causes(run_config: Any, algorithm_config: Any) -> dict[str, str]:
    """The causes of a gap a run's settings make likely (``dtype``, ``sampling``), each with
    the sentence that names it."""
    out = {}
    engine, trainer = _dtypes(run_config)
    if engine and trainer and engine != trainer:
        out["dtype"] = (f"the engine computes in {engine} and the trainer in {trainer} (roles.rollout.options.dtype "
                        "or its model.dtype, roles.policy.model.dtype): their log-probs differ by rounding")
    top_p, top_k = _get(algorithm_config, "top_p", 1.0), _get(algorithm_config, "top_k", -1)
    temperature = _get(algorithm_config, "temperature", 1.0)
    raw = _get(_get((_get(run_config, "roles") or {}).get("rollout"), "options") or {}, "logprobs_mode") == "raw"
    if (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0):
        out["sampling"] = (f"the engine samples with top_p {top_p} / top_k {top_k} and reports the log-probs of that "
                           "truncated distribution, the trainer those of the whole one (algorithm.top_p, top_k)")
    elif raw and temperature != 1.0:
        out["sampling"] = (f"the engine reports raw log-probs (logprobs_mode: raw, temperature 1) while sampling at "
                           f"temperature {temperature} (roles.rollout.options.logprobs_mode)")
    return out


@dataclass
class MismatchMonitor:
    """Warns once per cause when the gap jumps (module docstring). ``causes``: the run's own
    (:func:`config_causes`)."""

    causes: dict[str, str] = field(default_factory=dict)
    baseline: float | None = None
    warned: set[str] = field(default_factory=set)
    correction: str | None = None  # the rollout correction's name (algorithm.off_policy.correction)

    @classmethod
    def for_run(cls, run_config: Any, algorithm_config: Any) -> "MismatchMonitor":
        spec = _get(_get(algorithm_config, "off_policy"), "correction")
        name = getattr(spec, "name", spec if isinstance(spec, str) else _get(spec, "name"))
        return cls(config_causes(run_config, algorithm_config), correction=name)

    def observe(self, metrics: Mapping[str, float], step: int) -> list[str]:
        """Look at one step's ``mismatch/*`` metrics (``step``: its number, for the message);
        returns the warnings it logged."""
        dropped = self._dropped(metrics, step)
        k3 = metrics.get("mismatch/k3")
        if k3 is None:
            return dropped
        before = self.baseline
        jumped = k3 >= FLOOR and (before is None or k3 >= FACTOR * before)
        self.baseline = k3 if before is None else (1.0 - EMA) * before + EMA * k3
        if not jumped:
            return dropped
        was = "" if before is None else f" (running mean {before:.3g})"
        head = (f"train/inference mismatch at step {step}: mismatch/k3 {k3:.3g}{was}, |dlogp| p99 "
                f"{metrics.get('mismatch/dlogp_abs_p99', float('nan')):.3g}. Likely cause: ")
        found = dict(self._stale(metrics))
        found.update(self.causes)
        if not found:
            found["unknown"] = ("none of stale weights, different dtypes or truncated sampling; check that weight "
                                "syncs land (sync_bytes), the engine's kernels and the models' numerics")
        messages = dropped
        for cause, why in found.items():
            if cause in self.warned:
                continue
            self.warned.add(cause)
            messages.append(head + why)
            log.warning("%s", messages[-1])
        return messages

    def _dropped(self, metrics: Mapping[str, float], step: int) -> list[str]:
        """The once-per-run warning of a correction that dropped most of a step's samples."""
        frac = metrics.get("mismatch/samples_masked_frac")
        if frac is None or frac < DROPPED or "dropped" in self.warned:
            return []
        self.warned.add("dropped")
        name = self.correction or "the rollout correction"
        msg = (f"rollout correction {name} dropped {frac:.0%} of the samples at step {step} (|dlogp| mean "
               f"{metrics.get('mismatch/dlogp_abs_mean', float('nan')):.3g}): its band is narrower than the "
               f"train/inference gap of this run, and each update keeps only the rest. Widen it "
               f"(algorithm.off_policy.correction: {{name: {name}, low: ..., high: ...}}), close the gap, or choose "
               "a token-level correction")
        log.warning("%s", msg)
        return [msg]

    @staticmethod
    def _stale(metrics: Mapping[str, float]) -> dict[str, str]:
        fresh = metrics.get("mismatch/stale0/k3", 0.0)
        for g in (2, 1):
            k3 = metrics.get(f"mismatch/stale{g}/k3")
            if k3 is not None and k3 >= FLOOR and k3 > 2.0 * fresh:
                old = "two or more versions" if g == 2 else "one version"
                return {"stale": (f"stale weights: tokens {old} old have mismatch k3 {k3:.3g} against {fresh:.3g} "
                                  "for fresh ones (run.mode, run.max_staleness; or a weight sync that did not land)")}
        return {}
