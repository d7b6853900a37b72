"""PPO for RLHF (Ouyang et al. 2022; Ziegler et al. 2019): the classic four-model pipeline.

The policy samples responses; learned reward model(s) (and optional rule rewards) score
each whole response; the reward is paid at the last response token, and every response
token pays a KL penalty to the frozen reference (fixed or adaptive coefficient); a critic
estimates per-token values, GAE turns rewards and values into advantages; then several
epochs of clipped-surrogate updates for the policy and clipped value regression for the
critic. Dataflow of one step (each arrow is a call on a role handle)::

    rollout.generate -> [reward*.scores, reference.logprobs, critic.values, policy.logprobs]
      (issued together, so they overlap on separate devices)  -> KL penalty -> GAE
      -> for each epoch, mini-batch: policy.train + critic.train -> sync_weights(policy -> rollout)

The old log-probs are always recomputed by the policy, so they are the proximal policy of an
off-policy correction (``algorithm.off_policy``: truncated importance sampling or decoupled
PPO against the engine's log-probs, see :mod:`rlweave.algo_parts.offpolicy`).

Run modes (``run.mode: one_step_off | async``) and partial rollout: the samples come from the
rollout pipeline (:mod:`rlweave.algo_helpers.pipeline`), generated with weights up to
``run.max_staleness`` versions old; the reward models, the reference, the critic and the old
log-probs score the batch when it is trained, so they are on-policy with respect to it, and
only the engine's log-probs are off-policy. While the policy and critic train the engine keeps
generating; the weights are synced after every step (critic warm-up steps too, so versions
count steps).

Why this shape: the controller holds the whole batch, so global statistics (advantage
whitening, reward normalisation) are computed once here before anything is scattered,
and the losses stay small per-token functions (``loss.py``). Residency of colocated
roles is handled by :class:`~rlweave.residency.Residency` (phases in :data:`PHASES`).
"""

from __future__ import annotations

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
from rlweave.algo_helpers.rollout import encode_prompts, make_rollout, reward_samples, sampling_params
from rlweave.algo_helpers.weights import token_weights
from rlweave.algo_parts.kl import kl_value
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.offpolicy import step_metrics as offpolicy_step_metrics
from rlweave.algo_parts.spec import choose_loss_agg, resolve
from rlweave.algo_parts.stats import masked_moments, masked_whiten
from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm
from rlweave.interfaces.engine import SamplingParams
from rlweave.residency import Residency
from rlweave_algo_ppo.config import PPOConfig, ppo_roles
from rlweave_algo_ppo.kl_controller import make_kl_controller
from rlweave_algo_ppo.loss import ValueLoss
from rlweave_algo_ppo.normalize import RunningMoments, explained_variance, normalize_scores
from rlweave_algo_ppo.sequences import conform, supervised_batch


def wait_all(futures: dict[str, Any], t0: float, poll_s: float = 0.005,
             tick: Any = None) -> tuple[dict[str, Any], dict[str, float]]:
    """Results of named futures issued at ``t0`` and, per name, the seconds until it was
    done (measured by polling, so overlapped calls get their own times). ``tick()``, when
    given, runs at every poll (the rollout pipeline's pump)."""
    results: dict[str, Any] = {}
    times: dict[str, float] = {}
    pending = dict(futures)
    while pending:
        finished = [k for k, f in pending.items() if f.done()]
        for k in finished:
            times[k] = time.perf_counter() - t0
            results[k] = pending.pop(k).result()  # raises WorkerError naming role and rank
        if pending and not finished:
            if tick is not None:
                tick()
            time.sleep(poll_s)
    return results, times


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

#: names of the overlapped experience calls in the ``time/*`` metrics (reward roles keep theirs)
_TIME_NAMES = {"critic": "values", "policy": "old_logprobs"}


