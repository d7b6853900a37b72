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


from rlweave.algo_helpers.evaluate import record_prompt, reward_fields
from rlweave.algo_helpers.rollout import encode_prompts, sampling_params
from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm, RunContext
from rlweave.residency import Residency
from rlweave_algo_dpo.config import OnlineDPOConfig
from rlweave_algo_dpo.evaluation import evaluate_records
from rlweave_algo_dpo.pairs import build_pair_batch
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

    def _score(self, texts: list[str], prompt_ids: list[list[int]], gens: list[list[Any]],
               records: list[dict[str, Any]]) -> list[list[float]]:
        tok = self.ctx.tokenizer
        if self.config.reward_source == "model":
            seqs = [list(p) + list(g.token_ids) for p, gl in zip(prompt_ids, gens) for g in gl]
            plens = [len(p) for p, gl in zip(prompt_ids, gens) for _ in gl]
            seqs = [s if len(s) > pl else s + [tok.eos_token_id] for s, pl in zip(seqs, plens)]
            flat = [float(x) for x in result(self.ctx.roles["reward"].scores(
                Batch.from_sequences(seqs, prompt_lens=plens))).tolist()]
        else:
            if self.ctx.rewards is None:
                raise ValueError("online_dpo with reward_source 'rules' needs rewards: [{name: ...}] in the config")
            samples = [{"prompt": t, "response": tok.decode(g.token_ids, skip_special_tokens=True), **reward_fields(r)}
                       for t, gl, r in zip(texts, gens, records) for g in gl]
            flat = [float(x) for x in self.ctx.rewards.score(samples)[0]]
        k = self.config.n_samples
        return [flat[i * k:(i + 1) * k] for i in range(len(gens))]

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c, tok = self.config, self.ctx.tokenizer
        metrics: dict[str, float] = {}
        if not self._rollout_fresh:
            metrics.update(self._sync())
        t0 = time.perf_counter()
        texts = [record_prompt(r, tok) for r in records]
        prompt_ids = encode_prompts(tok, texts)
        params = sampling_params(c, tok, seed=self.ctx.seed + self.steps)
        t_off = self.residency.enter("generate")
        gens = result(self.ctx.roles["rollout"].generate(prompt_ids, params))
        if len(gens) != len(records) or any(len(g) != c.n_samples for g in gens):
            raise RuntimeError(f"rollout returned {[len(g) for g in gens]} generations for {len(records)} prompts "
                               f"x {c.n_samples} samples")
        t1 = time.perf_counter()
        if c.reward_source == "model":
            t_off += self.residency.enter("score")
        rewards = self._score(texts, prompt_ids, gens, records)
        t2 = time.perf_counter()
        usable = [[len(g.token_ids) > 0 and g.finish_reason != "error" for g in gl] for gl in gens]
        sel = select_pairs(rewards, usable, c.min_reward_gap)
        flat = [x for rs in rewards for x in rs]
        self.tied_total += len(sel.tied) + len(sel.too_few)
        metrics.update({
            "reward/mean": statistics.fmean(flat),
            "reward/std": statistics.pstdev(flat),
            "response_len/mean": statistics.fmean(len(g.token_ids) for gl in gens for g in gl),
            "pairs": float(len(sel.pairs)),
            "tied_prompts": float(len(sel.tied)),
            "too_few_samples": float(len(sel.too_few)),
            "tied_prompts_total": float(self.tied_total),
            "time/generate": t1 - t0,
            "time/reward": t2 - t1,
        })
        self.steps += 1
        if not sel.pairs:
            metrics["skipped_update"] = 1.0
            metrics["time/offload"] = t_off + self.residency.enter("rest")
            return metrics
        metrics["skipped_update"] = 0.0
        metrics["reward/chosen"] = statistics.fmean(rewards[i][b] for i, b, _ in sel.pairs)
        metrics["reward/rejected"] = statistics.fmean(rewards[i][w] for i, _, w in sel.pairs)
        batch = build_pair_batch(
            [prompt_ids[i] for i, _, _ in sel.pairs],
            [gens[i][b].token_ids for i, b, _ in sel.pairs],
            [gens[i][w].token_ids for i, _, w in sel.pairs],
            [str(records[i].get("id", i)) for i, _, _ in sel.pairs],
        )
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
                                     temperature=self.config.temperature)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "tied_total": self.tied_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        self.tied_total = int(state.get("tied_total", 0))
        self._rollout_fresh = False
