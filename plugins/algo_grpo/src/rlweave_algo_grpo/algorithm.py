"""GRPO and the critic-free family (Dr.GRPO, RLOO, REINFORCE++, ReMax, GSPO, CISPO...):
sample a group of responses per prompt, score them, and push the policy towards the responses
that beat their baseline.

The math is not here: the advantage estimator, the policy loss, the loss aggregation and the
KL estimator are named parts (:mod:`rlweave.algo_parts`) chosen in the config; this class
runs the dataflow. One step (every arrow is a call on a role handle)::

    rollout.generate(n per prompt) [+ one greedy response per prompt: ReMax's baseline]
      -> rule rewards + reward*.scores (learned reward models) -> [dynamic sampling: regenerate]
      -> reference.logprobs (kl.beta > 0) -> policy.logprobs (only if several updates)
      -> advantage estimator -> policy.train per mini-batch -> sync_weights(policy -> rollout)

Old log-probs are recomputed only when the batch is used for more than one optimizer step
(``ppo_epochs > 1`` or ``mini_batches > 1``) or the KL goes into the reward; with one update the "old" policy is the
current one (ratio 1), which saves a full forward pass. The reference and old log-prob
passes are issued together so they overlap when the roles live on different devices, and,
unless dynamic sampling may still drop groups, before the rewards are scored: the reward
workers and the models' forward passes run at the same time.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import torch

from rlweave.algo_helpers import reward_models
from rlweave.algo_helpers.evaluate import exact_match
from rlweave.algo_helpers.minibatch import split
from rlweave.algo_helpers.multi_turn import episode_metrics
from rlweave.algo_helpers.pipeline import make_pipeline
from rlweave.algo_helpers.step_metrics import MOE_PREFIX, key_means, prefixed_means, reward_breakdown, truncated_frac
from rlweave.algo_helpers.rollout import make_rollout, reward_samples, sampling_params
from rlweave.algo_helpers.weights import token_weights
from rlweave.algo_parts.kl import kl_value
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.offpolicy import step_metrics as offpolicy_step_metrics
from rlweave.algo_parts.spec import choose_loss_agg, resolve
from rlweave.algo_parts.stats import group_std
from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm
from rlweave.interfaces.engine import SamplingParams
from rlweave.residency import Residency
from rlweave_algo_grpo.config import GRPOConfig, grpo_roles
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


#: the ``time/*`` metrics of every step (seconds; ``a/b`` is a part of ``a``): phases, and inside
#: them the controller's dispatch, its wait for the ranks, packing, decoding, the reward pool and
#: the reward models; ``time/baseline`` too with ReMax (its greedy responses, generated and scored)
STEP_TIMES = ("generate", "generate/dispatch", "generate/wait", "generate/pack", "reward",
              "reward/decode", "reward/pool", "reward/models", "reference", "old_logprobs", "train", "train/prepare",
              "train/dispatch", "train/wait", "sync", "offload")


class GRPO(Algorithm):
    """Group-based policy optimisation with named parts (see the module docstring and config)."""

    def __init__(self, config: Any, ctx):
        if not isinstance(config, GRPOConfig):
            config = GRPOConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        c = self.config
        missing = [r for r in grpo_roles(c) if r not in ctx.roles]
        if missing:
            raise ValueError(f"grpo: roles {missing} are not built (configure them under 'roles')")
        self.advantage = resolve("advantage", c.advantage)
        self.policy_loss = resolve("policy_loss", c.policy_loss)
        self.loss_agg = choose_loss_agg(c.loss_agg, self.policy_loss, self.advantage)
        self.kl_part = resolve("kl", c.kl.estimator)
        self._needs_baseline = "baseline" in self.advantage.needs
        self.steps_done = 0
        self.samples_seen = 0
        self._eval_fn = None
        self._model_metrics: dict[str, float] = {}
        self._baseline_mean: list[float] = []
        self.residency = Residency.for_run(ctx, ("policy", "reference", "rollout")
                                           + tuple(e.role for e in c.reward_models), PHASES)
        self._times: dict[str, float] = {}
        #: records -> trajectories (:mod:`rlweave.interfaces.rollout`): one continuation per prompt, or
        #: multi-turn episodes through an environment (``algorithm.multi_turn``)
        self.rollout = make_rollout(c.multi_turn, ctx.tokenizer)
        #: partial rollout and the overlapping run modes (None: plain sync steps)
        self.pipeline = make_pipeline(ctx, self.rollout, c.n_samples, c.max_new_tokens)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        self.rollout.close()

    # ------------------------------------------------------------------ helpers
    def _sampling(self, salt: int) -> SamplingParams:
        seed = int(self.ctx.seed) * 1_000_003 + self.steps_done * 101 + salt
        return sampling_params(self.config, self.ctx.tokenizer, seed, ignore_eos=self.config.ignore_eos)

    def _sync(self, version: int) -> dict[str, float]:
        """Policy -> rollout; ``version``: the number of updates the policy has made."""
        self._times["offload"] = self._times.get("offload", 0.0) + self.residency.enter("sync")
        if self.pipeline is not None:
            return self.pipeline.sync_weights(version)
        info = self.ctx.weight_sync.sync("policy", "rollout")
        return {"sync_bytes": float(info.get("bytes", 0)), "sync_seconds": float(info.get("seconds", 0.0))}

    def setup(self) -> None:
        """Make the rollout engine generate with the policy's weights (they may differ
        when the policy was restored from a checkpoint)."""
        self._sync(self.steps_done)
        self.residency.enter("rest")

    def _rollout(self, records: list[dict[str, Any]], salt: int,
                 experience: bool = False) -> tuple[Batch, torch.Tensor, list[dict], dict | None]:
        """Generate and score one group per record through :attr:`rollout`. Returns the batch, the
        rewards (rule rewards and reward models on each sample's last model turn, plus what an
        environment paid), the per-sample reward breakdowns and, with ``experience``, the
        reference and old log-prob calls (:meth:`_issue_experience`), issued before the rewards
        are scored so that they run while the reward workers score."""
        self._times["offload"] += self.residency.enter("generate")
        engine = self.ctx.roles["rollout"]
        in_engine = 0.0

        def generate(prompt_ids: list[list[int]], sampling: SamplingParams) -> list:
            nonlocal in_engine
            t = time.perf_counter()
            fut = engine.generate(prompt_ids, sampling)
            gens = fut.result()
            self._add_call_times("generate", fut)
            in_engine += time.perf_counter() - t
            return gens

        t0 = time.perf_counter()
        batch = self.rollout.run(records, self.config.n_samples, self._sampling(salt), generate, self.steps_done)
        t1 = time.perf_counter()
        self._times["generate/pack"] += max(0.0, t1 - t0 - in_engine)  # calls may overlap (engine_calls)
        greedy = None
        if self._needs_baseline:  # ReMax: one greedy response per prompt, generated while the engine is resident
            sampling = dataclasses.replace(self._sampling(salt), n=1, temperature=0.0)
            greedy = self.rollout.run(records, 1, sampling, lambda p, sp: engine.generate(p, sp).result(),
                                      self.steps_done)
            self._times["baseline"] += time.perf_counter() - t1
        self._times["generate"] += time.perf_counter() - t0
        pending = self._issue_experience(batch) if experience else None
        scores, breakdown = self._score(batch)
        if greedy is not None:
            batch.add_sample("baseline", self._baseline(greedy)[batch.sample["group"]])
        return batch, scores, breakdown, pending

    def _baseline(self, greedy: Batch) -> torch.Tensor:
        """ReMax's baseline: the reward ``(groups,)`` of each prompt's greedy response, scored by
        the same reward sources as the samples (``reward/greedy_mean``; ``time/baseline`` holds
        its generation and scoring)."""
        t0 = time.perf_counter()
        scores, _ = self._score(greedy, greedy=True)
        self._times["baseline"] += time.perf_counter() - t0
        self._baseline_mean.append(float(scores.mean()) if len(scores) else 0.0)
        return scores

    @property
    def _rules(self):
        """The rule reward set, or None when the config has no rule reward."""
        rs = self.ctx.rewards
        return rs if rs is not None and getattr(rs, "entries", True) else None

    def _score(self, batch: Batch, greedy: bool = False) -> tuple[torch.Tensor, list[dict]]:
        """Each sample's total reward (rule rewards plus the weighted reward models, see
        :mod:`rlweave.algo_helpers.reward_models`) and its per-rule breakdown (``time/reward*``;
        the models score while the rule workers do). ``greedy``: ReMax's baseline responses
        (their reward-model metrics are not recorded)."""
        c, tok = self.config, self.ctx.tokenizer
        t2 = time.perf_counter()
        if self._rules is None and not c.reward_models and c.multi_turn is None:
            raise RuntimeError("grpo needs a reward: an entry under 'rewards' or algorithm.reward_models")
        futs = {}
        if c.reward_models:
            self._times["offload"] += self.residency.enter("experience")
            futs = reward_models.issue_scores(self.ctx.roles, c.reward_models, batch,
                                              getattr(tok, "eos_token_id", None))
        totals = torch.zeros(len(batch), dtype=torch.float32)
        breakdown: list[dict] = [{} for _ in range(len(batch))]
        t3 = t4 = time.perf_counter()
        if self._rules is not None:
            samples = reward_samples(tok, batch)
            t3 = time.perf_counter()
            rule_totals, breakdown = self._rules.score(samples)
            t4 = time.perf_counter()
            totals = torch.tensor(rule_totals, dtype=torch.float32)
            breakdown = list(breakdown)
        if futs:
            model_metrics: dict[str, float] = {}
            totals = totals + reward_models.combine(c.reward_models, {k: self._wait(f) for k, f in futs.items()},
                                                    len(batch), model_metrics)
            if not greedy:
                self._model_metrics.update(model_metrics)
            self._times["reward/models"] += time.perf_counter() - t4
        if "env_reward" in batch.sample:  # what an environment paid (0 for single-turn samples)
            totals = totals + batch.sample["env_reward"].float()
        self._times["reward/decode"] += t3 - t2
        self._times["reward/pool"] += t4 - t3
        self._times["reward"] += time.perf_counter() - t2
        return totals, breakdown

    def _add_call_times(self, name: str, fut) -> None:
        """``time/<name>/dispatch`` and ``time/<name>/wait`` of a role call's future (see
        :class:`~rlweave.scheduler.future.RoleFuture`); gathering counts as dispatch."""
        self._times[f"{name}/dispatch"] = self._times.get(f"{name}/dispatch", 0.0) + fut.dispatch_s + fut.combine_s
        self._times[f"{name}/wait"] = self._times.get(f"{name}/wait", 0.0) + fut.wait_s

    def _collect(self, records: list[dict[str, Any]]) -> tuple[Batch, torch.Tensor, list[dict], dict[str, float],
                                                               dict | None]:
        """Rollout, then (dynamic sampling) keep only groups with reward variance, drawing
        more prompts (``ctx.next_records``) or resampling the same ones until the
        batch has as many groups as records or ``max_resample`` rounds are spent. Without
        dynamic sampling the batch is final once generated: its reference and old log-probs
        are issued before its rewards are scored (the last item; None with dynamic sampling)."""
        overlap = not self.config.dynamic_sampling
        batch, rewards, breakdown, pending = self._rollout(records, salt=0, experience=overlap)
        stats = {"groups_total": float(len(records))}
        if overlap:
            return batch, rewards, breakdown, stats, pending
        want = len(records)
        keep_b, keep_r, keep_d = [], [], []
        n_groups = 0
        rounds = 0
        while True:
            std = group_std(rewards, batch.sample["group"])
            good = (std > 0).nonzero().flatten().tolist()
            groups = sorted(set(batch.sample["group"][good].tolist()))
            for g in groups:
                if n_groups >= want:
                    break
                idx = (batch.sample["group"] == g).nonzero().flatten().tolist()
                sub = batch.select(idx)
                sub.sample["group"] = torch.full((len(idx),), n_groups, dtype=torch.long)
                keep_b.append(sub)
                keep_r.append(rewards[idx])
                keep_d.extend(breakdown[i] for i in idx)
                n_groups += 1
            if n_groups >= want or rounds >= self.config.max_resample:
                break
            rounds += 1
            more = self.ctx.next_records
            new_records = more() if more is not None else records
            batch, rewards, breakdown, _ = self._rollout(new_records, salt=rounds)
            stats["groups_total"] += len(new_records)
        stats.update({"groups_kept": float(n_groups), "resample_rounds": float(rounds)})
        if not keep_b:
            return batch.select([]), rewards[:0], [], stats, None
        return Batch.concat(keep_b), torch.cat(keep_r), keep_d, stats, None

    # ---------------------------------------------------------------------- step
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Generate and score groups, then (unless every group agreed) log-probs,
        advantages, updates and the weight sync; see the module docstring. With partial
        rollout or an overlapping run mode the groups come from the pipeline
        (:mod:`rlweave.algo_helpers.pipeline`)."""
        c = self.config
        self._times = {k: 0.0 for k in STEP_TIMES + (("baseline",) if self._needs_baseline else ())}
        self._model_metrics: dict[str, float] = {}
        self._baseline_mean: list[float] = []
        moves_before = len(self.residency.moves)
        if self.pipeline is not None:
            self._times["offload"] += self.residency.enter("generate")
            t0 = time.perf_counter()
            batch = self.pipeline.next_batch(records, self.steps_done, self._sampling)
            self._times["generate"] = time.perf_counter() - t0
            pending = self._issue_experience(batch) if len(batch) else None
            scores, breakdown = self._score(batch) if len(batch) else (torch.zeros(0), [])
            metrics: dict[str, float] = {}
        else:
            batch, scores, breakdown, ds_stats, pending = self._collect(records)
            metrics = dict(ds_stats) if c.dynamic_sampling else {}
        if len(batch) == 0:  # every group agreed: nothing to learn from this step
            self._times["offload"] += self.residency.enter("rest")
            self.steps_done += 1
            metrics.update({"skipped": 1.0, **{f"time/{k}": v for k, v in self._times.items()}})
            return metrics
        rewards = scores + overlong_penalty(
            batch.sample["response_len"], c.max_new_tokens, c.overlong_buffer, c.overlong_penalty
        )
        need_old = self._experience(batch, pending)
        token_rewards = self._kl_in_reward(batch, metrics)
        adv = self._advantages(batch, rewards, token_rewards)
        train_metrics = self._update(batch)
        t0 = time.perf_counter()
        sync = self._sync(self.steps_done + 1)
        self._times["sync"] = time.perf_counter() - t0
        self._times["offload"] += self.residency.enter("rest")
        self.steps_done += 1
        self.samples_seen += len(batch)
        metrics.update(self._step_metrics(batch, scores, rewards, adv, breakdown, train_metrics, need_old))
        metrics.update(episode_metrics(batch.meta))
        metrics.update(sync)
        metrics["offload/moves"] = float(len(self.residency.moves) - moves_before)
        if self.pipeline is not None:
            metrics.update(self.pipeline.step_metrics(self.steps_done - 1))
        return metrics

    def _wait(self, fut):
        """A role call's result; with the pipeline, the rollout engine is kept busy meanwhile."""
        if self.pipeline is None:
            return fut.result()
        return self.pipeline.wait(fut, self.steps_done, self._sampling)

    def _need_old(self) -> bool:
        """Old log-probs are needed with several updates per batch, when the KL goes into
        the reward (it needs the policy's log-probs before the update), or for decoupled PPO
        (its proximal policy)."""
        c = self.config
        return c.ppo_epochs > 1 or c.mini_batches > 1 or c.kl.in_reward or c.off_policy.correction == "decoupled"

    def _issue_experience(self, batch: Batch) -> dict:
        """Start the reference and old log-prob calls on ``batch`` (together, so they overlap
        on separate devices); returns their futures for :meth:`_experience`."""
        c, roles = self.config, self.ctx.roles
        need_old = self._need_old()
        if c.kl.beta > 0 or need_old:
            self._times["offload"] += self.residency.enter("experience")
        return {
            "ref_logprobs": roles["reference"].logprobs(batch, temperature=c.temperature) if c.kl.beta > 0 else None,
            "old_logprobs": roles["policy"].logprobs(batch, temperature=c.temperature) if need_old else None,
        }

    def _experience(self, batch: Batch, pending: dict | None = None) -> bool:
        """Add reference and old log-probs to ``batch`` (from the calls in ``pending``, else
        issued now); returns whether old log-probs were computed (:meth:`_need_old`).
        ``time/reference`` and ``time/old_logprobs``: how long the step waited for them."""
        pending = self._issue_experience(batch) if pending is None else pending
        t0 = time.perf_counter()
        for key, timer in (("ref_logprobs", "reference"), ("old_logprobs", "old_logprobs")):
            if pending[key] is not None:
                batch.add_token(key, self._wait(pending[key])["logprobs"].float())
                self._times[timer] = time.perf_counter() - t0
        return self._need_old()

    def _kl_in_reward(self, batch: Batch, metrics: dict[str, float]) -> torch.Tensor | None:
        """Per-token rewards ``-beta * KL_t`` on the response tokens when ``kl.in_reward`` (else
        None); ``kl_reward``: the mean summed KL of a sample."""
        c = self.config
        if not c.kl.in_reward:
            return None
        mask = batch.token["loss_mask"]
        kl_tok = kl_value(self.kl_part.load(), batch.token["old_logprobs"], batch.token["ref_logprobs"],
                          c.kl.clamp) * mask
        seq_kl = torch.zeros(len(batch)).index_add_(0, batch.sample_index(), kl_tok)
        metrics["kl_reward"] = float(seq_kl.mean())
        return -c.kl.beta * kl_tok

    def _advantages(self, batch: Batch, rewards: torch.Tensor, token_rewards: torch.Tensor | None) -> torch.Tensor:
        """Per-token advantages from the configured estimator, added to the batch; returns them
        on the trained tokens (for the metrics)."""
        fn = self.advantage.load()
        adv, _ = fn(scores=rewards, groups=batch.sample["group"], mask=batch.token["loss_mask"],
                    cu_seqlens=batch.cu_seqlens, token_rewards=token_rewards, values=None,
                    baseline=batch.sample.get("baseline"), **self.advantage.options)
        batch.add_token("advantages", adv.float() * batch.token["loss_mask"])
        return adv[batch.token["loss_mask"] > 0]

    def _update(self, batch: Batch) -> list[dict[str, float]]:
        """``ppo_epochs`` passes of ``mini_batches`` policy updates; returns each update's metrics."""
        c = self.config
        loss_fn = PolicyObjective(
            policy_loss=self.policy_loss,
            kl=self.kl_part,
            kl_beta=0.0 if c.kl.in_reward else c.kl.beta,
            kl_clamp=c.kl.clamp,
            temperature=c.temperature,
            off_policy=c.off_policy,
        )
        rng = random.Random(int(self.ctx.seed) * 7919 + self.steps_done)
        train_metrics: list[dict[str, float]] = []
        self._times["offload"] += self.residency.enter("train")
        t0 = time.perf_counter()
        for _ in range(c.ppo_epochs):
            order = list(range(len(batch)))
            if c.shuffle_mini_batches and c.mini_batches > 1:
                rng.shuffle(order)
            for part in split(order, c.mini_batches):
                t1 = time.perf_counter()
                mb = batch.shallow_copy() if part == list(range(len(batch))) else batch.select(part)
                mb.add_token("token_weight", token_weights(mb, self.loss_agg, max_len=c.max_new_tokens))
                self._times["train/prepare"] += time.perf_counter() - t1
                fut = self.ctx.roles["policy"].train(mb, loss_fn)
                train_metrics.append(self._wait(fut))
                self._add_call_times("train", fut)
        self._times["train"] = time.perf_counter() - t0
        return train_metrics

    def _step_metrics(self, batch: Batch, scores: torch.Tensor, rewards: torch.Tensor, adv: torch.Tensor,
                      breakdown: list[dict], train_metrics: list[dict[str, float]], need_old: bool) -> dict[str, float]:
        """The step's metrics row: rewards, advantages, lengths, timings and update means."""
        rlen = batch.sample["response_len"].float()
        metrics = {
            "reward/mean": float(scores.mean()),
            "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/shaped_mean": float(rewards.mean()),
            "adv/mean": float(adv.mean()) if len(adv) else 0.0,
            "adv/std": float(adv.std()) if len(adv) > 1 else 0.0,
            "adv/min": float(adv.min()) if len(adv) else 0.0,
            "adv/max": float(adv.max()) if len(adv) else 0.0,
            "response_len/mean": float(rlen.mean()),
            "response_len/max": float(rlen.max()),
            **dict(zip(("response_len/p50", "response_len/p90", "response_len/p99"),
                       torch.quantile(rlen, torch.tensor([0.5, 0.9, 0.99])).tolist())),
            "response/truncated_frac": truncated_frac(batch.meta),
            "samples": float(len(batch)),
            **{f"time/{k}": v for k, v in self._times.items()},
        }
        metrics.update(reward_breakdown(breakdown))
        metrics.update(self._model_metrics)
        if self._baseline_mean:
            metrics["reward/greedy_mean"] = sum(self._baseline_mean) / len(self._baseline_mean)
        if need_old:
            gap = (batch.token["old_logprobs"] - batch.token["rollout_logprobs"]).abs()[batch.token["loss_mask"] > 0]
            metrics["logprob_gap"] = float(gap.mean()) if gap.numel() else 0.0
        metrics.update(key_means(train_metrics, ("loss", "grad_norm", "lr", "pg_loss", "clip_frac", "kl", "entropy",
                                                 "ratio")))
        metrics.update(prefixed_means(train_metrics, MOE_PREFIX))
        metrics.update(offpolicy_step_metrics(train_metrics))
        # the policy ranks' own train_step time (time/train minus this is dispatch and transfer)
        metrics["time/train_compute"] = float(sum(m.get("time_s", 0.0) for m in train_metrics))
        if not need_old and train_metrics and "logprob_gap" in train_metrics[0]:
            metrics["logprob_gap"] = float(train_metrics[0]["logprob_gap"])
        return metrics

    # ---------------------------------------------------------------- evaluation
    def drain(self, abort: bool = False) -> None:
        """The pipeline's requests in flight and pending weight sync (see ``Algorithm.drain``)."""
        if self.pipeline is not None:
            self.pipeline.drain(abort=abort)

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        if self._eval_reward() is None:
            return {}
        return self.residency.during("eval", self._exact_match, records)

    def _eval_reward(self) -> Any:
        """``eval_reward`` (a rule by name) when set, else the run's rule rewards (None: none)."""
        if self._eval_fn is None:
            if self.config.eval_reward:
                from rlweave.rewards import load_reward_fn

                self._eval_fn = load_reward_fn(self.config.eval_reward)
            else:
                self._eval_fn = self._rules
        return self._eval_fn

    def _exact_match(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c = self.config
        return exact_match(
            self.ctx.roles["rollout"],
            self.ctx.tokenizer,
            records,
            self._eval_reward(),
            max_new_tokens=c.eval_max_new_tokens,
            threshold=c.eval_threshold,
            greedy=c.eval_greedy,
            temperature=c.temperature,
            seed=int(self.ctx.seed),
            trajectories=self.rollout if c.multi_turn is not None else None,
        )

    def state_dict(self) -> dict[str, Any]:
        state = {"steps_done": self.steps_done, "samples_seen": self.samples_seen}
        if self.pipeline is not None:
            state["pipeline"] = self.pipeline.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.samples_seen = int(state.get("samples_seen", 0))
        if self.pipeline is not None and state.get("pipeline") is not None:
            self.pipeline.load_state_dict(state["pipeline"])

