"""Multi-turn rollouts: episodes of model turns and environment steps, as token-exact trajectories.

For each record, ``n`` episodes (one per sample of the group). An episode builds its environment
(plugin kind ``environment``, :mod:`rlweave.interfaces.environment`), renders the opening
messages with the chat template (:func:`rlweave.algo_helpers.chat.prompt_ids`), then alternates:

1. a model turn: the engine continues ``prompt + everything so far``; the sampled ids, their
   log-probs and weight versions are appended as they are (loss mask 1);
2. an environment step on the turn's text (in a worker thread); unless it is done, its
   observation messages are rendered (:func:`rlweave.algo_helpers.chat.observation_ids`) and
   appended (loss mask 0, log-prob 0).

An episode ends when a step says ``done``, after ``max_turns`` model turns, when a model turn is
cut by its token budget (``finish_reason`` ``length``: the episode's ``max_total_tokens``, or the
sampling ``max_new_tokens`` unless ``end_on_length`` is off), or when an observation would pass
``max_total_tokens``.

An environment whose constructor, ``reset`` or ``step`` raises stops the rollout (and so the run)
with :class:`~rlweave.interfaces.failures.PluginCodeError`: the environment's name, its key
(``algorithm.multi_turn.env.name``), the record's id, the phase and the exception's first line,
the traceback kept for the run's error log. Every episode under way is ended (``error``) and
closed first. (The ``tools`` environment turns a failing tool into an error message to the
model and goes on: a tool never stops the run.)

Scheduling (``scheduling``): ``independent`` (default) sends every episode whose environment
step has finished to the engine together, while slower steps go on in their threads: a slow tool
holds only its own episode. ``lockstep`` waits for every step of a turn before the next. With
``max_in_flight`` at most that many episodes run at once: the next one starts (its environment
built and reset) when one ends, so a step's episodes stream through the engine. With
``engine_calls`` > 1 the engine calls are made from threads, up to that many at once: episodes
that become ready go to the engine while an earlier call runs (those that become ready while all
are running go together in the next), and an engine that batches concurrent calls (vLLM) takes
them into its running batch.

**Rounds** (partial rollout, ``rollout.partial``): :meth:`MultiTurnRollout.episodes` with a
``budget`` gives each episode at most that many model tokens in the call (a round); an episode
that reaches it stops (``paused``), inside a model turn (the engine's ``token_budget`` cut it,
``finish_reason`` ``aborted``) or before its next turn, and a later call given it back in
``carry`` continues it where it stopped: a cut turn goes on from prompt + everything so far and
stays one turn (its tokens and log-probs appended, versions per token). In its ``max_rounds``-th
round an episode has no budget.

:func:`episodes_to_batch` packs the trajectories like :func:`~rlweave.algo_helpers.rollout.
generations_to_batch` does single-turn generations, with the loss mask zero on observation
tokens; ``response_ids`` in a sample's meta is its last model turn (what rule rewards score).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from rlweave.algo_helpers import chat
from rlweave.algo_helpers.multi_turn_config import ENV_KEY
from rlweave.data.batch import Batch
from rlweave.devices.openmp import releasing
from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.interfaces.environment import Environment, EnvStep
from rlweave.interfaces.failures import PluginCodeError
from rlweave.interfaces.rollout import GenerateFn, GroupFn, Rollout
from rlweave.rewards.fields import reward_fields
from rlweave.scheduler.trace import TRACE

#: episode counters summed into the step metrics (``episode/<name>_mean``)
COUNTERS = ("turns", "tool_calls", "tool_errors", "tool_time_s")


@dataclass
class Trajectory:
    """One episode: ``ids`` after the prompt with their ``mask`` (1: sampled by the model),
    ``logprobs`` and ``versions`` (0 on observation tokens), the last model turn
    (``final_ids``), the environment's summed reward (None: it gave none), how it ended
    (``ended_by``: ``done``, ``max_turns``, ``length``, ``max_total_tokens`` or ``error``) and its
    counters (:data:`COUNTERS`)."""

    prompt_ids: list[int]
    prompt_text: str
    env: Environment | None = None
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    reward: float | None = None
    ended_by: str | None = None
    stats: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in COUNTERS})
    order: int = 0  # start order within one ``episodes`` call: engine calls list episodes in this order
    rounds: int = 0  # ``episodes`` calls (rounds) it has run in
    budget: int | None = None  # model tokens it may still make in this round (None: no limit)
    paused: bool = False  # stopped by the round's budget; a later round continues it
    cut_turn: bool = False  # the pause is inside a model turn (the next round continues that turn)
    record_id: Any = None  # the data record's id (named when its environment fails)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    def add_turn(self, gen: Generation, version: int) -> None:
        """Append a model turn, or more of a turn cut by the round's budget (``cut_turn``)."""
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += list(gen.logprobs)
        self.versions += list(gen.versions) if len(gen.versions) == len(gen.token_ids) else [version] * len(gen.token_ids)
        if self.cut_turn:
            self.final_ids += list(gen.token_ids)
        else:
            self.final_ids = list(gen.token_ids)
            self.stats["turns"] += 1
        self.finish_reason = gen.finish_reason
        if self.budget is not None:
            self.budget -= len(gen.token_ids)
        self.cut_turn = False

    def add_observation(self, ids: Sequence[int]) -> None:
        self.ids += list(ids)
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [0] * len(ids)

    def end(self, how: str) -> None:
        self.ended_by = how
        if self.env is not None:
            self.env.close()
            self.env = None


