"""OnlineDPO: DPO on pairs the current policy samples and a reward ranks (Guo et al., 2024).

Each step, for each prompt: the rollout role samples ``n_samples`` (k >= 2) answers; the
configured rewards score them (rule functions through ``ctx.rewards``, or a ``reward``
model role's ``scores``); the best and the worst answer become a (chosen, rejected) pair
(:mod:`rlweave_algo_dpo.selection`: strictly different rewards only; prompts whose answers
all tie are counted in ``tied_prompts`` and give no pair). A ``reference`` role scores the
pairs, the policy takes the DPO update, and the new weights are synced into the rollout
role so the next step samples from the updated policy. Samples are reproducible: the
engine seed is ``run seed + step``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


from rlweave.algo_helpers.multi_turn import episode_metrics
from rlweave.algo_helpers.rollout import make_rollout, reward_samples, sampling_params
from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm, RunContext
from rlweave.residency import Residency
from rlweave_algo_dpo.config import OnlineDPOConfig
from rlweave_algo_dpo.evaluation import evaluate_records
from rlweave_algo_dpo.pairs import select_pair_batch
from rlweave_algo_dpo.selection import select_pairs
from rlweave_algo_dpo.update import make_loss, preference_update, result, role_seq_logps


#: roles each phase of a step needs resident (see :mod:`rlweave.residency`)
PHASES = {
    "generate": ("rollout",),
    "score": ("reward*",),
    "reference": ("reference",),
    "train": ("policy",),
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    "rest": ("policy", "rollout"),
}


class OnlineDPO(Algorithm):
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
        self.steps = 0
        self.tied_total = 0
        self._rollout_fresh = False  # rollout weights equal the policy's
        self.residency = Residency.for_run(ctx, ("policy", "reference", "rollout", "reward"), PHASES)
        #: records -> trajectories (:mod:`rlweave.interfaces.rollout`): one continuation per prompt, or
        #: multi-turn episodes through an environment (``algorithm.multi_turn``)
        self.rollout = make_rollout(cfg.multi_turn, ctx.tokenizer)

    def close(self) -> None:
        self.rollout.close()

    def _sync(self) -> dict[str, float]:
        self.residency.enter("sync")
        t0 = time.perf_counter()
        info = self.ctx.weight_sync.sync("policy", "rollout")
        self._rollout_fresh = True
        out = {"time/sync": time.perf_counter() - t0}
        if isinstance(info, dict) and "bytes" in info:
            out["sync_mb"] = float(info["bytes"]) / 2**20
        return out

    def setup(self) -> None:
        """The rollout role starts from the model path; after a resume the policy differs."""
        self._rollout_fresh = False

    def _score(self, samples: Batch) -> list[list[float]]:
        """Each sample's reward, by record: the reward model's score of the whole trajectory, or
        the rule rewards on its last model turn; plus what an environment paid."""
        tok = self.ctx.tokenizer
        if self.config.reward_source == "model":
            seqs = [s.tolist() for s in samples.sequences()]
            plens = samples.sample["prompt_len"].tolist()
            seqs = [s if len(s) > pl else s + [tok.eos_token_id] for s, pl in zip(seqs, plens)]
            flat = [float(x) for x in result(self.ctx.roles["reward"].scores(
                Batch.from_sequences(seqs, prompt_lens=plens))).tolist()]
        elif self.ctx.rewards is not None:
            flat = [float(x) for x in self.ctx.rewards.score(reward_samples(tok, samples))[0]]
        elif self.config.multi_turn is not None:  # the environment's reward alone
            flat = [0.0] * len(samples)
        else:
            raise ValueError("online_dpo with reward_source 'rules' needs rewards: [{name: ...}] in the config")
        flat = [x + float(e) for x, e in zip(flat, samples.sample["env_reward"].tolist())]
        k = self.config.n_samples
        return [flat[i * k:(i + 1) * k] for i in range(len(flat) // k)]

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c, tok = self.config, self.ctx.tokenizer
        metrics: dict[str, float] = {}
        if not self._rollout_fresh:
            metrics.update(self._sync())
        t0 = time.perf_counter()
        params = sampling_params(c, tok, seed=self.ctx.seed + self.steps)
        t_off = self.residency.enter("generate")
        engine = self.ctx.roles["rollout"]
        samples = self.rollout.run(records, c.n_samples, params, lambda p, sp: result(engine.generate(p, sp)),
                                   self.steps)
        if len(samples) != len(records) * c.n_samples:
            raise RuntimeError(f"rollout returned {len(samples)} samples for {len(records)} prompts "
                               f"x {c.n_samples} samples")
        t1 = time.perf_counter()
        if c.reward_source == "model":
            t_off += self.residency.enter("score")
        rewards = self._score(samples)
        t2 = time.perf_counter()
        k = c.n_samples
        usable = [[len(m["response_ids"]) > 0 and m["finish_reason"] != "error" for m in samples.meta[i * k:(i + 1) * k]]
                  for i in range(len(records))]
        sel = select_pairs(rewards, usable, c.min_reward_gap)
        flat = [x for rs in rewards for x in rs]
        self.tied_total += len(sel.tied) + len(sel.too_few)
        metrics.update({
            "reward/mean": statistics.fmean(flat),
            "reward/std": statistics.pstdev(flat),
            "response_len/mean": float(samples.sample["response_len"].float().mean()),
            "pairs": float(len(sel.pairs)),
            "tied_prompts": float(len(sel.tied)),
            "too_few_samples": float(len(sel.too_few)),
            "tied_prompts_total": float(self.tied_total),
            "time/generate": t1 - t0,
            "time/reward": t2 - t1,
            **episode_metrics(samples.meta),
        })
        self.steps += 1
        if not sel.pairs:
            metrics["skipped_update"] = 1.0
            metrics["time/offload"] = t_off + self.residency.enter("rest")
            return metrics
        metrics["skipped_update"] = 0.0
        metrics["reward/chosen"] = statistics.fmean(rewards[i][b] for i, b, _ in sel.pairs)
        metrics["reward/rejected"] = statistics.fmean(rewards[i][w] for i, _, w in sel.pairs)
        batch = select_pair_batch(samples, [(i * k + b, i * k + w) for i, b, w in sel.pairs],
                                  [str(records[i].get("id", i)) for i, _, _ in sel.pairs])
        t_off += self.residency.enter("reference")
        t3 = time.perf_counter()
        batch.add_sample("ref_logp", role_seq_logps(self.ctx.roles["reference"], batch, c.average_logprobs))
        metrics["time/reference"] = time.perf_counter() - t3
        t_off += self.residency.enter("train")
        metrics.update(preference_update(c, self.loss_fn, self.ctx.roles["policy"], batch, self.ctx.config))
        metrics["pairs"] = float(len(sel.pairs))
        metrics.update(self._sync())
        metrics["time/offload"] = t_off + self.residency.enter("rest")
        return metrics

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        if not self._rollout_fresh:
            self._sync()
        return self.residency.during("eval", evaluate_records, self.ctx, self.config, records,
                                     self.ctx.roles["rollout"], greedy=self.config.eval_greedy,
                                     temperature=self.config.temperature,
                                     trajectories=self.rollout if self.config.multi_turn is not None else None)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "tied_total": self.tied_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        self.tied_total = int(state.get("tied_total", 0))
        self._rollout_fresh = False
