"""GRPO and the critic-free family (Dr.GRPO, RLOO, REINFORCE++, ReMax, GSPO, CISPO...):
sample a group of responses per prompt, score them, and push the policy towards the responses
that beat their baseline.

The math is not here: the advantage estimator, the policy loss, the loss aggregation and the
KL estimator are named parts (:mod:`rlweave.algo_parts`) chosen in the config; the step around
them (rollout and run mode, reward sources, passes, mini-batches, sync, evaluation, checkpoint
state) is the shared toolkit (:mod:`rlweave.algo_helpers.experience`). This class states GRPO's
dataflow::

    rollout.generate(n per prompt) [+ one greedy response per prompt: ReMax's baseline]
      -> [reference.logprobs (KL), policy.logprobs (old: several updates)] issued with every
         reward source (rules, reward models, environment), so they run while the rules score
      -> [dynamic sampling: regenerate until groups disagree] -> overlong shaping -> KL in reward
      -> advantage estimator -> policy.train per mini-batch -> sync(policy -> rollout)

Old log-probs are recomputed only when the batch is used for more than one optimizer step
(``ppo_epochs > 1`` or ``mini_batches > 1``), the KL goes into the reward, the rollout
correction needs a proximal policy, or router replay r2 records its routing; with one update the
"old" policy is the current one (ratio 1), which saves a full forward pass. With
``off_policy.mode: bypass`` they are never recomputed: the engine's log-probs stand in for them
(:mod:`rlweave.algo_parts.offpolicy`; router replay r2 is refused with it).

MoE router replay (``router_replay``, docs/moe.md): the batch's ``routing`` token field is what the
policy's passes replay. With ``r3`` the engine fills it at generation; with ``r2`` the old-log-prob
pass records it. The reference model routes by itself (it gets the batch without the field).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from rlweave.algo_helpers.experience import ExperienceKit
from rlweave.algo_helpers.kit_algorithm import KitAlgorithm
from rlweave.algo_helpers.step_metrics import logprob_gap, sample_metrics, update_metrics
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.data.batch import Batch
from rlweave_algo_grpo.config import GRPOConfig, grpo_roles
from rlweave_algo_grpo.dynamic_sampling import sample_groups
from rlweave_algo_grpo.shaping import overlong_penalty

#: roles each phase of a GRPO step needs resident (see :mod:`rlweave.residency`); roles that
#: share devices take turns, others stay put
PHASES = {
    "generate": ("rollout",),
    "experience": ("policy", "reference", "reward*"),
    "train": ("policy",),
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    "rest": ("policy", "rollout"),
}


class GRPO(KitAlgorithm):
    """Group-based policy optimisation with named parts (see the module docstring and config)."""

    def __init__(self, config: Any, ctx):
        if not isinstance(config, GRPOConfig):
            config = GRPOConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        c = self.config
        self.require_roles(grpo_roles(c), "grpo")
        self.use_policy_parts()
        self.kit = ExperienceKit(ctx, c, PHASES, ("policy", "reference", "rollout")
                                 + tuple(e.role for e in c.reward_models), "grpo")

    def _need_old(self) -> bool:
        """Old log-probs are needed with several updates per batch, when the KL goes into
        the reward (it needs the policy's log-probs before the update), or when the rollout
        correction needs its proximal policy (decoupled PPO); never in ``bypass`` mode, where the
        engine's log-probs stand in for them."""
        c = self.config
        if c.off_policy.bypass:
            return False
        return (c.ppo_epochs > 1 or c.mini_batches > 1 or self.kl.in_reward or c.off_policy.needs_proximal
                or c.router_replay == "r2")

    def _passes(self, batch: Batch) -> dict[str, Any]:
        """The reference and old log-prob calls ``batch`` needs, by name."""
        c, roles = self.config, self.ctx.roles
        calls = {}
        if c.kl.enabled:
            own = batch.shallow_copy()
            own.token.pop("routing", None)  # the reference routes by itself
            calls["reference"] = lambda: roles["reference"].logprobs(own, temperature=c.temperature)
        if self._need_old():
            calls["old_logprobs"] = lambda: roles["policy"].logprobs(batch, temperature=c.temperature,
                                                                     with_routing=c.router_replay == "r2")
        return calls

    def _greedy(self, records: list[dict[str, Any]]) -> Batch:
        """ReMax: one greedy response per prompt, generated while the engine is resident."""
        t0 = time.perf_counter()
        sampling = dataclasses.replace(self.kit.sampling(), n=1, temperature=0.0)
        greedy = self.kit.run_rollout(records, 1, sampling, "baseline")
        self.kit.add_time("baseline", time.perf_counter() - t0)
        return greedy

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Generate and score groups, then (unless every group agreed) log-probs, advantages,
        updates and the weight sync; see the module docstring."""
        c, kit = self.config, self.kit
        kit.begin_step()
        metrics: dict[str, float] = {}
        greedy = None
        if c.dynamic_sampling:
            batch, scores, stats = sample_groups(kit, records, c.max_resample)
            metrics.update(stats)
            results = kit.experience(batch, self._passes(batch), score=False).results if len(batch) else {}
        else:
            batch = kit.generate(records)
            greedy = self._greedy(records) if "baseline" in self.advantage.needs else None
            exp = kit.experience(batch, self._passes(batch)) if len(batch) else None
            scores, results = (exp.scores, exp.results) if exp else (torch.zeros(0), {})
        if len(batch) == 0:  # every group agreed, or the data ran out: nothing to learn from this step
            return {**metrics, "skipped": 1.0, **kit.finish(batch, updated=False)}
        if greedy is not None:
            t0 = time.perf_counter()
            base, _ = kit.score(greedy, record=False)
            kit.add_time("baseline", time.perf_counter() - t0)
            metrics["reward/greedy_mean"] = float(base.mean()) if len(base) else 0.0
            batch.add_sample("baseline", base[batch.sample["group"]])
        for key, name in (("ref_logprobs", "reference"), ("old_logprobs", "old_logprobs")):
            if name in results:
                batch.add_token(key, results[name]["logprobs"].float())
        if c.router_replay == "r2" and "old_logprobs" in results:
            batch.add_token("routing", results["old_logprobs"]["routing"])
        rewards = scores + overlong_penalty(batch.sample["response_len"], c.max_new_tokens, c.overlong_buffer,
                                            c.overlong_penalty)
        old = "rollout_logprobs" if c.off_policy.bypass else "old_logprobs"
        adv = self._advantages(batch, rewards, self.kl.reward(batch, metrics, old))
        rows = self._update(batch)
        self.kl.update()
        metrics.update(kit.finish(batch))
        metrics.update(sample_metrics(batch, scores))
        metrics["reward/shaped_mean"] = float(rewards.mean())
        metrics.update({"adv/mean": float(adv.mean()) if len(adv) else 0.0,
                        "adv/std": float(adv.std()) if len(adv) > 1 else 0.0,
                        "adv/min": float(adv.min()) if len(adv) else 0.0,
                        "adv/max": float(adv.max()) if len(adv) else 0.0})
        metrics.update(update_metrics(rows))
        metrics.update(logprob_gap(batch, rows))
        metrics.update(kit.mismatch(rows))
        return metrics

    def _advantages(self, batch: Batch, rewards: torch.Tensor, token_rewards: torch.Tensor | None) -> torch.Tensor:
        """Per-token advantages from the configured estimator, added to the batch; returns them
        on the trained tokens (for the metrics)."""
        adv, _ = self.advantage.load()(scores=rewards, groups=batch.sample["group"], mask=batch.token["loss_mask"],
                                       cu_seqlens=batch.cu_seqlens, token_rewards=token_rewards, values=None,
                                       baseline=batch.sample.get("baseline"), **self.advantage.options)
        batch.add_token("advantages", adv.float() * batch.token["loss_mask"])
        return adv[batch.token["loss_mask"] > 0]

    def _update(self, batch: Batch) -> list[dict[str, float]]:
        """``ppo_epochs`` passes of ``mini_batches`` policy updates; returns each update's metrics."""
        c = self.config
        loss_fn = PolicyObjective(policy_loss=self.policy_loss, temperature=c.temperature,
                                  off_policy=c.off_policy, **self.kl.loss_terms())
        mbs = self.kit.mini_batches(batch, epochs=c.ppo_epochs, parts=c.mini_batches, shuffle=c.shuffle_mini_batches,
                                    loss_agg=self.loss_agg, max_len=c.max_new_tokens)
        return self.kit.train([("policy", mbs, loss_fn)])["policy"]

    # ------------------------------------------------------------------ checkpoint
    def own_state(self) -> dict[str, Any]:
        return {"kl": self.kl.state_dict()}

    def load_own_state(self, state: dict[str, Any]) -> None:
        if state.get("kl"):
            self.kl.load_state_dict(state["kl"])
