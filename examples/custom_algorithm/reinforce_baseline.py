"""REINFORCE with a moving-average reward baseline: a local algorithm, no plugin, no packaging.

Each step samples ``n_samples`` responses per prompt, scores them with the configured rewards and
raises the log-probability of every response token in proportion to (reward - baseline), where the
baseline is an exponential moving average of earlier steps' mean rewards (the first step uses its
own mean). One policy update per step, then the rollout engine gets the new weights.

Select it with ``algorithm: {name: reinforce_baseline:ReinforceBaseline}``: the module is found in
the config file's folder, the current directory or on PYTHONPATH (docs/custom_algorithm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field
from rlweave.algo_helpers.evaluate import exact_match, reward_fields
from rlweave.algo_helpers.rollout import record_prompt
from rlweave.algo_helpers.rollout import encode_prompts, generations_to_batch, sampling_params
from rlweave.algo_helpers.sampling import SamplingConfig
from rlweave.algo_helpers.weights import token_weights
from rlweave.interfaces.algorithm import Algorithm


class ReinforceConfig(SamplingConfig):
    """The keys beside ``algorithm.name`` (plus the sampling keys: temperature, max_new_tokens...)."""

    n_samples: int = Field(4, ge=1, description="Responses sampled per prompt.")
    baseline_decay: float = Field(0.9, ge=0, lt=1, description="Moving-average decay of the reward baseline.")
    eval_max_new_tokens: int = Field(8, ge=1, description="Longest held-out answer.")


@dataclass
class ReinforceLoss:
    """``-sum(token_weight * advantage * logp)``; travels to the policy's ranks (picklable)."""

    temperature: float = 1.0
    needs_entropy: bool = False

    def __call__(self, outputs, batch):
        logp = outputs.logprobs
        weighted = batch.token["token_weight"].to(logp.dtype) * batch.token["advantages"].to(logp.dtype)
        loss = -(weighted * logp).sum()
        return loss, {"pg_loss": float(loss.detach())}


class ReinforceBaseline(Algorithm):
    """REINFORCE with a moving-average reward baseline (one update per step)."""

    config_model = ReinforceConfig

    @classmethod
    def required_roles(cls, config):
        return ("policy", "rollout")

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        if ctx.rewards is None:
            raise ValueError("reinforce_baseline needs at least one entry under 'rewards'")
        self.baseline: float | None = None
        self.steps_done = 0

    def setup(self):
        self.ctx.weight_sync.sync("policy", "rollout")  # sample from the policy's (restored) weights

    def step(self, records):
        c, tok, roles = self.config, self.ctx.tokenizer, self.ctx.roles
        texts = [record_prompt(r, tok) for r in records]
        prompt_ids = encode_prompts(tok, texts)
        params = sampling_params(c, tok, seed=self.ctx.seed * 100_003 + self.steps_done)
        gens = roles["rollout"].generate(prompt_ids, params).result()
        meta = [{"prompt": t, **reward_fields(r)} for t, r in zip(texts, records)]
        batch = generations_to_batch(prompt_ids, gens, [str(r.get("id", i)) for i, r in enumerate(records)], meta)
        samples = [{**{k: v for k, v in m.items() if k not in ("response_ids", "finish_reason")},
                    "response": tok.decode(m["response_ids"], skip_special_tokens=True)} for m in batch.meta]
        rewards = torch.tensor(self.ctx.rewards.score(samples)[0], dtype=torch.float32)
        baseline = float(rewards.mean()) if self.baseline is None else self.baseline
        batch.add_token("advantages", (rewards - baseline)[batch.sample_index()] * batch.token["loss_mask"])
        batch.add_token("token_weight", token_weights(batch, "token_mean"))
        update = roles["policy"].train(batch, ReinforceLoss(temperature=c.temperature)).result()
        self.ctx.weight_sync.sync("policy", "rollout")
        self.baseline = c.baseline_decay * baseline + (1 - c.baseline_decay) * float(rewards.mean())
        self.steps_done += 1
        return {"reward/mean": float(rewards.mean()), "baseline": baseline, "loss": update["loss"],
                "grad_norm": update["grad_norm"], "response_len/mean": float(batch.sample["response_len"].float().mean())}

    def evaluate(self, records):
        return exact_match(self.ctx.roles["rollout"], self.ctx.tokenizer, records, self.ctx.rewards,
                           max_new_tokens=self.config.eval_max_new_tokens, seed=self.ctx.seed)

    def state_dict(self):
        return {"baseline": self.baseline, "steps_done": self.steps_done}

    def load_state_dict(self, state):
        self.baseline, self.steps_done = state.get("baseline"), int(state.get("steps_done", 0))
