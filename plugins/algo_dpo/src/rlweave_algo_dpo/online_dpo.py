"""OnlineDPO: DPO on pairs the current policy samples and a reward ranks (Guo et al., 2024).

Each step, for each prompt: the rollout role samples ``n_samples`` (k >= 2) answers; the
configured rewards score them (rule functions through ``ctx.rewards``, or a ``reward``
model role's ``scores``); the best and the worst answer become a (chosen, rejected) pair
(:mod:`rlweave_algo_dpo.selection`: strictly different rewards only; prompts whose answers
all tie are counted in ``tied_prompts`` and give no pair). A ``reference`` role scores the
pairs, the policy takes the DPO update, and the new weights are synced into the rollout
role so the next step samples from the updated policy. With multi-turn episodes a pair is two
episodes of one prompt, their model tokens trained; an agent's extra samples (resets, forks) are
not paired (:func:`rlweave_algo_dpo.pairs.record_candidates`). The step around this dataflow (rollout,
reward sources, residency, sync, evaluation, checkpoint state) is the shared toolkit
(:mod:`rlweave.algo_helpers.experience`), so samples are seeded as every RL algorithm's are.
"""

from __future__ import annotations

import time
from typing import Any

from rlweave.algo_helpers.experience import ExperienceKit
from rlweave.algo_helpers.kit_algorithm import KitAlgorithm
from rlweave.algo_helpers.step_metrics import sample_metrics
from rlweave.interfaces.algorithm import RunContext
from rlweave_algo_dpo.config import OnlineDPOConfig, online_dpo_roles
from rlweave_algo_dpo.pairs import record_candidates, select_pair_batch
from rlweave_algo_dpo.selection import select_pairs
from rlweave_algo_dpo.update import make_loss, preference_update, role_seq_logps


#: roles each phase of a step needs resident (see :mod:`rlweave.residency`)
PHASES = {
    "generate": ("rollout",),
    "experience": ("reward*",),
    "reference": ("reference",),
    "train": ("policy",),
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    "rest": ("policy", "rollout"),
}


class OnlineDPO(KitAlgorithm):
    """Online DPO (see module docstring)."""

    @classmethod
    def optimizer_steps_per_step(cls, config: Any, role: str) -> int:
        """The policy's ``epochs x mini_batches`` optimizer steps per run step."""
        return int(config.epochs) * int(config.mini_batches)

    def __init__(self, config: Any, ctx: RunContext):
        cfg = config if isinstance(config, OnlineDPOConfig) else OnlineDPOConfig.model_validate(
            config if isinstance(config, dict) else config.model_dump())
        super().__init__(cfg, ctx)
        self.loss_fn = make_loss(cfg)
        self.tied_total = 0
        self.kit = ExperienceKit(ctx, cfg, PHASES, online_dpo_roles(cfg), "online_dpo")

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c, kit = self.config, self.kit
        kit.begin_step()
        samples = kit.generate(records)
        members, usable = record_candidates(samples, len(records))
        usable = [[u and samples.meta[j]["finish_reason"] != "error" for u, j in zip(us, m)]
                  for us, m in zip(usable, members)]
        scores = kit.experience(samples, {}).scores
        flat = scores.tolist()
        rewards = [[flat[j] for j in m] for m in members]
        sel = select_pairs(rewards, usable, c.min_reward_gap)
        self.tied_total += len(sel.tied) + len(sel.too_few)
        metrics = {"pairs": float(len(sel.pairs)), "tied_prompts": float(len(sel.tied)),
                   "too_few_samples": float(len(sel.too_few)), "tied_prompts_total": float(self.tied_total),
                   "skipped_update": 0.0 if sel.pairs else 1.0, **sample_metrics(samples, scores)}
        if sel.pairs:
            metrics["reward/chosen"] = sum(rewards[i][b] for i, b, _ in sel.pairs) / len(sel.pairs)
            metrics["reward/rejected"] = sum(rewards[i][w] for i, _, w in sel.pairs) / len(sel.pairs)
            batch = select_pair_batch(samples, [(members[i][b], members[i][w]) for i, b, w in sel.pairs],
                                      [str(records[i].get("id", i)) for i, _, _ in sel.pairs])
            kit.enter("reference")
            t0 = time.perf_counter()
            batch.add_sample("ref_logp", role_seq_logps(self.ctx.roles["reference"], batch, c.average_logprobs))
            kit.add_time("reference", time.perf_counter() - t0)
            kit.enter("train")
            update = preference_update(c, self.loss_fn, self.ctx.roles["policy"], batch, self.ctx.config)
            kit.add_time("train", update.pop("time/train"))
            metrics.update(update)
        return {**metrics, **kit.finish(samples, updated=bool(sel.pairs))}

    def own_state(self) -> dict[str, Any]:
        return {"tied_total": self.tied_total}

    def load_own_state(self, state: dict[str, Any]) -> None:
        self.tied_total = int(state.get("tied_total", 0))