class MultiTurnRollout(Rollout):
    """Runs episodes (see the module docstring) with ``env_cls(env_args)`` environments; the
    :class:`~rlweave.interfaces.rollout.Rollout` of ``algorithm.multi_turn``.

    ``generate(prompts, sampling) -> list[list[Generation]]`` is the engine call (blocking), and
    ``tokenizer`` renders messages. :meth:`close` stops the step threads. :meth:`run` reports each
    record whose episodes all ended to ``on_group`` (:mod:`rlweave.interfaces.rollout`)."""

    reports_groups = True

    def __init__(self, cfg: Any, env_cls: Callable[[Any], Environment], env_args: Any, tokenizer: Any):
        self.cfg = cfg
        self.env_cls, self.env_args, self.tok = env_cls, env_args, tokenizer
        self.pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="rlweave-env")
        #: engine calls made from threads, several at once (``engine_calls`` > 1), else None: in line
        self.engine_pool = ThreadPoolExecutor(max_workers=cfg.engine_calls, thread_name_prefix="rlweave-engine") \
            if cfg.engine_calls > 1 else None

    @classmethod
    def create(cls, ctx: Any) -> "MultiTurnRollout":
        """From ``algorithm.multi_turn`` (``ctx.args``): its environment resolved by name."""
        from rlweave.algo_helpers.multi_turn_config import resolve_environment

        env_cls, args = resolve_environment(ctx.args.env.name, ctx.args.env.args)
        return cls(ctx.args, env_cls, args, ctx.tokenizer)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.engine_pool is not None:
            self.engine_pool.shutdown(wait=True, cancel_futures=True)
        shutdown = getattr(self.env_cls, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def run(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
            version: int = 0, on_group: GroupFn | None = None) -> Batch:
        """``n`` episodes per record as one batch (:func:`episodes_to_batch`); ``on_group``: told
        of each record whose episodes all ended while others still run."""
        ids, meta = [str(r.get("id", i)) for i, r in enumerate(records)], [reward_fields(r) for r in records]
        done = None if on_group is None else (lambda g, ts: report_group(on_group, g, ts, ids[g], meta[g]))
        groups = self.episodes(records, n, sampling, generate, version, on_done=done)
        return episodes_to_batch(groups, ids, meta)

    def episodes(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
                 version: int = 0, carry: list[list[Trajectory | None]] | None = None, budget: int | None = None,
                 max_rounds: int = 1,
                 on_done: Callable[[int, list[Trajectory]], None] | None = None) -> list[list[Trajectory]]:
        """``n`` episodes per record, grouped by record. At most ``max_in_flight`` episodes run at
        once (the next one starts, its environment built and reset, when one ends). ``carry``:
        the groups an earlier call returned for the same ``records`` (None where an episode is to
        start afresh): its paused episodes continue, its ended ones are left as they are. With
        ``budget`` the call is a round (module docstring): it returns when every episode ended or
        paused. ``on_done(g, episodes)``: called once per record ``g`` whose episodes all ended, while
        others still run (not for a record done when the call returns)."""
        groups: list[list[Trajectory | None]] = carry if carry is not None else [[None] * n for _ in records]
        waiting = [(g, k) for g in range(len(groups)) for k in range(len(groups[g])) if groups[g][k] is None][::-1]
        started: list[Trajectory] = []
        ready: list[Trajectory] = []
        for t in (t for grp in groups for t in grp if t is not None and t.ended_by is None):  # paused: go on
            t.order = len(started)
            started.append(t)
            self._enter_round(t, budget, max_rounds)
            if self._fits(t):
                ready.append(t)
        stepping: dict[Future, Trajectory] = {}
        generating: dict[Future, list[Trajectory]] = {}
        limit = self.cfg.max_in_flight or len(waiting) + len(started)
        turn = 0
        unreported = set(range(len(groups))) if on_done is not None else set()
        try:
            while True:
                live = sum(t.ended_by is None and not t.paused for t in started)
                while waiting and live < limit:  # start episodes while there is room
                    g, k = waiting.pop()
                    rid = records[g].get("id", g)
                    env = self._guarded(lambda: self.env_cls(self.env_args), rid, "its constructor")
                    opening = self._guarded(lambda: env.reset(records[g]), rid, "reset()", closing=env)
                    t = Trajectory(*chat.prompt_ids(self.tok, opening), env, order=len(started), record_id=rid)
                    groups[g][k] = t
                    started.append(t)
                    self._enter_round(t, budget, max_rounds)
                    if self._fits(t):
                        ready.append(t)
                        live += 1
                if not (ready or stepping or generating):
                    break
                for g in sorted(unreported):  # records whose episodes ended while others go on
                    if all(t is not None and t.ended_by is not None for t in groups[g]):
                        unreported.discard(g)
                        on_done(g, groups[g])  # type: ignore[misc, arg-type]
                if ready and len(generating) < self.cfg.engine_calls:  # else they join the next call
                    for ts, prompts, params in self._turn_requests(ready, sampling, turn):
                        if self.engine_pool is None:
                            self._apply_turn(ts, generate(prompts, params), version, stepping)
                        else:
                            generating[self.engine_pool.submit(releasing(generate), prompts, params)] = ts
                    turn += 1
                    ready = []
                if stepping or generating:
                    lock = self.cfg.scheduling == "lockstep"
                    done, _ = wait([*stepping, *generating], return_when="ALL_COMPLETED" if lock else FIRST_COMPLETED)
                    for f in done:
                        if f in generating:
                            self._apply_turn(generating.pop(f), f.result(), version, stepping)
                        elif self._observe(t := stepping.pop(f), f):
                            if t.budget is not None and t.budget <= 0:
                                t.paused = True  # its next turn waits for the next round
                            else:
                                ready.append(t)
        finally:
            for f in [*stepping, *generating]:
                f.cancel()
            for t in started:
                if t.ended_by is None and not t.paused:
                    t.end("error")
        return groups  # type: ignore[return-value]  # every slot was started

    def _failure(self, exc: BaseException, record_id: Any, phase: str) -> PluginCodeError:
        """The run's error for ``exc`` raised by the environment in ``phase`` on ``record_id``."""
        name = getattr(getattr(self.cfg, "env", None), "name", None) or getattr(self.env_cls, "__name__", "?")
        return PluginCodeError.wrap(exc, f"environment '{name}'", f"{ENV_KEY}.name", record_id, phase)

    def _guarded(self, call: Callable[[], Any], record_id: Any, phase: str, closing: Environment | None = None) -> Any:
        """``call()``; what it raises becomes :class:`PluginCodeError` naming the environment (after
        ``closing.close()``: the episode it could not open)."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the environment's code: reported with its name and key
            if closing is not None:
                with contextlib.suppress(Exception):  # the first failure is the one to report
                    closing.close()
            raise self._failure(exc, record_id, phase) from exc

    @staticmethod
    def _enter_round(t: Trajectory, budget: int | None, max_rounds: int) -> None:
        t.rounds += 1
        t.paused = False
        t.budget = budget if budget is not None and t.rounds < max_rounds else None

    def _fits(self, t: Trajectory) -> bool:
        if t.length >= self.cfg.max_total_tokens:
            t.end("max_total_tokens")
            return False
        return True

    def _turn_requests(self, ready: list[Trajectory], sampling: SamplingParams,
                       turn: int) -> list[tuple[list[Trajectory], list[list[int]], SamplingParams]]:
        """The engine calls of one model turn of every ready episode: one per distinct token
        limit (a turn may fill what the episode has left of ``max_total_tokens``, a cut turn what
        it has left of ``max_new_tokens``) and round budget, as ``(episodes, prompts, sampling)``."""
        params = dataclasses.replace(sampling, n=1, seed=None if sampling.seed is None else int(sampling.seed) + 7919 * turn)
        by_budget: dict[tuple[int, int | None], list[Trajectory]] = {}
        for t in sorted(ready, key=lambda t: t.order):  # not the order their steps ended in: reproducible calls
            turn_left = sampling.max_new_tokens - (len(t.final_ids) if t.cut_turn else 0)  # final_ids: the cut turn
            room = max(1, min(turn_left, self.cfg.max_total_tokens - t.length))
            by_budget.setdefault((room, t.budget), []).append(t)
        return [(ts, [t.prompt_ids + t.ids for t in ts], dataclasses.replace(params, max_new_tokens=room,
                                                                              token_budget=budget))
                for (room, budget), ts in by_budget.items()]

    def _apply_turn(self, ts: list[Trajectory], gens: list[list[Generation]], version: int,
                    stepping: dict[Future, Trajectory]) -> None:
        """Append an engine call's turns to their episodes and start their environment steps."""
        for t, g in zip(ts, gens):
            t.add_turn(g[0], version)
            if g[0].finish_reason == "aborted" and t.budget is not None and t.budget <= 0:
                t.paused = t.cut_turn = True  # the round's budget cut the turn: the next round continues it
            elif g[0].finish_reason == "error":
                t.end("error")
            elif g[0].finish_reason != "stop" and (self.cfg.end_on_length or t.length >= self.cfg.max_total_tokens):
                t.end("length")
            elif t.stats["turns"] >= self.cfg.max_turns:
                t.end("max_turns")
            else:
                text = self.tok.decode(t.final_ids, skip_special_tokens=True)
                stepping[self.pool.submit(releasing(TRACE.wrap("environment", "step", t.env.step)), text)] = t

    def _observe(self, t: Trajectory, f: Future) -> bool:
        """Apply a finished environment step to ``t``; whether it goes on to another model turn."""
        exc = f.exception()
        if exc is not None:
            raise self._failure(exc, t.record_id, "step()") from exc
        step: EnvStep = f.result()
        for k, v in step.info.items():
            t.stats[k] = t.stats.get(k, 0.0) + float(v)
        if step.reward is not None:
            t.reward = (t.reward or 0.0) + float(step.reward)
        if step.done:
            t.end("done")
            return False
        stopped = t.finish_reason == "stop"
        stop_text = self.tok.decode(t.final_ids[-1:]) if stopped and len(t.final_ids) else None
        obs = chat.observation_ids(self.tok, step.messages, stopped=stopped, stop_text=stop_text)
        if t.length + len(obs) >= self.cfg.max_total_tokens:
            t.end("max_total_tokens")
            return False
        t.add_observation(obs)
        return True


def report_group(on_group: GroupFn, g: int, group: Sequence[Trajectory], pid: str, meta: dict[str, Any]) -> None:
    """``on_group(g, batch)`` with record ``g``'s trajectories packed as :func:`episodes_to_batch`
    packs them in the whole batch; nothing when they cannot be packed (the whole batch raises)."""
    try:
        batch = episodes_to_batch([group], [pid], [meta])
    except ValueError:
        return
    on_group(g, batch)


def episodes_to_batch(groups: Sequence[Sequence[Trajectory]], ids: Sequence[str],
                      meta: Sequence[dict[str, Any]]) -> Batch:
    """One packed sample per trajectory, group-major (see the module docstring). Token fields
    ``input_ids``, ``loss_mask`` (the model's tokens), ``rollout_logprobs``, ``weight_version``
    (the engine's weight version of each model token, 0 elsewhere; left out when a trajectory
    has none); sample fields
    ``prompt_len``, ``response_len`` (everything after the prompt), ``group``, ``env_reward`` (0
    where the environment gave none); ``meta``: the record's plus ``prompt`` (the rendered
    opening), ``response_ids`` (the last model turn), ``finish_reason`` and ``episode`` (how it
    ended, ``ended_by``, and its counters)."""
    seqs, plens, rlens, grp, sids, metas, lps, masks, rewards, vers = [], [], [], [], [], [], [], [], [], []
    for g, (group, pid, m) in enumerate(zip(groups, ids, meta)):
        for k, t in enumerate(group):
            if not t.ids:
                raise ValueError(f"episode {pid}/{k} has no model tokens (its prompt fills max_total_tokens)")
            seqs.append(t.prompt_ids + t.ids)
            plens.append(len(t.prompt_ids))
            rlens.append(len(t.ids))
            grp.append(g)
            sids.append(f"{pid}/{k}")
            metas.append({**m, "prompt": t.prompt_text, "response_ids": t.final_ids, "finish_reason": t.finish_reason,
                          "episode": {"ended_by": t.ended_by, **t.stats}})
            lps += [0.0] * len(t.prompt_ids) + t.logprobs
            masks += [0.0] * len(t.prompt_ids) + [float(x) for x in t.mask]
            if vers is not None:  # None once a trajectory has no version per token
                vers = vers + [0] * len(t.prompt_ids) + [int(v) for v in t.versions] \
                    if len(t.versions) == len(t.ids) else None
            rewards.append(t.reward or 0.0)
    batch = Batch.from_sequences(seqs, ids=sids, meta=metas, prompt_lens=plens)
    batch.add_token("loss_mask", torch.tensor(masks, dtype=torch.float32))
    batch.add_token("rollout_logprobs", torch.tensor(lps, dtype=torch.float32))
    if vers is not None:
        batch.add_token("weight_version", torch.tensor(vers, dtype=torch.long))
    batch.add_sample("response_len", torch.tensor(rlens, dtype=torch.long))
    batch.add_sample("group", torch.tensor(grp, dtype=torch.long))
    batch.add_sample("env_reward", torch.tensor(rewards, dtype=torch.float32))
    return batch


def episode_metrics(meta: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``episode/<counter>_mean`` per episode (:data:`COUNTERS` and any other number an episode
    counts, such as the agent rollout's), ``episode/error_frac`` (episodes ended by an error),
    ``episode/limit_frac`` (episodes ended by a limit
    rather than by the environment) and ``episode/tool_used_frac`` (episodes that called at least
    one tool)."""
    eps = [m["episode"] for m in meta if "episode" in m]
    if not eps:
        return {}
    extra = sorted({k for e in eps for k, v in e.items() if k not in COUNTERS and isinstance(v, (int, float))})
    out = {f"episode/{k}_mean": sum(float(e.get(k, 0.0)) for e in eps) / len(eps) for k in (*COUNTERS, *extra)}
    out["episode/error_frac"] = sum(e.get("ended_by") == "error" for e in eps) / len(eps)
    out["episode/limit_frac"] = sum(e.get("ended_by") != "done" for e in eps) / len(eps)
    out["episode/tool_used_frac"] = sum(float(e.get("tool_calls", 0.0)) > 0 for e in eps) / len(eps)
    return out

