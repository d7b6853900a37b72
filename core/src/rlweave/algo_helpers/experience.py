"""The RL step toolkit: everything around an RL algorithm's own dataflow, written once for GRPO,
PPO and OnlineDPO (and any algorithm that samples through the rollout seam).

An algorithm builds one :class:`ExperienceKit` and states only what is its own (advantages, a
critic, pairs...). A step reads::

    kit.begin_step()
    batch = kit.generate(records)                    # rollout through the run mode's pipeline
    exp = kit.experience(batch, {"reference": lambda: roles["reference"].logprobs(batch)})
                                                     # log-prob/value passes + every reward source,
                                                     # issued together, awaited with the engine fed
    mbs = kit.mini_batches(batch, epochs=..., parts=..., loss_agg=...)
    rows = kit.train([("policy", mbs, loss_fn)])     # epochs x mini-batches, per role
    metrics = kit.finish(batch)                      # sync, residency, counters, time/* and sync_*
    metrics.update(kit.mismatch(rows["policy"]))     # engine vs trainer log-probs, warnings on a jump

What it holds for the run: the rollout (a plugin, :mod:`rlweave.interfaces.rollout`) and the
pipeline of ``run.mode`` (:mod:`rlweave.interfaces.pipeline`), the reward sources
(:mod:`rlweave.algo_helpers.reward_sources`), the residency of colocated roles
(:mod:`rlweave.residency`: the algorithm names its phases), the per-step seeding of sampling, the
held-out evaluation, and its part of the checkpoint (:meth:`state_dict`). With ``rollout.dump`` it
records each step's batches and rewards; with ``rollout.replay`` it reads them back in place of the
pipeline and the reward sources (:mod:`rlweave.algo_helpers.rollout_tape`).

Metric names are the same for every algorithm: ``time/<phase>`` (seconds: ``generate``,
``reward``, each pass by name, ``train``, ``<role>_train``, ``sync``, ``offload``; with rewards
overlapped with generation ``reward/overlapped`` and ``reward/wait``), ``sync_bytes``,
``offload/moves``, ``reward/*`` (``reward/rules``, each rule, each reward model), and what the
pipeline measures (``staleness/*``, ``queue/*``, ``time/idle/*``); :meth:`ExperienceKit.mismatch` adds
``mismatch/*`` (:mod:`rlweave.algo_parts.mismatch`). A batch whose tokens carry ``weight_version``
gets token field ``staleness`` (the policy version that trains it minus the engine's).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlweave.algo_helpers.evaluate import exact_match
from rlweave.algo_helpers.kit_state import migrate
from rlweave.algo_helpers.minibatch import split
from rlweave.algo_helpers.mismatch_monitor import MismatchMonitor
from rlweave.algo_helpers.reward_sources import build_sources, has_reward
from rlweave.algo_helpers.rollout import make_rollout, sampling_params
from rlweave.algo_helpers.rollout_tape import ReplayedRewards, ReplayPipeline, TapeReader, TapeWriter, open_tape
from rlweave.algo_helpers.run_modes import make_pipeline
from rlweave.algo_helpers.step_metrics import reward_breakdown
from rlweave.algo_helpers.weights import token_weights
from rlweave.algo_parts.mismatch import mismatch_metrics
from rlweave.data.batch import Batch
from rlweave.interfaces.engine import SamplingParams
from rlweave.residency import Residency
from rlweave.scheduler.trace import TRACE

log = logging.getLogger("rlweave.algo")

#: the ``time/*`` keys of every step's row (0 when the step had none of it), so the columns a user
#: plots stay the same from step to step; each pass adds its own (``time/reference``, ...)
STEP_TIMES = ("generate", "generate/dispatch", "generate/wait", "generate/pack", "reward", "reward/decode",
              "reward/pool", "train", "train/prepare", "train/dispatch", "train/wait", "sync", "offload")

#: seconds between polls of a set of role calls (:meth:`ExperienceKit.wait_all`)
POLL_S = 0.005


@dataclass
class Experience:
    """What :meth:`ExperienceKit.experience` gathered for a batch: each sample's summed reward
    ``scores`` ``(n,)`` (None when not scored), the per-rule ``breakdown`` of each sample, and the
    result of each pass by name."""

    scores: torch.Tensor | None
    breakdown: list[dict]
    results: dict[str, Any]


class ExperienceKit:
    """The toolkit of one run (see the module docstring). ``ctx``: the run context; ``config``: the
    algorithm's validated config (``n_samples``, ``max_new_tokens``, sampling keys, and where it has
    them ``reward_models``, ``eval_reward``, ``eval_*``); ``phases``: the algorithm's residency
    phases (each needs ``generate``, ``experience``, ``train``, ``sync``, ``eval``, ``rest``);
    ``roles``: the roles that take turns on shared devices; ``name``: the algorithm's name, for
    messages."""

    def __init__(self, ctx: Any, config: Any, phases: Mapping[str, Sequence[str]], roles: Sequence[str], name: str):
        self.ctx, self.config, self.name = ctx, config, name
        self.residency = Residency.for_run(ctx, roles, phases)
        self.rollout, self.rollout_record = make_rollout(ctx.config, config, ctx.tokenizer,
                                                         getattr(ctx, "vision", None))
        tape = open_tape(ctx)
        self.recorder = tape if isinstance(tape, TapeWriter) else None
        self.replaying = tape if isinstance(tape, TapeReader) else None
        if self.replaying is not None:
            self.pipeline: Any = ReplayPipeline(self.replaying)
            self.sources: list[Any] = [ReplayedRewards(self.replaying, lambda: self.steps_done)]
        else:
            self.sources = build_sources(ctx, config, self.wait)
            generating = self.rollout  # what the pipeline runs: the sources may start on finished groups
            for src in self.sources:
                generating = src.during_rollout(generating)
            self.pipeline = make_pipeline(ctx, generating, self.rollout_record, config.n_samples,
                                          config.max_new_tokens)
        if not has_reward(self.sources, pays=not self.rollout_record.streams):
            raise ValueError(f"{name} needs a reward: an entry under 'rewards', algorithm.reward_models, or a "
                             "rollout whose environment pays")
        self.steps_done = 0
        self.samples_seen = 0
        self.times: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self._moves = 0
        self._eval_fn: Any = None
        self._said_no_eval = False
        self._per_pass = 0  # updates of one pass over the last batch split into mini-batches
        self.mismatch_monitor = MismatchMonitor.for_run(ctx.config, config)

    # ------------------------------------------------------------------ a step
    def begin_step(self) -> None:
        """Start a step's timers and metrics."""
        self.times = dict.fromkeys(STEP_TIMES, 0.0)
        self.metrics = {}
        self._moves = len(self.residency.moves)

    def enter(self, phase: str) -> None:
        """Residency: the roles ``phase`` needs resident, the others put away (``time/offload``)."""
        self.add_time("offload", self.residency.enter(phase))

    def add_time(self, name: str, seconds: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + seconds

    def sampling(self, salt: int = 0) -> SamplingParams:
        """Sampling settings of a generation started now: the run seed, the step and ``salt``."""
        seed = int(self.ctx.seed) * 1_000_003 + self.steps_done * 101 + salt
        return sampling_params(self.config, self.ctx.tokenizer, seed,
                               ignore_eos=bool(getattr(self.config, "ignore_eos", False)))

    def generate(self, records: list[dict[str, Any]], salt: int = 0) -> Batch:
        """The trajectories the step trains, from the pipeline (``salt``: another round of the same
        step, sync mode); with token field ``staleness`` where the batch carries ``weight_version``."""
        self.enter("generate")
        t0 = time.perf_counter()
        params = self.sampling if not salt else (lambda s: self.sampling(salt + s))
        with TRACE.phase("generate"):
            batch = self.pipeline.next_batch(records, self.steps_done, params)
        if "weight_version" in batch.token:
            batch.add_token("staleness", self.steps_done - batch.token["weight_version"])
        if self.recorder is not None:
            self.recorder.batch(batch)
        self.add_time("generate", time.perf_counter() - t0)
        return batch

    def run_rollout(self, records: list[dict[str, Any]], n: int, sampling: SamplingParams, label: str) -> Batch:
        """One more rollout of the step outside the pipeline, on the engine as it is (ReMax's greedy
        baseline: ``label`` says what it is); recorded and replayed like the step's batch."""
        if self.replaying is not None:
            return self.replaying.batch(self.steps_done + 1)
        engine = self.ctx.roles["rollout"]
        batch = self.rollout.run(records, n, sampling, lambda p, sp: engine.generate(p, sp).result(), self.steps_done)
        if self.recorder is not None:
            self.recorder.batch(batch, label)
        return batch

    def score(self, batch: Batch, record: bool = True) -> tuple[torch.Tensor, list[dict]]:
        """Each sample's reward summed over the sources, and its per-rule breakdown; with
        ``record`` the sources' metrics join the step's (``time/reward*`` always do)."""
        return self._score(batch, record, self._issue_sources(batch))

    def _issue_sources(self, batch: Batch) -> list[Any]:
        if any(s.name == "reward_models" for s in self.sources):
            self.enter("experience")
        return [s.issue(batch) for s in self.sources]

    def _score(self, batch: Batch, record: bool, pending: list[Any]) -> tuple[torch.Tensor, list[dict]]:
        t0 = time.perf_counter()
        totals = torch.zeros(len(batch), dtype=torch.float32)
        breakdown: list[dict] = [{} for _ in range(len(batch))]
        had_breakdown, recorded = False, {}
        for src, p in zip(self.sources, pending):
            part = src.collect(p, batch)
            totals = totals + part.scores
            if part.breakdown is not None:
                breakdown, had_breakdown = part.breakdown, True
                if record:
                    self.metrics.update(reward_breakdown(breakdown))
            for k, v in part.metrics.items():
                if k.startswith("time/"):
                    self.add_time(k[len("time/"):], v)
                else:
                    recorded[k] = v
                    if record:
                        self.metrics[k] = v
        if self.recorder is not None:
            self.recorder.scores(totals, breakdown if had_breakdown else None, recorded)
        self.add_time("reward", time.perf_counter() - t0)
        return totals, breakdown

    def experience(self, batch: Batch, calls: Mapping[str, Callable[[], Any]], score: bool = True) -> Experience:
        """Issue the passes ``calls`` (name -> a function making one role call) and the reward
        sources on ``batch`` together, score while they run, and wait for all of them, feeding the
        engine meanwhile; ``time/<name>``: each pass's seconds until done."""
        if calls:
            self.enter("experience")
        t0 = time.perf_counter()
        with TRACE.phase("experience"):
            futures = {name: call() for name, call in calls.items()}
            scores, breakdown = self._score(batch, True, self._issue_sources(batch)) if score else (None, [])
            results, times = self.wait_all(futures, t0)
        for name, seconds in times.items():
            self.add_time(name, seconds)
        self.add_time("experience", time.perf_counter() - t0)
        return Experience(scores, breakdown, results)

    def wait(self, future: Any) -> Any:
        """A role call's result; the pipeline keeps the engine busy meanwhile."""
        return self.pipeline.wait(future, self.steps_done, self.sampling)

    def wait_all(self, futures: Mapping[str, Any], t0: float) -> tuple[dict[str, Any], dict[str, float]]:
        """Results of named futures issued at ``t0`` and, per name, the seconds until it was done
        (measured by polling, so overlapped calls get their own times); the engine is fed at
        every poll. A failed call raises its ``WorkerError`` (naming role and rank)."""
        results: dict[str, Any] = {}
        times: dict[str, float] = {}
        pending = dict(futures)
        while pending:
            finished = [k for k, f in pending.items() if f.done()]
            for k in finished:
                times[k] = time.perf_counter() - t0
                results[k] = pending.pop(k).result()
            if pending and not finished:
                self.pipeline.pump(self.steps_done, self.sampling)
                time.sleep(POLL_S)
        return results, times

    # ------------------------------------------------------------------ updates
    def mini_batches(self, batch: Batch, *, epochs: int, parts: int, shuffle: bool, loss_agg: Any,
                     max_len: int | None = None) -> list[Batch]:
        """``epochs`` passes of ``parts`` mini-batches (shuffled per pass with the step's seed when
        ``shuffle``), each with its ``token_weight`` from the loss aggregation ``loss_agg``."""
        t0 = time.perf_counter()
        rng = random.Random(int(self.ctx.seed) * 7919 + self.steps_done)
        out = []
        for _ in range(epochs):
            order = list(range(len(batch)))
            if shuffle and parts > 1:
                rng.shuffle(order)
            for part in split(order, parts):
                mb = batch.select(part)
                mb.add_token("token_weight", token_weights(mb, loss_agg, max_len=max_len))
                out.append(mb)
        self._per_pass = len(out) // epochs if epochs else 0
        self.add_time("train/prepare", time.perf_counter() - t0)
        self.add_time("train", time.perf_counter() - t0)  # preparing is part of the update phase
        return out

    def train(self, plan: Sequence[tuple[str, Sequence[Batch], Any]]) -> dict[str, list[dict[str, float]]]:
        """Train each ``(role, mini-batches, loss function)`` of ``plan`` (each role's calls are
        issued at once and run in order): one role after the other when there is one or they all
        move between phases (each alone on the shared devices), else side by side. Returns each
        role's update metrics in order; ``time/train`` (the policy) and ``time/<role>_train``
        (others), with ``/dispatch`` and ``/wait`` of the calls when roles take turns."""
        self.enter("train")
        with TRACE.phase("train"):
            return self._train(plan)

    def _train(self, plan: Sequence[tuple[str, Sequence[Batch], Any]]) -> dict[str, list[dict[str, float]]]:
        roles = [role for role, _, _ in plan]
        key = {role: "train" if role == "policy" else f"{role}_train" for role in roles}
        out: dict[str, list[dict[str, float]]] = {}
        if len(plan) == 1 or self.residency.moving(*roles):
            for role, batches, loss in plan:
                t0 = time.perf_counter()
                if len(plan) > 1:
                    self.add_time("offload", self.residency.only(role, "train"))
                futures = [self.ctx.roles[role].train(b, loss) for b in batches]
                out[role] = [self.wait(f) for f in futures]
                self.add_time(key[role], time.perf_counter() - t0)
                for f in futures:
                    self.add_time(f"{key[role]}/dispatch", getattr(f, "dispatch_s", 0.0) + getattr(f, "combine_s", 0.0))
                    self.add_time(f"{key[role]}/wait", getattr(f, "wait_s", 0.0))
            return out
        t0 = time.perf_counter()
        futures = {(role, i): self.ctx.roles[role].train(b, loss) for role, batches, loss in plan
                   for i, b in enumerate(batches)}
        results, times = self.wait_all(futures, t0)
        for role, batches, _ in plan:
            out[role] = [results[(role, i)] for i in range(len(batches))]
            self.add_time(key[role], max([times[(role, i)] for i in range(len(batches))], default=0.0))
        return out

    def mismatch(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """The step's ``mismatch/*`` metrics from the policy's update metrics ``rows`` (in the order
        trained; the first pass over the batch counts, each sample once: the last
        :meth:`mini_batches` says how many updates it has), after :meth:`finish`; a jump of the gap
        is warned about (:class:`~rlweave.algo_helpers.mismatch_monitor.MismatchMonitor`)."""
        first = list(rows)[: self._per_pass] if self._per_pass else list(rows)
        out = mismatch_metrics(first)
        self.mismatch_monitor.observe(out, self.steps_done)
        return out

    def finish(self, batch: Batch, updated: bool = True) -> dict[str, float]:
        """End the step: sync the policy into the rollout engine when it was ``updated``, residency
        ``rest``, the counters; returns the step's toolkit metrics (rewards recorded, the
        pipeline's, ``sync_bytes``, ``offload/moves`` and every ``time/*``)."""
        out = dict(self.metrics)
        out["sync_bytes"] = 0.0
        measured = {}
        if updated:
            self.enter("sync")
            with TRACE.phase("sync"):
                measured.update(self.pipeline.sync_weights(self.steps_done + 1))
        self.enter("rest")
        measured.update(self.pipeline.step_metrics(self.steps_done))  # the pipeline's word is the last
        for k, v in measured.items():
            if k.startswith("time/"):
                self.times[k[len("time/"):]] = v
            else:
                out[k] = v
        if self.recorder is not None:
            self.recorder.end(self.steps_done + 1)
        self.steps_done += 1
        TRACE.version = self.steps_done  # the policy's weight version on the run's timeline
        self.samples_seen += len(batch)
        out["offload/moves"] = float(len(self.residency.moves) - self._moves)
        out.update({f"time/{k}": v for k, v in self.times.items()})
        return out

    # ------------------------------------------------------------------ run
    def setup(self) -> None:
        """The rollout engine generates with the policy's weights (they differ from the model
        path after a resume)."""
        self.residency.enter("sync")
        self.pipeline.sync_weights(self.steps_done)
        self.residency.enter("rest")
        TRACE.version = self.steps_done

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Held-out exact match (:func:`~rlweave.algo_helpers.evaluate.exact_match`) of the
        rollout's answers, judged by ``eval_reward`` or else the run's rule rewards; ``{}`` with
        neither (said once)."""
        if self.replaying is not None:
            if not self._said_no_eval:
                log.warning("%s: rollout.replay: no engine, held-out evaluation is skipped", self.name)
                self._said_no_eval = True
            return {}
        fn = self._eval_reward()
        if fn is None:
            return {}
        c = self.config
        return self.residency.during(
            "eval", exact_match, self.ctx.roles["rollout"], self.ctx.tokenizer, records, fn,
            max_new_tokens=c.eval_max_new_tokens, threshold=c.eval_threshold, greedy=c.eval_greedy,
            temperature=c.temperature, seed=int(self.ctx.seed),
            trajectories=None if self.rollout_record.streams else self.rollout,
            vision=getattr(self.ctx, "vision", None))

    def _eval_reward(self) -> Any:
        if self._eval_fn is None:
            name = getattr(self.config, "eval_reward", None)
            if name:
                from rlweave.rewards import load_reward_fn

                self._eval_fn = load_reward_fn(name)
            else:
                rs = self.ctx.rewards
                self._eval_fn = rs if rs is not None and getattr(rs, "entries", True) else False
                if self._eval_fn is False:
                    log.warning("%s: no rule rewards and no eval_reward: held-out evaluation is skipped", self.name)
        return self._eval_fn or None

    def drain(self, abort: bool = False) -> None:
        """The pipeline's requests in flight and pending weight sync (``Algorithm.drain``)."""
        self.pipeline.drain(abort=abort)

    def close(self) -> None:
        self.pipeline.close()
        for src in self.sources:
            src.close()
        self.rollout.close()

    def state_dict(self) -> dict[str, Any]:
        """The toolkit's part of the algorithm's checkpoint (see :mod:`.kit_state`)."""
        return {"format": 2, "steps_done": self.steps_done, "samples_seen": self.samples_seen,
                "pipeline": self.pipeline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """Restore :meth:`state_dict` from an algorithm's checkpoint state (migrated when an earlier
        version wrote it); returns the whole migrated state for the algorithm's own keys."""
        state = migrate(state, self.name)
        self.steps_done = int(state.get("steps_done", 0))
        self.samples_seen = int(state.get("samples_seen", 0))
        if state.get("pipeline"):
            self.pipeline.load_state_dict(state["pipeline"])
        return state
