"""Train/inference mismatch metrics: how far the engine's log-probs are from the trainer's on
the trained tokens, measured in the update's own forward pass (no extra pass).

With ``d_t = log pi_trainer - log pi_engine`` on a trained token (``pi_trainer``: the trainer's
log-probs of the policy the update starts from, :func:`~rlweave.algo_parts.offpolicy.
proximal_logprobs`; ``pi_engine``: token field ``rollout_logprobs``) and ``r_t = exp(d_t)``
(``d_t`` clamped to +-20 inside ``exp``), the step reports, as means over the trained tokens of
the step's first pass over its batch::

    mismatch/k1 = mean(-d)            mismatch/k2 = mean(d^2 / 2)
    mismatch/k3 = mean(r - 1 - d)     (KL(engine || trainer) estimators on the engine's samples)
    mismatch/chi2 = mean(r^2) - 1     (chi-square divergence of the trainer from the engine)
    mismatch/dlogp_abs_mean, _p50, _p99, _max   (|d|; p50/p99 from a log-spaced histogram)
    mismatch/truncated_frac, masked_frac        (share of tokens the correction truncated, dropped)
    mismatch/samples_truncated_frac, samples_masked_frac   (share of samples with such a token)
    mismatch/tokens                              (trained tokens compared)

and, where the batch carries token field ``staleness`` (policy version minus the engine's
weight version of each token), the same means per staleness as ``mismatch/stale0/*``,
``stale1/*`` and ``stale2/*`` (2: two versions old or more; a sample's staleness is its oldest
trained token's), each with ``tokens_frac``, left out for a staleness no token has.

Each update's loss returns sums (:func:`mismatch_sums`, keys under :data:`ACC`, summed over
micro-batches and ranks by the backend); :func:`mismatch_metrics` turns the sums of the step's
first pass into the metrics. p50 and p99 come from a histogram of ``log10 |d|`` with
:data:`PER_DECADE` bins a decade between 1e-8 and 100: within one bin (12%) of the exact
quantile, 0 below 1e-8, never above the exact maximum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch

PREFIX = "mismatch/"
#: keys of the per-update sums a policy loss returns (read by :func:`mismatch_metrics`, never logged)
ACC = "mismatch_acc/"
#: staleness groups: 0, 1, and 2 or more versions old
STALENESS = (0, 1, 2)
LOG10_LOW, LOG10_HIGH, PER_DECADE = -8, 2, 20
BINS = (LOG10_HIGH - LOG10_LOW) * PER_DECADE
#: per-group sums, in the order :func:`mismatch_sums` stacks them
SUMS = ("tokens", "k1", "k2", "k3", "r2", "abs", "abs_max", "truncated", "masked", "samples", "samples_truncated",
        "samples_masked")


def _group_sums(m, sm, k1, k2, k3, r2, ab, trunc, drop, s_trunc, s_drop) -> "torch.Tensor":
    import torch

    f = m.to(k1.dtype)
    sf = sm.to(k1.dtype)
    return torch.stack([f.sum(), (k1 * f).sum(), (k2 * f).sum(), (k3 * f).sum(), (r2 * f).sum(), (ab * f).sum(),
                        torch.where(m, ab, torch.zeros_like(ab)).max(), (trunc & m).to(f.dtype).sum(),
                        (drop & m).to(f.dtype).sum(), sf.sum(), (s_trunc & sm).to(f.dtype).sum(),
                        (s_drop & sm).to(f.dtype).sum()])


def mismatch_sums(trainer: "torch.Tensor", engine: "torch.Tensor", active: "torch.Tensor",
                  sample_index: "torch.Tensor", num_samples: int, staleness: "torch.Tensor | None" = None,
                  keep: "torch.Tensor | None" = None, truncated: "torch.Tensor | None" = None) -> dict[str, float]:
    """The sums of one micro-batch, under the loss-metric convention of
    :mod:`rlweave.interfaces.backend` (summed over micro-batches and ranks; ``*_max`` by max):
    per group (``all`` and each staleness present) the counts and sums of :data:`SUMS`, and the
    non-empty histogram bins of ``|d|``. ``active``: the trained tokens; ``keep`` and
    ``truncated``: what the correction dropped and truncated (None: nothing)."""
    import torch

    if int(active.numel()) == 0 or not bool(active.any()):
        return {}
    with torch.no_grad():
        d = torch.where(active, trainer.detach() - engine.to(trainer.dtype), torch.zeros_like(trainer))
        b = d.clamp(-20.0, 20.0)
        r = torch.exp(b)
        k1, k2, k3, r2, ab = -b, 0.5 * b * b, r - 1.0 - b, r * r, d.abs()
        drop = active & ~keep if keep is not None else torch.zeros_like(active)
        trunc = active & truncated & ~drop if truncated is not None else torch.zeros_like(active)
        idx = sample_index.to(d.device)

        def any_of(flags):
            counts = torch.zeros(num_samples, dtype=d.dtype, device=d.device).index_add_(0, idx, flags.to(d.dtype))
            return counts > 0

        s_active, s_trunc, s_drop = any_of(active), any_of(trunc), any_of(drop)
        groups = {"all": (active, s_active)}
        if staleness is not None:
            age = torch.where(active, staleness.to(d.device).long().clamp(0, STALENESS[-1]), torch.zeros_like(idx))
            s_age = torch.zeros(num_samples, dtype=torch.long, device=d.device).scatter_reduce_(
                0, idx, age, reduce="amax")
            for g in STALENESS:
                groups[str(g)] = (active & (age == g), s_active & (s_age == g))
        stats = torch.stack([_group_sums(m, sm, k1, k2, k3, r2, ab, trunc, drop, s_trunc, s_drop)
                             for m, sm in groups.values()]).tolist()
        bins = ((torch.log10(ab.clamp(min=1e-30)) - LOG10_LOW) * PER_DECADE).floor().clamp(-1, BINS) + 1
        hist = torch.bincount(bins[active].long(), minlength=BINS + 2).tolist()
    out: dict[str, float] = {}
    for g, row in zip(groups, stats):
        if row[0] > 0:
            out.update({f"{ACC}{g}/{k}": float(v) for k, v in zip(SUMS, row)})
    out.update({f"{ACC}hist/{i}": float(c) for i, c in enumerate(hist) if c})
    return out


def _bin_edges(i: int) -> tuple[float, float]:
    return 10.0 ** (LOG10_LOW + (i - 1) / PER_DECADE), 10.0 ** (LOG10_LOW + i / PER_DECADE)


def hist_quantile(counts: Mapping[int, float], q: float, top: float) -> float:
    """The ``q`` quantile of ``|d|`` from the histogram ``counts`` (bin -> tokens), interpolated
    log-linearly inside its bin, at most ``top`` (the exact maximum); 0 in the bin below 1e-8."""
    n = sum(counts.values())
    if n <= 0:
        return 0.0
    target, seen = q * n, 0.0
    for i in sorted(counts):
        c = counts[i]
        if seen + c >= target and c > 0:
            if i == 0:
                return 0.0
            if i > BINS:
                return top
            lo, hi = _bin_edges(i)
            frac = min(1.0, max(0.0, (target - seen) / c))
            return min(top, lo * (hi / lo) ** frac)
        seen += c
    return top


def _means(s: Mapping[str, float], tokens_total: float | None = None) -> dict[str, float]:
    n, ns = s["tokens"], s["samples"]
    out = {"k1": s["k1"] / n, "k2": s["k2"] / n, "k3": s["k3"] / n, "chi2": s["r2"] / n - 1.0,
           "dlogp_abs_mean": s["abs"] / n, "dlogp_abs_max": s["abs_max"], "truncated_frac": s["truncated"] / n,
           "masked_frac": s["masked"] / n,
           "samples_truncated_frac": s["samples_truncated"] / ns if ns else 0.0,
           "samples_masked_frac": s["samples_masked"] / ns if ns else 0.0}
    if tokens_total:
        out["tokens_frac"] = n / tokens_total
    return out


def mismatch_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The ``mismatch/*`` metrics (module docstring) from the update metrics ``rows`` of the
    step's first pass over its batch (each sample once); ``{}`` when they hold no sums."""
    total: dict[str, float] = {}
    for row in rows:
        for k, v in row.items():
            if k.startswith(ACC):
                v = float(v)
                total[k] = (max(total[k], v) if k.endswith("_max") else total[k] + v) if k in total else v
    groups: dict[str, dict[str, float]] = {}
    hist: dict[int, float] = {}
    for k, v in total.items():
        head, _, name = k[len(ACC):].partition("/")
        if head == "hist":
            hist[int(name)] = v
        else:
            groups.setdefault(head, {})[name] = v
    every = groups.get("all")
    if not every or not every.get("tokens"):
        return {}
    out = {f"{PREFIX}{k}": v for k, v in _means(every).items()}
    out[f"{PREFIX}tokens"] = every["tokens"]
    out[f"{PREFIX}dlogp_abs_p50"] = hist_quantile(hist, 0.5, every["abs_max"])
    out[f"{PREFIX}dlogp_abs_p99"] = hist_quantile(hist, 0.99, every["abs_max"])
    for g in STALENESS:
        s = groups.get(str(g))
        if s and s.get("tokens"):
            out.update({f"{PREFIX}stale{g}/{k}": v for k, v in _means(s, every["tokens"]).items()})
    return out
