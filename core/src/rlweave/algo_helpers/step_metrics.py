"""Metric rows shared by the RL algorithms' steps (GRPO, PPO, OnlineDPO): the samples' rewards and
lengths, means over a step's updates,
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


#: what every policy update reports, averaged over a step's updates
UPDATE_KEYS = ("loss", "grad_norm", "lr", "pg_loss", "clip_frac", "kl", "entropy", "ratio", "ppo_kl", "ptx_loss")


def sample_metrics(batch: Any, scores: Any) -> dict[str, float]:
    """The metrics of a step's samples: ``reward/mean`` and ``reward/std`` (the summed reward of
    every source, before shaping), response lengths (mean, max, p50/p90/p99), the share of
    truncated responses, ``samples``, and the episodes' counters (multi-turn)."""
    import torch

    from rlweave.algo_helpers.multi_turn import episode_metrics

    rlen = batch.sample["response_len"].float()
    out = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "response_len/mean": float(rlen.mean()),
        "response_len/max": float(rlen.max()),
        **dict(zip(("response_len/p50", "response_len/p90", "response_len/p99"),
                   torch.quantile(rlen, torch.tensor([0.5, 0.9, 0.99])).tolist())),
        "response/truncated_frac": truncated_frac(batch.meta),
        "samples": float(len(batch)),
    }
    out.update(episode_metrics(batch.meta))
    return out


def update_metrics(rows: Sequence[Mapping[str, Any]], keys: Iterable[str | tuple[str, str]] = UPDATE_KEYS,
                   prefix: str = "") -> dict[str, float]:
    """A role's update metrics over a step (``rows``: what each ``train`` call returned): the means
    of ``keys``, the backend's ``moe_*`` metrics (named ``prefix + key``) and, for the policy
    (no ``prefix``), the off-policy correction's metrics and ``time/train_compute`` (the ranks' own
    train time; ``time/train`` minus it is dispatch and transfer)."""
    from rlweave.algo_parts.offpolicy import step_metrics as offpolicy_step_metrics

    out = key_means(rows, keys)
    out.update(prefixed_means(rows, MOE_PREFIX, prefix))
    if not prefix:
        out.update(offpolicy_step_metrics(rows))
        out["time/train_compute"] = float(sum(float(r.get("time_s", 0.0)) for r in rows))
    return out


def logprob_gap(batch: Any, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``logprob_gap``: the mean |trainer - engine| log-prob over the trained tokens, from the old
    log-probs when the step computed them, else from the first update (which sees the policy the
    engine sampled from)."""
    if "old_logprobs" in batch.token:
        on = batch.token["loss_mask"] > 0
        gap = (batch.token["old_logprobs"] - batch.token["rollout_logprobs"]).abs()[on]
        return {"logprob_gap": float(gap.mean()) if gap.numel() else 0.0}
    if rows and "logprob_gap" in rows[0]:
        return {"logprob_gap": float(rows[0]["logprob_gap"])}
    return {}
