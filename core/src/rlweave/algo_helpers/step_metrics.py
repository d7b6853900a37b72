"""Metric rows shared by the RL algorithms' steps (GRPO, PPO): means over a step's updates,
the per-reward breakdown and the share of truncated responses. Mixture-of-experts backends
report ``moe_*`` metrics (:data:`MOE_PREFIX`), which the steps pass on."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

#: prefix of the expert-load and router-loss metrics an MoE model's backend reports
MOE_PREFIX = "moe_"


def mean(xs: Sequence[float]) -> float:
    """The mean of ``xs``; 0.0 when empty."""
    return float(sum(xs) / len(xs)) if xs else 0.0


def key_means(rows: Iterable[Mapping[str, Any]], keys: Iterable[str | tuple[str, str]]) -> dict[str, float]:
    """For each key (or ``(key, name in the output)`` pair), the mean of its values over the
    ``rows`` that have it (e.g. the metrics of each optimizer update); keys no row has are left out."""
    rows = list(rows)
    out: dict[str, float] = {}
    for key in keys:
        key, name = key if isinstance(key, tuple) else (key, key)
        vals = [float(r[key]) for r in rows if key in r]
        if vals:
            out[name] = mean(vals)
    return out


def prefixed_means(rows: Iterable[Mapping[str, Any]], prefix: str, out_prefix: str = "") -> dict[str, float]:
    """The means over ``rows`` of every key starting with ``prefix`` (a backend's own metrics that
    no algorithm names, e.g. the ``moe_`` expert-load metrics), named ``out_prefix + key``."""
    rows = list(rows)
    keys = sorted({k for r in rows for k in r if k.startswith(prefix)})
    return key_means(rows, [(k, out_prefix + k) for k in keys])


def reward_breakdown(breakdown: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``reward/<name>``: each reward's mean over the samples it scored with a number, then
    ``reward/failed``: how many reward calls failed (from each sample's ``failed`` list)."""
    out = {f"reward/{name}": mean([float(d[name]) for d in breakdown if isinstance(d.get(name), (int, float))])
           for name in sorted({k for d in breakdown for k in d if k != "failed"})}
    out["reward/failed"] = float(sum(len(d.get("failed", [])) for d in breakdown))
    return out


def truncated_frac(meta: Iterable[Mapping[str, Any]]) -> float:
    """Share of responses that stopped at the length limit (``finish_reason == "length"``)."""
    return mean([1.0 if m["finish_reason"] == "length" else 0.0 for m in meta])
