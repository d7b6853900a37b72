"""The rollout of ``algorithm.multi_turn.agent``: each episode is one call of the user's agent
function, which talks to the policy through the run's OpenAI-compatible endpoint (:mod:`.server`).

For each record, ``n`` episodes (one per sample of the group), at most ``max_in_flight`` at once
(the next starts when one ends; null: all), each in a thread of its own with a limit on its own
time (``agent.timeout_s``: wall-clock seconds less those during which one of its requests waited
for the engine, :mod:`.clock`; a busy engine never times an episode out). The endpoint keeps each
episode's token ids (:mod:`.ledger`), and its requests go to the engine through the ``generate``
of :meth:`Rollout.run`, batched across episodes (:mod:`.engine_queue`), so the trajectories are
what the episode rollout makes:
:func:`~rlweave.algo_helpers.multi_turn.episodes_to_batch` packs them, the loss mask 1 on the
model's sampled ids only. An episode may hold several samples (a reset, a fork; see the ledger):
each is a trajectory of the record's group with the episode's reward.

The reward: the number the agent returns (``env_reward``), or with None the run's ``rewards``
alone, scoring the episode's final answer (the last model turn it was given). An agent that
raises, times out, returns something else or makes no request ends its episode as an **error**:
counted (``episode/agent_errors_mean``), logged (the first few with their traceback), never the
run's end; its samples get reward 0 and no final answer, and with ``on_error: exclude`` (default)
a loss mask of 0, with ``on_error: zero`` they are trained with that reward. An ``async def``
agent whose episode ended (timed out, or the rollout stopped) is cancelled; a plain function's
thread is left to end on its own (its requests are refused from then on).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from rlweave.algo_helpers import chat
from rlweave.algo_helpers.agent.engine_queue import EngineQueue
from rlweave.algo_helpers.agent.episode import AgentEpisode
from rlweave.algo_helpers.agent.ledger import Ledger
from rlweave.algo_helpers.agent.server import Endpoint
from rlweave.algo_helpers.multi_turn import Trajectory, episodes_to_batch, report_group
from rlweave.data.batch import Batch
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.rollout import GenerateFn, GroupFn, Rollout
from rlweave.rewards.fields import reward_fields

log = logging.getLogger("rlweave.algo")
#: agent failures logged with their traceback per rollout (the rest are counted only)
LOGGED_ERRORS = 5


class AgentRollout(Rollout):
    """See the module docstring. ``cfg``: the validated ``algorithm.multi_turn`` (with ``agent``);
    ``agent``: the user's function. The endpoint starts on the first :meth:`run` and stops in
    :meth:`close`. :meth:`run` reports each record whose episodes all ended to ``on_group``
    (:mod:`rlweave.interfaces.rollout`)."""

    reports_groups = True

    def __init__(self, cfg: Any, agent: Callable[[AgentEpisode], Any], tokenizer: Any):
        self.cfg, self.agent, self.tok = cfg, agent, tokenizer
        self.endpoint: Endpoint | None = None
        self.logged = 0
        self.last: dict[str, float] = {}  # the last run's counts (engine calls, engine seconds, errors)

    @classmethod
    def create(cls, ctx: Any) -> "AgentRollout":
        from rlweave.plugins.references import user_function

        return cls(ctx.args, user_function(ctx.args.agent.target, "agent"), ctx.tokenizer)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None

    def run(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
            version: int = 0, on_group: GroupFn | None = None) -> Batch:
        """``n`` agent episodes per record as one batch (:func:`episodes_to_batch`); ``on_group``:
        told of each record whose episodes all ended while others still run."""
        ids, meta = [str(r.get("id", i)) for i, r in enumerate(records)], [reward_fields(r) for r in records]
        done = None if on_group is None else (lambda g, ts: report_group(on_group, g, ts, ids[g], meta[g]))
        groups = self.episodes(records, n, sampling, generate, version, on_done=done)
        return episodes_to_batch(groups, ids, meta)

    def episodes(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
                 version: int = 0,
                 on_done: Callable[[int, list[Trajectory]], None] | None = None) -> list[list[Trajectory]]:
        """``n`` episodes per record, each record's samples as one group (see the module docstring);
        ``on_done(g, samples)``: called once per record ``g`` whose episodes all ended while others
        still run."""
        ep = self._endpoint()
        todo = deque((g, k) for g in range(len(records)) for k in range(n))
        limit_n, limit_s = self.cfg.max_in_flight or len(todo), self.cfg.agent.timeout_s
        running: dict[Future, tuple[int, Ledger, _Cancel]] = {}
        groups: list[list[Trajectory]] = [[] for _ in records]
        left = [n] * len(records)  # episodes of each record not ended yet
        engine = EngineQueue(generate, lambda: len(running), sampling.seed)
        ep.serve(engine, sampling, version)
        errors = 0
        try:
            while todo or running:
                while todo and len(running) < limit_n:
                    g, _ = todo.popleft()
                    fut, ledger, cancel = self._start(ep, records[g])
                    running[fut] = (g, ledger, cancel)
                # no episode's own time can run out sooner: a clock runs at most as fast as the wall's
                room = min(limit_s - ledger.clock.own_s() for _, ledger, _ in running.values())
                done, _ = wait(list(running), timeout=max(0.0, room), return_when=FIRST_COMPLETED)
                for fut in [f for f, (_, ledger, _) in running.items()
                            if f in done or f.done() or ledger.clock.own_s() >= limit_s]:
                    g, ledger, cancel = running.pop(fut)
                    why = "finished" if fut.done() else f"timed out after {limit_s:g} s of its own time"
                    ep.close_episode(ledger.eid, why)
                    cancel()
                    samples, failed = self._finish(fut, ledger, records[g], why)
                    groups[g] += samples
                    errors += failed
                    left[g] -= 1
                    if on_done is not None and left[g] == 0 and (todo or running):
                        on_done(g, groups[g])
        finally:
            for fut, (_, ledger, cancel) in running.items():
                ep.close_episode(ledger.eid, "the rollout stopped")
                cancel()
            ep.serve(None, sampling, version)
            engine.close()
        self.last = {"engine_calls": float(engine.calls), "engine_s": engine.busy_s, "errors": float(errors)}
        return groups

    # ------------------------------------------------------------------ one episode
    def _endpoint(self) -> Endpoint:
        if self.endpoint is None:
            from rlweave.environments.parsers import resolve_parser

            parse, _ = resolve_parser(self.cfg.agent.parser)
            self.endpoint = Endpoint(self.tok, parse)
            self.endpoint.start()
        return self.endpoint

    def _start(self, ep: Endpoint, record: dict[str, Any]) -> tuple[Future, Ledger, "_Cancel"]:
        eid = secrets.token_hex(8)
        ledger = Ledger(eid, record, self.tok, self.cfg.max_turns, self.cfg.max_total_tokens)
        ep.open(ledger)
        episode = AgentEpisode(dict(record), ep.base_url(eid), ep.token, eid)
        fut: Future = Future()
        cancel = _Cancel()

        def body() -> None:
            try:
                fut.set_result(_call(self.agent, episode, cancel))
            except BaseException as exc:  # noqa: BLE001 - the agent's failure ends its episode only
                fut.set_exception(exc)
            finally:
                client = episode.__dict__.get("client")
                if client is not None:
                    client.close()

        threading.Thread(target=body, name=f"rlweave-agent-{eid}", daemon=True).start()
        return fut, ledger, cancel

    def _finish(self, fut: Future, ledger: Ledger, record: dict[str, Any], why: str) -> tuple[list[Trajectory], int]:
        """The episode's trajectories and whether it is an error (see the module docstring)."""
        error, reward = None, None
        if not fut.done():
            error = why
        elif fut.exception() is not None:
            exc = fut.exception()
            error = f"{type(exc).__name__}: {exc}"
            if self.logged < LOGGED_ERRORS:
                self.logged += 1
                log.warning("agent %s raised on record %r", self.cfg.agent.target, record.get("id"), exc_info=exc)
        else:
            reward = fut.result()
            if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
                error, reward = f"the agent returned {reward!r}; expected a number or None", None
        with ledger.lock:
            samples = ledger.trajectories()
        if not samples and error is None:
            error = "the agent made no model request"
        if error is not None and self.logged < LOGGED_ERRORS and not (fut.done() and fut.exception() is not None):
            self.logged += 1
            log.warning("agent %s on record %r: %s", self.cfg.agent.target, record.get("id"), error)
        if not samples:
            samples = [self._placeholder(record, ledger)]
        for t in samples:
            t.ended_by = "done" if error is None else "error"
            t.reward = None if reward is None else float(reward)
            if error is not None:
                t.stats["agent_errors"] = 1.0
                t.reward, t.final_ids = 0.0, []
                if self.cfg.agent.on_error == "exclude":
                    t.mask = [0] * len(t.mask)
        return samples, int(error is not None)

    def _placeholder(self, record: dict[str, Any], ledger: Ledger) -> Trajectory:
        """A sample for an episode with no model turn: the record's prompt and one untrained token."""
        from rlweave.algo_helpers.rollout import record_prompt

        eos = getattr(self.tok, "eos_token_id", None)
        try:
            ids, text = chat.prompt_ids(self.tok, [{"role": "user", "content": record_prompt(record)}])
        except (ValueError, KeyError, TypeError):
            ids, text = [eos or 0], ""
        t = Trajectory(ids, text, record_id=ledger.eid)
        t.add_observation([eos or 0])
        t.stats.update(ledger.counts)
        return t


class _Cancel:
    """Cancels an ``async def`` agent's task from the rollout's thread when its episode ends (a
    plain function's thread cannot be stopped: its later requests are refused instead)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: tuple[asyncio.AbstractEventLoop, asyncio.Task] | None = None
        self._cancelled = False

    def bind(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
        with self._lock:
            self._task = (loop, task)
            if self._cancelled:
                task.cancel()

    def __call__(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._task is not None:
                loop, task = self._task
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # its loop has closed: the agent already ended
                    pass


def _call(agent: Callable[[AgentEpisode], Any], episode: AgentEpisode, cancel: _Cancel) -> Any:
    """Run ``agent(episode)``: a coroutine (an ``async def`` agent) in an event loop of its own,
    cancelled by ``cancel()`` (its episode ended: timed out or the rollout stopped)."""
    if inspect.iscoroutinefunction(agent):
        async def cancellable() -> Any:
            task = asyncio.ensure_future(agent(episode))
            cancel.bind(asyncio.get_running_loop(), task)
            try:
                return await task
            finally:
                client = episode.__dict__.get("async_client")
                if client is not None:
                    await client.close()

        return asyncio.run(cancellable())
    out = agent(episode)
    return asyncio.run(out) if inspect.isawaitable(out) else out