class PPO(Algorithm):
    """PPO with critic, reward model(s) and reference; see the module docstring."""

    def __init__(self, config: Any, ctx):
        if not isinstance(config, PPOConfig):
            config = PPOConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        c = self.config
        missing = [r for r in ppo_roles(c) if r not in ctx.roles]
        if missing:
            raise ValueError(f"ppo: roles {missing} are not built (configure them under 'roles')")
        self.kl_ctl = make_kl_controller(c.kl_coef, c.kl_target, c.kl_horizon)
        self.advantage = resolve("advantage", c.advantage)
        self.policy_loss = resolve("policy_loss", c.policy_loss)
        self.loss_agg = choose_loss_agg(c.loss_agg, self.policy_loss, self.advantage)
        self.kl_part = resolve("kl", c.kl_estimator)
        self.reward_moments = RunningMoments()
        self.steps_done = 0
        self.phases = Residency.for_run(ctx, ppo_roles(c), PHASES)
        self._ptx_iter = None
        self._ptx_state: dict[str, Any] | None = None
        self._eval_fn = None
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
    @property
    def _eos(self) -> int | None:
        return getattr(self.ctx.tokenizer, "eos_token_id", None)

    def _sampling(self, salt: int = 0) -> SamplingParams:
        return sampling_params(self.config, self.ctx.tokenizer,
                               int(self.ctx.seed) * 1_000_003 + self.steps_done * 101 + salt)

    def _sync(self, version: int) -> dict[str, float]:
        """Policy -> rollout; ``version``: the policy's version (steps done) after this sync."""
        self.phases.enter("sync")
        if self.pipeline is not None:
            info = self.pipeline.sync_weights(version)
            return {"sync_bytes": info["sync_bytes"], "time/sync": info["sync_seconds"]}
        info = self.ctx.weight_sync.sync("policy", "rollout")
        return {"sync_bytes": float(info.get("bytes", 0)), "time/sync": float(info.get("seconds", 0.0))}

    def _tick(self) -> None:
        """While the controller waits on the trainers: keep the engine fed (overlapping modes)."""
        if self.pipeline is not None:
            self.pipeline.pump(self.steps_done, self._sampling)

    def drain(self, abort: bool = False) -> None:
        """The pipeline's requests in flight and pending weight sync (see ``Algorithm.drain``)."""
        if self.pipeline is not None:
            self.pipeline.drain(abort=abort)

    def setup(self) -> None:
        """First weight sync (the policy may come from a checkpoint); ptx data if asked."""
        self._sync(self.steps_done)
        self.phases.enter("rest")
        if self.config.ptx_coef > 0:
            from rlweave.data.records import JsonlDataset
            from rlweave.runner.data import DataIterator

            ds = JsonlDataset(self.config.ptx_data, required=("response",))
            self._ptx_iter = DataIterator(ds, self.config.ptx_batch_size, seed=int(self.ctx.seed) + 17, shuffle=True)
            if self._ptx_state:
                self._ptx_iter.load_state_dict(self._ptx_state)

    # --------------------------------------------------------------- experience
    def _generate(self, records: list[dict[str, Any]], metrics: dict[str, float]) -> Batch:
        """One sample group per record: generated now (sync steps), or the pipeline's oldest
        complete groups (which also adds its ``staleness/*``, ``queue/*`` metrics)."""
        if self.pipeline is not None:
            batch = self.pipeline.next_batch(records, self.steps_done, self._sampling)
            metrics.update(self.pipeline.step_metrics(self.steps_done))
            return batch
        engine = self.ctx.roles["rollout"]
        return self.rollout.run(records, self.config.n_samples, self._sampling(),
                                lambda prompt_ids, sp: engine.generate(prompt_ids, sp).result(), self.steps_done)

    def _rule_rewards(self, batch: Batch) -> tuple[torch.Tensor | None, list[dict]]:
        rs = self.ctx.rewards
        if rs is None or not getattr(rs, "entries", True):
            return None, []
        totals, breakdown = rs.score(reward_samples(self.ctx.tokenizer, batch))
        return torch.tensor(totals, dtype=torch.float32), list(breakdown)

    def _experience(self, batch: Batch, metrics: dict[str, float]) -> torch.Tensor:
        """Scores, reference log-probs, values and old log-probs, issued together. Adds token
        fields ``old_logprobs``, ``ref_logprobs``, ``old_values``; returns the summed score."""
        c = self.config
        roles = self.ctx.roles
        t0 = time.perf_counter()
        futs: dict[str, Any] = {}
        futs.update(reward_models.issue_scores(roles, c.reward_models, batch, self._eos))
        if c.uses_reference:
            futs["reference"] = roles["reference"].logprobs(batch, temperature=c.temperature)
        futs["critic"] = roles["critic"].values(batch)
        futs["policy"] = roles["policy"].logprobs(batch, temperature=c.temperature, with_entropy=True)
        t_rule = time.perf_counter()
        rule, breakdown = self._rule_rewards(batch)  # runs in reward worker processes meanwhile
        rule_s = time.perf_counter() - t_rule
        res, times = wait_all(futs, t0, tick=self._tick)
        if rule is not None:
            metrics["time/rule_reward"] = rule_s
        for k, v in times.items():
            metrics[f"time/{_TIME_NAMES.get(k, k)}"] = v
        metrics["time/experience"] = time.perf_counter() - t0

        mask = batch.token["loss_mask"]
        batch.add_token("old_logprobs", res["policy"]["logprobs"].float() * mask)
        if "entropy" in res["policy"]:
            ent = res["policy"]["entropy"].float()
            metrics["entropy"] = masked_moments(ent, mask)[0]
        ref = res["reference"]["logprobs"].float() * mask if c.uses_reference else batch.token["old_logprobs"]
        batch.add_token("ref_logprobs", ref)
        batch.add_token("old_values", res["critic"].float() * mask)
        score = reward_models.combine(c.reward_models, res, len(batch), metrics)
        if rule is not None:
            metrics["reward/rules"] = float(rule.mean())
            metrics.update(reward_breakdown(breakdown))
            score = score + rule
        if "env_reward" in batch.sample:  # what an environment paid (0 for single-turn samples)
            score = score + batch.sample["env_reward"].float()
        return score

    # ---------------------------------------------------------------- ptx
    def _with_ptx(self, mb: Batch) -> Batch:
        """``mb`` followed by ptx samples: ``ptx_weight`` sums to 1 over the ptx tokens and is 0
        on ``mb``; the ptx samples carry zero ``token_weight``/``advantages`` (no RL term)."""
        rl = Batch(cu_seqlens=mb.cu_seqlens, token={**mb.token, "ptx_weight": torch.zeros(mb.num_tokens)},
                   sample=dict(mb.sample), ids=list(mb.ids), meta=list(mb.meta))
        ptx = supervised_batch(self.ctx.tokenizer, self._ptx_iter.next_batch(), encode_prompts)
        m = ptx.token["loss_mask"]
        ptx.add_token("ptx_weight", m / m.sum().clamp(min=1.0))
        return Batch.concat([rl, conform(ptx, rl)])

    # ---------------------------------------------------------------------- step
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """generate -> experience (old log-probs, reference, values, scores) -> rewards and
        GAE -> policy and critic updates -> weight sync; see the module docstring."""
        c = self.config
        metrics: dict[str, float] = {}
        self.phases.enter("generate")
        t0 = time.perf_counter()
        batch = self._generate(records, metrics)
        metrics["time/generate"] = time.perf_counter() - t0
        t_off = self.phases.enter("experience")
        raw_score = self._experience(batch, metrics)
        adv_info = self._advantages(batch, raw_score)
        t_off += self.phases.enter("train")
        train_policy = self.steps_done >= c.critic_warmup_steps
        p_metrics, v_metrics, t_train_off = self._update(batch, train_policy, metrics)
        t_off += t_train_off
        if train_policy or self.pipeline is not None:  # the pipeline's versions count steps
            metrics.update(self._sync(self.steps_done + 1))
        self.kl_ctl.update(float(adv_info["seq_kl"].mean()), len(batch))
        t_off += self.phases.enter("rest")
        metrics["time/offload"] = t_off
        self.steps_done += 1
        metrics.update(self._step_metrics(batch, raw_score, adv_info, p_metrics, v_metrics))
        return metrics

    def _advantages(self, batch: Batch, raw_score: torch.Tensor) -> dict[str, Any]:
        """Normalised/clipped sequence score at the last token, KL penalty on every token,
        GAE advantages (whitened if asked) and returns, added to ``batch``. Returns what the
        metrics need: ``score``, ``seq_kl``, ``kl_coef``, ``adv``, ``ret``, ``adv_mean``,
        ``adv_std`` (before whitening)."""
        c = self.config
        mask = batch.token["loss_mask"]
        score = normalize_scores(raw_score, c.reward_norm, self.reward_moments, c.reward_clip,
                                 groups=batch.sample["group"])
        kl_tok = kl_value(self.kl_part.load(), batch.token["old_logprobs"], batch.token["ref_logprobs"],
                          c.kl_clamp) * mask
        seq_kl = torch.zeros(len(batch)).index_add_(0, batch.sample_index(), kl_tok)
        kl_coef = self.kl_ctl.value
        adv, ret = self.advantage.load()(
            scores=score, groups=batch.sample["group"], mask=mask, cu_seqlens=batch.cu_seqlens,
            token_rewards=-kl_coef * kl_tok, values=batch.token["old_values"], baseline=None,
            **self.advantage.options)
        if ret is None:
            raise ValueError(f"ppo: advantage estimator '{self.advantage.name}' returned no returns for the critic")
        adv_mean, adv_std = masked_moments(adv, mask)
        if c.normalize_advantages:
            adv = masked_whiten(adv, mask)  # global statistics over the whole batch (see normalize.py)
        batch.add_token("advantages", adv)
        batch.add_token("returns", ret)
        return {"score": score, "seq_kl": seq_kl, "kl_coef": kl_coef, "adv": adv, "ret": ret,
                "adv_mean": adv_mean, "adv_std": adv_std}

    def _mini_batches(self, batch: Batch, train_policy: bool) -> tuple[list[Batch], list[Batch]]:
        """The policy's (with ptx records when asked; none during critic warm-up) and the
        critic's mini-batches of all ``ppo_epochs`` passes."""
        c = self.config
        rng = random.Random(int(self.ctx.seed) * 7919 + self.steps_done)
        p_batches: list[Batch] = []
        v_batches: list[Batch] = []
        for _ in range(c.ppo_epochs):
            order = list(range(len(batch)))
            if c.shuffle_mini_batches and c.mini_batches > 1:
                rng.shuffle(order)
            for part in split(order, c.mini_batches):
                mb = batch.select(part)
                mb.add_token("token_weight", token_weights(mb, self.loss_agg, max_len=c.max_new_tokens))
                v_batches.append(mb)
                if train_policy:
                    p_batches.append(self._with_ptx(mb) if c.ptx_coef > 0 else mb)
        return p_batches, v_batches

    def _update(self, batch: Batch, train_policy: bool,
                metrics: dict[str, float]) -> tuple[list[dict[str, float]], list[dict[str, float]], float]:
        """Policy and critic updates: one after the other when both move between phases
        (each alone on the devices), else side by side. Returns the policy's and the critic's
        update metrics and the seconds spent moving roles; sets ``time/train`` and
        ``time/critic_train``."""
        c, roles = self.config, self.ctx.roles
        policy_loss = PolicyObjective(self.policy_loss, entropy_coef=c.entropy_coef, ptx_coef=c.ptx_coef,
                                      temperature=c.temperature,
                                      off_policy=c.off_policy if c.off_policy.enabled else None)
        value_loss = ValueLoss(c.value_clip)
        p_batches, v_batches = self._mini_batches(batch, train_policy)
        p_metrics: list[dict[str, float]] = []
        t_off = 0.0
        t0 = time.perf_counter()
        if self.phases.moving("policy", "critic"):
            if p_batches:
                t_off += self.phases.only("policy", "train")
                p_metrics = [self._wait(f) for f in [roles["policy"].train(b, policy_loss) for b in p_batches]]
            metrics["time/train"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            t_off += self.phases.only("critic", "train")
            v_metrics = [self._wait(f) for f in [roles["critic"].train(b, value_loss) for b in v_batches]]
            metrics["time/critic_train"] = time.perf_counter() - t1
            return p_metrics, v_metrics, t_off
        futs = {f"p{i}": roles["policy"].train(b, policy_loss) for i, b in enumerate(p_batches)}
        futs.update({f"v{i}": roles["critic"].train(b, value_loss) for i, b in enumerate(v_batches)})
        res, times = wait_all(futs, t0, tick=self._tick)
        metrics["time/train"] = max([times[f"p{i}"] for i in range(len(p_batches))], default=0.0)
        metrics["time/critic_train"] = max([times[f"v{i}"] for i in range(len(v_batches))], default=0.0)
        return [res[f"p{i}"] for i in range(len(p_batches))], [res[f"v{i}"] for i in range(len(v_batches))], t_off

    def _step_metrics(self, batch: Batch, raw_score: torch.Tensor, a: dict[str, Any],
                      p_metrics: list[dict[str, float]], v_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The step's metrics row (rewards, advantages, values, KL, lengths, update means)."""
        mask = batch.token["loss_mask"]
        adv, ret = a["adv"], a["ret"]
        rlen = batch.sample["response_len"].float()
        on = mask > 0
        gap = (batch.token["old_logprobs"] - batch.token["rollout_logprobs"]).abs()[on]
        metrics = {
            "reward/mean": float(raw_score.mean()),
            "reward/std": float(raw_score.std()) if len(raw_score) > 1 else 0.0,
            "reward/normalized_mean": float(a["score"].mean()),
            "adv/mean": a["adv_mean"],
            "adv/std": a["adv_std"],
            "adv/min": float(adv[on].min()) if on.any() else 0.0,
            "adv/max": float(adv[on].max()) if on.any() else 0.0,
            "returns/mean": masked_moments(ret, mask)[0],
            "values/mean": masked_moments(batch.token["old_values"], mask)[0],
            "explained_variance": explained_variance(batch.token["old_values"], ret, mask),
            "kl": float(a["seq_kl"].mean()),
            "kl_coef": a["kl_coef"],
            "response_len/mean": float(rlen.mean()),
            "response_len/max": float(rlen.max()),
            "response/truncated_frac": truncated_frac(batch.meta),
            "logprob_gap": float(gap.mean()) if gap.numel() else 0.0,
            "samples": float(len(batch)),
        }
        metrics.update(key_means(p_metrics, ("loss", "grad_norm", "lr", "pg_loss", "clip_frac", "ppo_kl", "ratio",
                                             "ptx_loss")))
        metrics.update(key_means(v_metrics, ("value_loss", "value_clipfrac", ("grad_norm", "critic/grad_norm"),
                                             ("lr", "critic/lr"))))
        metrics.update(offpolicy_step_metrics(p_metrics))
        metrics.update(prefixed_means(p_metrics, MOE_PREFIX))
        metrics.update(prefixed_means(v_metrics, MOE_PREFIX, "critic/"))
        metrics.update(episode_metrics(batch.meta))
        return metrics

    # ---------------------------------------------------------------- evaluation
    def _eval_reward(self) -> Any:
        if self._eval_fn is None:
            if self.config.eval_reward:
                from rlweave.rewards import load_reward_fn

                self._eval_fn = load_reward_fn(self.config.eval_reward)
            else:
                self._eval_fn = self.ctx.rewards
        return self._eval_fn

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c = self.config
        fn = self._eval_reward()
        if fn is None:
            return {}
        self.phases.enter("eval")
        out = exact_match(
            self.ctx.roles["rollout"],
            self.ctx.tokenizer,
            records,
            fn,
            max_new_tokens=c.eval_max_new_tokens,
            threshold=c.eval_threshold,
            greedy=c.eval_greedy,
            temperature=c.temperature,
            seed=int(self.ctx.seed),
            trajectories=self.rollout if c.multi_turn is not None else None,
        )
        self.phases.enter("rest")
        return out

    # ---------------------------------------------------------------- state
    def _wait(self, fut: Any) -> Any:
        """A role call's result; with the pipeline, the rollout engine is kept busy meanwhile."""
        if self.pipeline is None:
            return fut.result()
        return self.pipeline.wait(fut, self.steps_done, self._sampling)

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_done": self.steps_done,
            "kl_ctl": self.kl_ctl.state_dict(),
            "reward_moments": self.reward_moments.state_dict(),
            "ptx": self._ptx_iter.state_dict() if self._ptx_iter is not None else None,
            **({"pipeline": self.pipeline.state_dict()} if self.pipeline is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        if "kl_ctl" in state:
            self.kl_ctl.load_state_dict(state["kl_ctl"])
        if "reward_moments" in state:
            self.reward_moments.load_state_dict(state["reward_moments"])
        self._ptx_state = state.get("ptx")
        if self.pipeline is not None and state.get("pipeline") is not None:
            self.pipeline.load_state_dict(state["pipeline"])
        if self._ptx_iter is not None and self._ptx_state:
            self._ptx_iter.load_state_dict(self._ptx_state)
