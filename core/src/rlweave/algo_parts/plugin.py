"""Built-in algorithm parts, registered through the same hooks as a third party's (entry point
``builtin-algorithm-parts`` in core's pyproject.toml). Light: records and option models only;
the tensor functions are imported by ``record.load()``."""

from __future__ import annotations

from rlweave.algo_parts import options as o
from rlweave.plugins import AdvantageRecord, CorrectionRecord, KLRecord, LossAggRecord, PolicyLossRecord, hookimpl

_ADV = "rlweave.algo_parts.advantages:"
_LOSS = "rlweave.algo_parts.policy_losses:"
_AGG = "rlweave.algo_parts.aggregation:"
_CORR = "rlweave.algo_parts.corrections:"


@hookimpl
def rlweave_advantage_estimators() -> list[AdvantageRecord]:
    return [
        AdvantageRecord("grpo", "group-normalised reward: (R - mean_g) / (std_g + eps) (GRPO)", _ADV + "grpo",
                        config_model=o.StdOptions),
        AdvantageRecord("dr_grpo", "group-centred reward, no std division (Dr.GRPO)", _ADV + "dr_grpo",
                        loss_agg="seq_mean_token_sum_norm"),
        AdvantageRecord("rloo", "leave-one-out group baseline (RLOO)", _ADV + "rloo"),
        AdvantageRecord("reinforce_pp", "batch-whitened return-to-go, token-level KL in the reward (REINFORCE++)",
                        _ADV + "reinforce_pp", config_model=o.ReinforcePPOptions),
        AdvantageRecord("reinforce_pp_baseline", "group mean baseline, then batch whitening (REINFORCE++-baseline)",
                        _ADV + "reinforce_pp_baseline", config_model=o.StdOptions),
        AdvantageRecord("remax", "reward minus the greedy response's reward (ReMax)", _ADV + "remax",
                        needs=("baseline",)),
        AdvantageRecord("gae", "generalised advantage estimation with a critic (PPO)", _ADV + "gae",
                        config_model=o.GAEOptions, needs=("values",)),
    ]


@hookimpl
def rlweave_policy_losses() -> list[PolicyLossRecord]:
    return [
        PolicyLossRecord("ppo_clip", "PPO clipped surrogate, clip-higher and dual clip", _LOSS + "ppo_clip",
                         config_model=o.PPOClipOptions),
        PolicyLossRecord("gspo", "sequence-level geometric-mean ratio, clipped per sequence (GSPO)",
                         _LOSS + "gspo", config_model=o.GSPOOptions, loss_agg="seq_mean_token_mean"),
        PolicyLossRecord("cispo", "clipped, stop-gradient IS weight times log-prob (CISPO)", _LOSS + "cispo",
                         config_model=o.CISPOOptions),
    ]


@hookimpl
def rlweave_kl_estimators() -> list[KLRecord]:
    return [
        KLRecord("k1", "logp - ref_logp (unbiased, can be negative)", "rlweave.algo_parts.kl:k1"),
        KLRecord("k2", "(ref_logp - logp)^2 / 2 (gradient of the true KL)", "rlweave.algo_parts.kl:k2"),
        KLRecord("k3", "exp(r) - r - 1, r = ref_logp - logp (unbiased, >= 0)", "rlweave.algo_parts.kl:k3"),
    ]


@hookimpl
def rlweave_loss_aggregations() -> list[LossAggRecord]:
    return [
        LossAggRecord("token_mean", "mean over every trained token of the mini-batch", _AGG + "token_mean"),
        LossAggRecord("seq_mean_token_mean", "per-sample token mean, then mean over samples",
                      _AGG + "seq_mean_token_mean"),
        LossAggRecord("seq_mean_token_sum", "per-sample token sum, then mean over samples",
                      _AGG + "seq_mean_token_sum"),
        LossAggRecord("seq_mean_token_sum_norm", "per-sample token sum over a constant length, then mean (Dr.GRPO)",
                      _AGG + "seq_mean_token_sum_norm", config_model=o.NormLenOptions),
        LossAggRecord("token_sum", "sum over every trained token", _AGG + "token_sum"),
        LossAggRecord("seq_mean", "the same as seq_mean_token_mean (its earlier name)", _AGG + "seq_mean_token_mean"),
    ]


@hookimpl
def rlweave_rollout_corrections() -> list[CorrectionRecord]:
    return [
        CorrectionRecord("none", "no correction: the algorithm's own loss", _CORR + "none"),
        CorrectionRecord("token_tis", "token-level truncated IS: min(rho_t, cap)", _CORR + "token_tis",
                         config_model=o.CapOptions),
        CorrectionRecord("seq_tis", "sequence-level truncated IS: min(prod_t rho_t, cap) on every token",
                         _CORR + "seq_tis", config_model=o.CapOptions),
        CorrectionRecord("token_mis", "token-level masked IS: rho_t, tokens outside [low, high] dropped",
                         _CORR + "token_mis", config_model=o.BandOptions),
        CorrectionRecord("seq_mis", "sequence-level masked IS: prod_t rho_t, samples outside [low, high] dropped",
                         _CORR + "seq_mis", config_model=o.BandOptions),
        CorrectionRecord("icepop", "IcePop: rho_t inside the two-sided band [0.5, 5], other tokens dropped",
                         _CORR + "icepop", config_model=o.IcePopOptions),
        CorrectionRecord("geo_mask", "samples whose geometric-mean ratio leaves [low, high] dropped",
                         _CORR + "geo_mask", config_model=o.GeoMaskOptions),
        CorrectionRecord("tis", "truncated IS per token or sequence (level), with cap and floor", _CORR + "tis",
                         config_model=o.LegacyCorrectionOptions),
        CorrectionRecord("decoupled", "decoupled PPO: weights above cap dropped, proximal policy recomputed",
                         _CORR + "decoupled", config_model=o.LegacyCorrectionOptions, needs=("proximal",)),
    ]
