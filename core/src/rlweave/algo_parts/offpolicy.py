"""Off-policy correction of the clipped policy-gradient loss (GRPO, PPO): the ``off_policy``
config section, and how a policy loss applies the rollout correction it names.

Three policies meet in an update: the *behaviour* policy that sampled the tokens (the engine's
log-probs, token field ``rollout_logprobs``: maybe older weights, another numeric stack), the
*proximal* policy the loss is anchored to, and the policy being trained. ``mode`` says where
the proximal policy comes from:

* ``decoupled`` (default): the proximal policy is the trainer's own, recomputed before the
  update (token field ``old_logprobs``) or, with one update per batch, the current policy
  detached (the same weights). The PPO ratio and clip are taken against it, and the correction
  weighs ``rho = pi_prox / pi_behav``::

      loss_t = c(rho)_t * pg_t(logp, old = pi_prox)

* ``bypass``: the engine's log-probs stand in for the old ones, and the pass that recomputes
  them is skipped. The loss's ratio ``r_t = pi_theta / pi_behav`` already carries the
  importance weight (and its clip is a trust region around the engine's policy), so the
  correction, judged on ``rho = sg(pi_theta) / pi_behav``, replaces it rather than multiplying
  it::

      loss_t = (c(rho)_t / sg(r_t)) * pg_t(logp, old = pi_behav)

  In value this is the ``decoupled`` loss at the first update of a batch (where
  ``pi_theta = pi_prox``); when the engine's log-probs equal the old ones both modes give the
  same loss and gradient, bit for bit.

``correction`` names a rollout correction (a plugin kind, :mod:`rlweave.algo_parts.corrections`:
``none``, ``token_tis``, ``seq_tis``, ``token_mis``, ``seq_mis``, ``icepop``, ``geo_mask``, the
``tis`` and ``decoupled``, a plugin's or ``module:function``), with its options in a
mapping (``correction: {name: icepop, low: 0.5, high: 5}``). ``level``, ``cap`` and ``floor``
beside it are the options of ``tis`` and ``decoupled``, as before.

Dropped tokens keep their ``token_weight``: the loss normalisation (``loss_agg``) is the one the
algorithm computed before the update, so dropping a token lowers the loss scale instead of
re-weighting the others (AReaL divides by the original mask count the same way). Only the
policy-gradient term is corrected; KL, entropy and ptx terms are left as they are.

This module is light at import (pydantic only): the configs import it; torch is imported by
the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from rlweave.algo_parts.spec import PartSpec, ResolvedPart, resolve

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.algo_parts.corrections import Correction

LEVELS = ("token", "sequence")
MODES = ("decoupled", "bypass")
#: the corrections whose options may also be given beside ``correction``
SECTION_OPTIONS = ("tis", "decoupled")
#: the metrics a corrected loss returns (max/min: only when the micro-batch has trained tokens)
METRIC_KEYS = ("offpolicy/iw_mean", "offpolicy/iw_max", "offpolicy/iw_min", "offpolicy/truncated_frac",
               "offpolicy/masked_frac", "offpolicy/logprob_gap")
KEY = "algorithm.off_policy"
KIND = "rollout_correction"


class OffPolicyConfig(BaseModel):
    """``algorithm.off_policy``: how the policy loss corrects for tokens sampled by another
    policy (the engine's, possibly older weights). Shared by GRPO and PPO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    correction: PartSpec = Field(
        PartSpec("none"), description="Rollout correction: none, token_tis, seq_tis, token_mis, seq_mis, icepop, "
        "geo_mask, tis or decoupled (their options level/cap/floor may stand beside it), a plugin's, or "
        "module:function; {name: ..., <options>} sets its options.",
    )
    mode: Literal["decoupled", "bypass"] = Field(
        "decoupled", description="Where the old policy comes from. decoupled: the trainer's log-probs (recomputed "
        "when a batch trains more than once), the correction weighs old / engine; bypass: the engine's log-probs "
        "stand in for the old ones and their forward pass is skipped.",
    )
    level: Literal["token", "sequence"] = Field(
        "token", description="tis, decoupled: one behaviour weight per token, or one per sequence (product of its "
        "token ratios).",
    )
    cap: float = Field(
        2.0, description="tis, decoupled: upper bound on the behaviour importance weight: truncated to it (tis) or "
        "tokens above it dropped (decoupled).",
    )
    floor: Optional[float] = Field(
        None, description="tis, decoupled: tokens (sequences) whose behaviour weight is below this are dropped; "
        "null: off.",
    )

    @field_validator("correction")
    @classmethod
    def _correction(cls, v: PartSpec) -> PartSpec:
        resolve(KIND, v)  # an unknown name or bad options raise here, at this key
        return v

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str, info: ValidationInfo) -> str:
        spec = info.data.get("correction")
        if v == "bypass" and spec is not None and "proximal" in resolve(KIND, spec).needs:
            raise ValueError(f"{KEY}.mode 'bypass' skips the recomputed proximal policy, which correction "
                             f"'{spec.name}' needs; use mode: decoupled, or a correction that works on the engine's "
                             "log-probs (token_mis, icepop, ...)")
        return v

    @field_validator("level", "cap", "floor")
    @classmethod
    def _beside_its_correction(cls, v: Any, info: ValidationInfo) -> Any:
        """``level``, ``cap`` and ``floor`` set to other than their defaults belong to ``tis`` and
        ``decoupled`` named alone."""
        spec = info.data.get("correction")
        # as before: set, and unused while the correction is off; at its default (a resolved config
        # written out and read back has every key) it says nothing
        if spec is None or spec.name == "none" or v == cls.model_fields[info.field_name].default:
            return v
        key = f"{KEY}.{info.field_name}"
        if spec.name not in SECTION_OPTIONS:
            raise ValueError(f"{key} is an option of corrections {' and '.join(SECTION_OPTIONS)}; give the "
                             f"options of '{spec.name}' with its name: correction: {{name: {spec.name}, ...}}")
        if spec.options:
            raise ValueError(f"{key}: the options of '{spec.name}' are given in the correction mapping; give them "
                             "in one place")
        return v

    @field_validator("cap")
    @classmethod
    def _cap_positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"{KEY}.cap must be > 0 (the largest behaviour importance weight kept), got {v}")
        return v

    @field_validator("floor")
    @classmethod
    def _floor_below_cap(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        if v is None:
            return v
        if not v > 0:
            raise ValueError(f"{KEY}.floor must be > 0 or null (off), got {v}")
        cap = info.data.get("cap")
        if cap is not None and v >= cap:
            raise ValueError(f"{KEY}.floor ({v}) must be smaller than {KEY}.cap ({cap})")
        return v

    @property
    def name(self) -> str:
        """The correction's name."""
        return self.correction.name

    @property
    def enabled(self) -> bool:
        """Whether the loss is corrected at all (``correction`` is not ``none``)."""
        return self.name != "none"

    @property
    def bypass(self) -> bool:
        """Whether the engine's log-probs stand in for the old ones (``mode: bypass``)."""
        return self.mode == "bypass"

    @property
    def part(self) -> ResolvedPart:
        """The correction resolved, with its options (for ``tis`` and ``decoupled`` named alone:
        ``level``, ``cap`` and ``floor`` of this section)."""
        spec = self.correction
        if spec.name in SECTION_OPTIONS and not spec.options:
            spec = PartSpec({"name": spec.name, "level": self.level, "cap": self.cap, "floor": self.floor})
        return resolve(KIND, spec)

    @property
    def needs_proximal(self) -> bool:
        """Whether the correction needs the proximal policy recomputed before the update."""
        return self.enabled and "proximal" in self.part.needs


@dataclass
class Applied:
    """A correction applied to one micro-batch: ``coef`` (``(T,)``, no gradient) multiplies each
    token's policy-gradient term; ``correction`` (what the correction returned) and ``prox`` (the
    proximal log-probs it judged against the engine's) feed the metrics."""

    coef: "torch.Tensor"
    correction: "Correction"
    prox: "torch.Tensor"
    metrics: dict[str, float]


def proximal_logprobs(cfg: OffPolicyConfig | None, logp: "torch.Tensor", batch: Any,
                      needs_proximal: bool = False) -> "torch.Tensor":
    """The trainer's log-probs of the policy the update starts from (no gradient): token field
    ``old_logprobs`` in ``decoupled`` mode when the batch has it, else ``logp`` detached (one
    update per batch, or ``bypass``). Raises ValueError when ``needs_proximal`` and the batch
    lacks it."""
    tok = batch.token
    if (cfg is None or not cfg.bypass) and "old_logprobs" in tok:
        return tok["old_logprobs"].to(logp.device, logp.dtype)
    if needs_proximal:
        raise ValueError(f"{KEY}.correction is {cfg.name!r}, which needs the proximal policy's log-probs "
                         "recomputed before the update: the batch lacks token field 'old_logprobs'")
    return logp.detach()


def apply_correction(cfg: OffPolicyConfig, part: ResolvedPart, logp: "torch.Tensor", batch: Any,
                     ratio: "torch.Tensor | None" = None) -> Applied:
    """Run the correction ``part`` (``cfg``'s, resolved) on one micro-batch of a policy loss.

    Reads token fields ``token_weight`` (tokens with weight > 0 are the trained ones),
    ``rollout_logprobs`` (behaviour) and, in ``decoupled`` mode, ``old_logprobs`` (proximal;
    ``logp`` detached when absent, unless the correction needs it). In ``bypass`` mode ``ratio``
    (the importance ratio the policy loss used, its ``info["ratio"]``) is divided out. Raises
    ValueError naming the setting and what is missing."""
    import torch

    tok = batch.token
    if "rollout_logprobs" not in tok:
        raise ValueError(f"{KEY}.correction is {cfg.name!r}, which needs the engine's log-probs: the batch "
                         "lacks token field 'rollout_logprobs'")
    prox = proximal_logprobs(cfg, logp, batch, "proximal" in part.needs)
    behav = tok["rollout_logprobs"].to(logp.device, logp.dtype)
    weight = tok["token_weight"].to(logp.device, logp.dtype)
    active = weight > 0
    log_ratio = torch.where(active, prox - behav, torch.zeros_like(prox))
    corr = part.load()(log_ratio, active=active, sample_index=batch.sample_index().to(logp.device),
                       num_samples=len(batch), **part.options)
    coef = corr.coef
    if cfg.bypass:
        if ratio is None:
            raise ValueError(f"{KEY}.mode 'bypass' needs the policy loss's importance ratio (its info['ratio'])")
        r = ratio.detach().to(coef.dtype)
        coef = torch.where(r > 0, coef / torch.where(r > 0, r, torch.ones_like(r)), torch.zeros_like(coef))
    return Applied(coef.detach(), corr, prox, correction_metrics(corr, weight, prox, behav))


def correction_metrics(corr: "Correction", weight: "torch.Tensor", prox: "torch.Tensor",
                       behav: "torch.Tensor") -> dict[str, float]:
    """``offpolicy/*`` metrics of one micro-batch under the loss-metric convention of
    :mod:`rlweave.interfaces.backend`: ``iw_mean``, ``masked_frac``, ``truncated_frac`` and
    ``logprob_gap`` (``|log pi_prox - log pi_behav|``) are ``weight``-weighted sums (the
    backend's sums over micro-batches and ranks are means under the algorithm's loss
    aggregation); ``iw_max`` and ``iw_min`` (the weights the correction judged, before truncation
    or dropping, over the tokens with ``weight > 0``; left out when there are none) are reduced
    by max and min."""
    import torch

    w = weight.detach()
    active = w > 0
    iw = torch.exp(corr.log_iw)
    out = {
        "offpolicy/iw_mean": float((w * iw).sum()),
        "offpolicy/masked_frac": float((w * (~corr.keep).to(w.dtype)).sum()),
        "offpolicy/truncated_frac": float((w * (corr.truncated & corr.keep).to(w.dtype)).sum()),
        "offpolicy/logprob_gap": float((w * (prox.detach() - behav).abs()).sum()),
    }
    if bool(active.any()):
        out["offpolicy/iw_max"] = float(iw[active].max())
        out["offpolicy/iw_min"] = float(iw[active].min())
    return out


def policy_correction(cfg: OffPolicyConfig | None, logp: "torch.Tensor", batch: Any,
                      ratio: "torch.Tensor | None" = None) -> tuple["torch.Tensor | None", dict[str, float]]:
    """``(coef, metrics)`` of :func:`apply_correction` for ``cfg``'s correction, or ``(None, {})``
    when ``cfg`` is None or ``correction: none`` (the loss stays exactly as it was)."""
    if cfg is None or not cfg.enabled:
        return None, {}
    applied = apply_correction(cfg, cfg.part, logp, batch, ratio)
    return applied.coef, applied.metrics


def step_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The ``offpolicy/*`` metrics of a step from its updates' metrics (``rows``, one per
    ``train`` call): the mean over updates of each mean metric, the max of ``iw_max`` and the
    min of ``iw_min``; keys no row has are left out."""
    rows = list(rows)
    out: dict[str, float] = {}
    for key in METRIC_KEYS:
        vals = [float(r[key]) for r in rows if key in r]
        if not vals:
            continue
        if key.endswith("_max"):
            out[key] = max(vals)
        elif key.endswith("_min"):
            out[key] = min(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out
