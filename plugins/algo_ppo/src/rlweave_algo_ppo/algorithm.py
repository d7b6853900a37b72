"""PPO for RLHF (Ouyang et al. 2022; Ziegler et al. 2019): the classic four-model pipeline.

The policy samples responses; learned reward model(s) (and optional rule rewards) score
each whole response; the reward is paid at the last response token, and every response
token pays a KL penalty to the frozen reference (``algorithm.kl``: fixed or adaptive
coefficient); a critic estimates per-token values, GAE turns rewards and values into
advantages; then several epochs of clipped-surrogate updates for the policy and clipped value
regression for the critic. Dataflow of one step (each arrow is a call on a role handle)::

    rollout.generate -> [reward*.scores, reference.logprobs, critic.values, policy.logprobs]
      (issued together, so they overlap on separate devices)  -> KL penalty -> GAE
      -> for each epoch, mini-batch: policy.train + critic.train -> sync(policy -> rollout)

The old log-probs are recomputed by the policy, so they are the proximal policy of an
off-policy correction (``algorithm.off_policy``, :mod:`rlweave.algo_parts.offpolicy`); with
``off_policy.mode: bypass`` that pass is skipped and the engine's log-probs stand in for them (the
KL in the reward, the ratio and its clip, the reference where there is none).

The step around this dataflow (rollout and run mode, reward sources, waiting with the engine
fed, mini-batches, residency of colocated roles, sync, evaluation, checkpoint state) is the
shared toolkit (:mod:`rlweave.algo_helpers.experience`). In the overlapping run modes the reward
models, the reference, the critic and the old log-probs score the batch when it is trained, so
only the engine's log-probs are off-policy; the weights are synced after every step (critic
warm-up steps too, so versions count steps).

Why this shape: the controller holds the whole batch, so global statistics (advantage
whitening, reward normalisation) are computed once here before anything is scattered,
and the losses stay small per-token functions (``loss.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from rlweave.algo_helpers.experience import ExperienceKit
from rlweave.algo_helpers.kit_algorithm import KitAlgorithm
from rlweave.algo_helpers.step_metrics import logprob_gap, sample_metrics, update_metrics
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.stats import masked_moments, masked_whiten
from rlweave.data.batch import Batch
from rlweave_algo_ppo.config import PPOConfig, ppo_roles
from rlweave_algo_ppo.loss import ValueLoss
from rlweave_algo_ppo.normalize import RunningMoments, explained_variance, normalize_scores
from rlweave_algo_ppo.ptx import PtxMix

#: roles each phase of a PPO step needs resident (see :mod:`rlweave.residency`); between steps
#: (``rest``) the trained roles stay resident for checkpoints and the next step starts generating
PHASES = {
    "generate": ("rollout",),
    "experience": ("policy", "reference", "critic", "reward*"),
    "train": ("policy", "critic"),
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    "rest": ("policy", "critic", "rollout"),
}

#: the critic's update metrics: (key, name in the step's row)
CRITIC_KEYS = ("value_loss", "value_clipfrac", ("grad_norm", "critic/grad_norm"), ("lr", "critic/lr"))


class PPO(KitAlgorithm):
    """PPO with critic, reward model(s) and reference; see the module docstring."""

    def __init__(self, config: Any, ctx):
        if not isinstance(config, PPOConfig):
            config = PPOConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        c = self.config
        self.require_roles(ppo_roles(c), "ppo")
        self.use_policy_parts()
        self.reward_moments = RunningMoments()
        self.kit = ExperienceKit(ctx, c, PHASES, ppo_roles(c), "ppo")
        self.ptx: PtxMix | None = None
        self._ptx_state: dict[str, Any] | None = None

    def setup(self) -> None:
        """First weight sync (the policy may come from a checkpoint); ptx data if asked."""
        self.kit.setup()
        if self.config.ptx_coef > 0:
            self.ptx = PtxMix(self.config, self.ctx.tokenizer, self.ctx.seed, self._ptx_state)

    # ---------------------------------------------------------------------- step
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """generate -> experience (old log-probs, reference, values, scores) -> rewards and
        GAE -> policy and critic updates -> weight sync; see the module docstring."""
        c, kit, roles = self.config, self.kit, self.ctx.roles
        kit.begin_step()
        batch = kit.generate(records)
        calls = {}
        if c.uses_reference:
            calls["reference"] = lambda: roles["reference"].logprobs(batch, temperature=c.temperature)
        calls["values"] = lambda: roles["critic"].values(batch)
        if not c.off_policy.bypass:  # bypass: the engine's log-probs stand in for the old ones
            calls["old_logprobs"] = lambda: roles["policy"].logprobs(batch, temperature=c.temperature,
                                                                     with_entropy=True)
        exp = kit.experience(batch, calls)
        res, mask = exp.results, batch.token["loss_mask"]
        if "old_logprobs" in res:
            batch.add_token("old_logprobs", res["old_logprobs"]["logprobs"].float() * mask)
        old = batch.token["old_logprobs"] if "old_logprobs" in res else batch.token["rollout_logprobs"] * mask
        ref = res["reference"]["logprobs"].float() * mask if c.uses_reference else old
        batch.add_token("ref_logprobs", ref)
        batch.add_token("old_values", res["values"].float() * mask)
        metrics: dict[str, float] = {}
        adv, score = self._advantages(batch, exp.scores, metrics)
        train_policy = self.kit.steps_done >= c.critic_warmup_steps
        rows = self._update(batch, train_policy)
        self.kl.update()
        metrics.update(kit.finish(batch))
        metrics.update(sample_metrics(batch, exp.scores))
        on = mask > 0
        metrics.update({
            "reward/normalized_mean": float(score.mean()),
            "adv/min": float(adv[on].min()) if on.any() else 0.0,
            "adv/max": float(adv[on].max()) if on.any() else 0.0,
            "returns/mean": masked_moments(batch.token["returns"], mask)[0],
            "values/mean": masked_moments(batch.token["old_values"], mask)[0],
            "explained_variance": explained_variance(batch.token["old_values"], batch.token["returns"], mask),
        })
        metrics.update(update_metrics(rows.get("policy", [])))
        metrics.update(update_metrics(rows["critic"], CRITIC_KEYS, prefix="critic/"))
        metrics.update(logprob_gap(batch, rows.get("policy", [])))
        metrics.update(kit.mismatch(rows.get("policy", [])))
        if "entropy" in res.get("old_logprobs", {}):  # of the policy that sampled, before the update
            metrics["entropy"] = masked_moments(res["old_logprobs"]["entropy"].float(), mask)[0]
        return metrics

    def _advantages(self, batch: Batch, raw_score: torch.Tensor,
                    metrics: dict[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised/clipped sequence score at the last token, the KL penalty on every token,
        GAE advantages (whitened if asked) and returns, added to ``batch``; returns the
        advantages and the normalised scores (``adv/mean``, ``adv/std``: before whitening)."""
        c = self.config
        mask = batch.token["loss_mask"]
        score = normalize_scores(raw_score, c.reward_norm, self.reward_moments, c.reward_clip,
                                 groups=batch.sample["group"])
        old = "rollout_logprobs" if c.off_policy.bypass else "old_logprobs"
        adv, ret = self.advantage.load()(
            scores=score, groups=batch.sample["group"], mask=mask, cu_seqlens=batch.cu_seqlens,
            token_rewards=self.kl.reward(batch, metrics, old), values=batch.token["old_values"], baseline=None,
            **self.advantage.options)
        if ret is None:
            raise ValueError(f"ppo: advantage estimator '{self.advantage.name}' returned no returns for the critic")
        metrics["adv/mean"], metrics["adv/std"] = masked_moments(adv, mask)
        if c.normalize_advantages:
            adv = masked_whiten(adv, mask)  # global statistics over the whole batch (see normalize.py)
        batch.add_token("advantages", adv)
        batch.add_token("returns", ret)
        return adv, score

    def _update(self, batch: Batch, train_policy: bool) -> dict[str, list[dict[str, float]]]:
        """The policy's (with ptx records when asked; none during critic warm-up) and the critic's
        updates over ``ppo_epochs`` x ``mini_batches``; each role's update metrics."""
        c = self.config
        policy_loss = PolicyObjective(self.policy_loss, entropy_coef=c.entropy_coef, ptx_coef=c.ptx_coef,
                                      temperature=c.temperature,
                                      off_policy=c.off_policy if c.off_policy.enabled or c.off_policy.bypass else None,
                                      **self.kl.loss_terms())
        mbs = self.kit.mini_batches(batch, epochs=c.ppo_epochs, parts=c.mini_batches, shuffle=c.shuffle_mini_batches,
                                    loss_agg=self.loss_agg, max_len=c.max_new_tokens)
        plan = [("critic", mbs, ValueLoss(c.value_clip))]
        if train_policy:
            plan.insert(0, ("policy", [self.ptx.add_to(mb) for mb in mbs] if self.ptx else mbs, policy_loss))
        return self.kit.train(plan)

    # ------------------------------------------------------------------ checkpoint
    def own_state(self) -> dict[str, Any]:
        return {"kl": self.kl.state_dict(), "reward_moments": self.reward_moments.state_dict(),
                "ptx": self.ptx.state_dict() if self.ptx is not None else None}

    def load_own_state(self, state: dict[str, Any]) -> None:
        if state.get("kl"):
            self.kl.load_state_dict(state["kl"])
        if state.get("reward_moments"):
            self.reward_moments.load_state_dict(state["reward_moments"])
        self._ptx_state = state.get("ptx")
        if self.ptx is not None and self._ptx_state:
            self.ptx.records.load_state_dict(self._ptx_state)
