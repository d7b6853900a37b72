"""The controller's rollout queue: groups of samples generated in rounds, several generate
requests in flight, every token stamped with the policy version that produced it.

Used by algorithms that sample groups (GRPO) for partial rollout and the ``one_step_off`` /
``async`` run modes. Single-threaded: the algorithm drives it from its step on the controller.

* **Admission.** :meth:`RolloutQueue.admit` adds one group per data record (``n`` samples of
  one prompt), in order. Complete groups leave with the oldest token first, then in admission
  order (:meth:`RolloutQueue.take`).
* **Rounds.** :meth:`RolloutQueue.dispatch` asks the engine to generate every unfinished sample
  that has no request in flight, continuing it from prompt + its tokens so far. With a
  ``token_budget`` (partial rollout) a round gives each sample at most that many tokens and a
  sample cut by it (``finish_reason="aborted"``) is continued in a later round; in its
  ``max_rounds``-th round it has no budget and is generated to the end. A sample's total never
  exceeds ``max_new_tokens`` (tokens past it are dropped here, ``finish_reason="length"``).
* **Versions.** :attr:`RolloutQueue.version` is the policy version of the weights the engine
  holds (the algorithm sets it with each weight sync it submits; generate calls reach the
  engine after the syncs submitted before them). Each token keeps the version the engine
  stamped (``Generation.versions``), else the queue's version when its request was sent.
* **Staleness.** With ``max_staleness`` set, a sample whose oldest token is more than
  ``max_staleness`` versions behind the policy is discarded and generated again from its
  prompt (counted in :attr:`RolloutQueue.regenerated`) when the queue dispatches or hands
  out groups, so no group :meth:`take` returns is staler than the bound.
* **Checkpoints.** :meth:`state_dict` is JSON: the groups not yet taken with each sample's
  progress as merged so far. Requests still in flight are not part of it: after a restore
  their samples are generated again from where the state left them, so no group is lost or
  trained twice.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.scheduler.future import wait_any

#: the longest one wait for the engine's requests in flight (and, in the pipeline, the trainer's
#: call) lasts before the waiter looks again; it returns as soon as one of them finishes
WAIT_S = 1.0


@dataclass
class SampleState:
    """One sample's progress: the response so far, its engine log-probs and versions
    (aligned), ``finish_reason`` (None while unfinished) and the rounds it has taken."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    rounds: int = 0
    truncated: bool = False
    error: str | None = None

    def reset(self) -> None:
        """Back to an empty response (regenerated from the prompt)."""
        self.tokens, self.logprobs, self.versions = [], [], []
        self.finish_reason, self.rounds, self.truncated, self.error = None, 0, False, None


@dataclass
class GroupState:
    """One prompt and its samples; ``serial`` is its admission order, ``record`` the data
    record, ``meta`` what the algorithm wants back with it (JSON-able)."""

    serial: int
    record: dict[str, Any]
    prompt_ids: list[int]
    samples: list[SampleState]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def generation(self, k: int) -> Generation:
        s = self.samples[k]
        return Generation(list(s.tokens), list(s.logprobs), s.finish_reason or "aborted", error=s.error,
                          truncated=s.truncated, versions=list(s.versions))


@dataclass
class _Request:
    future: Any
    entries: list[tuple[int, int]]  # (group serial, sample index), in prompt order
    version: int
    sent: float
    room: list[int]  # tokens each sample may still take


class RolloutQueue:
    """See the module docstring.

    ``n``: samples per group; ``max_new_tokens``: a sample's whole response budget;
    ``token_budget`` / ``max_rounds``: partial rollout (None: every round runs to the end);
    ``max_staleness``: the bound (None: none); ``request_groups``: groups per generate request
    (None: one request per :meth:`dispatch`); ``max_in_flight``: requests on the engine at once
    (None: no limit), so that a weight sync queued behind them reaches the engine soon;
    ``round_per_version``: a sample gets one round per weight version (:attr:`version`) while
    other samples are waiting for theirs (``token_budget`` tokens a step, in a sync step)."""

    def __init__(self, n: int, max_new_tokens: int, token_budget: int | None = None, max_rounds: int = 1,
                 max_staleness: int | None = None, request_groups: int | None = None,
                 max_in_flight: int | None = None, round_per_version: bool = False):
        self.n, self.max_new_tokens = int(n), int(max_new_tokens)
        self.token_budget, self.max_rounds = token_budget, max(1, int(max_rounds))
        self.max_staleness, self.request_groups = max_staleness, request_groups
        self.max_in_flight = max_in_flight
        self.round_per_version = round_per_version
        self.groups: dict[int, GroupState] = {}
        self.in_flight: list[_Request] = []
        self._busy: set[tuple[int, int]] = set()
        self.next_serial = 0
        self.version = 0
        self.regenerated = 0
        self.first_rounds = [0, 0]  # groups whose first round ended, of them complete
        self.idle_s = 0.0  # seconds with no request in flight (see :meth:`poll`)
        self._idle_since: float | None = time.perf_counter()

    # ------------------------------------------------------------- admission
    def admit(self, records: list[dict[str, Any]], prompt_ids: list[list[int]],
              metas: list[dict[str, Any]] | None = None) -> None:
        """Add one group per record (``prompt_ids[i]`` its prompt tokens)."""
        metas = metas or [{} for _ in records]
        for rec, ids, meta in zip(records, prompt_ids, metas):
            serial = self.next_serial
            self.next_serial += 1
            self.groups[serial] = GroupState(serial, dict(rec), list(ids), [SampleState() for _ in range(self.n)],
                                             dict(meta))

    def __len__(self) -> int:
        """Groups admitted and not yet taken."""
        return len(self.groups)

    def ready(self) -> int:
        """Complete groups waiting to be taken."""
        return sum(1 for g in self.groups.values() if g.complete)

    def unfinished_samples(self) -> int:
        return sum(1 for g in self.groups.values() for s in g.samples if s.finish_reason is None)

    def started(self) -> int:
        """Groups with a sample sent to the engine at least once (merged, finished or in
        flight). Rounds go to the first ``groups`` groups in admission order, so these are
        always a prefix of the queue."""
        return sum(1 for g in self.groups.values()
                   if any(s.rounds or s.finish_reason is not None or (g.serial, k) in self._busy
                          for k, s in enumerate(g.samples)))

    # ------------------------------------------------------------- staleness
    def _too_old(self, s: SampleState, policy_version: int) -> bool:
        return self.max_staleness is not None and bool(s.versions) and \
            policy_version - min(s.versions) > self.max_staleness

    def _expire(self, policy_version: int) -> int:
        """Reset samples (not in flight) older than the bound; returns how many."""
        count = 0
        for g in self.groups.values():
            for k, s in enumerate(g.samples):
                if (g.serial, k) not in self._busy and self._too_old(s, policy_version):
                    s.reset()
                    count += 1
        self.regenerated += count
        return count

    # --------------------------------------------------------------- requests
    def pending(self, groups: int | None = None) -> list[tuple[int, int]]:
        """Unfinished samples with no request in flight, in admission order (of the first
        ``groups`` groups only, when given)."""
        heads = list(self.groups.values())[:groups] if groups is not None else self.groups.values()
        return [(g.serial, k) for g in heads for k, s in enumerate(g.samples)
                if s.finish_reason is None and (g.serial, k) not in self._busy]

    def dispatch(self, generate: Callable[[list[list[int]], SamplingParams], Any],
                 params: Callable[[int], SamplingParams], policy_version: int, groups: int | None = None) -> int:
        """Send every pending sample to ``generate`` (a role handle's ``generate``: returns a
        future), continuing each from its tokens so far; ``params(salt)`` gives the call's
        sampling settings (its ``n``, ``max_new_tokens`` and ``token_budget`` are set here).
        Samples too old for the bound at ``policy_version`` start over first. Sends nothing
        beyond ``max_in_flight`` requests, and only samples of the first ``groups`` groups when
        given. Returns the number of requests sent."""
        self._expire(policy_version)
        todo = self.pending(groups)
        if self.round_per_version:
            # a sample that had a round with the weights of this version waits for the next
            # version, unless nothing else is left to generate
            todo = [e for e in todo if not self._had_round(e)] or todo
        if not todo or (self.max_in_flight is not None and len(self.in_flight) >= self.max_in_flight):
            return 0
        chunks: list[list[tuple[int, int]]] = []
        if self.request_groups:
            by_group: dict[int, list[tuple[int, int]]] = {}
            for e in todo:
                by_group.setdefault(e[0], []).append(e)
            serials = list(by_group)
            for i in range(0, len(serials), self.request_groups):
                chunks.append([e for s in serials[i:i + self.request_groups] for e in by_group[s]])
        else:
            chunks.append(todo)
        sent = 0
        for chunk in chunks:
            if self.max_in_flight is not None and len(self.in_flight) >= self.max_in_flight:
                break
            final = {e for e in chunk if self._sample(e).rounds + 1 >= self.max_rounds or self.token_budget is None}
            last = [e for e in chunk if e in final]
            cut = [e for e in chunk if e not in final]
            for entries, budget in ((cut, self.token_budget), (last, None)):
                if entries:
                    self._send(generate, params, entries, budget)
                    sent += 1
        return sent

    def _had_round(self, entry: tuple[int, int]) -> bool:
        versions = self._sample(entry).versions
        return bool(versions) and versions[-1] >= self.version

    def _sample(self, entry: tuple[int, int]) -> SampleState:
        return self.groups[entry[0]].samples[entry[1]]

    def _send(self, generate, params, entries: list[tuple[int, int]], budget: int | None) -> None:
        room = [self.max_new_tokens - len(self._sample(e).tokens) for e in entries]
        prompts = [self.groups[s].prompt_ids + self._sample((s, k)).tokens for s, k in entries]
        p = params(entries[0][0] * 131 + self._sample(entries[0]).rounds)
        p.n = 1
        p.max_new_tokens = max(room)
        p.token_budget = budget
        fut = generate(prompts, p)
        self.in_flight.append(_Request(fut, entries, self.version, time.perf_counter(), room))
        self._busy.update(entries)
        if self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None

    def poll(self, block: bool = False) -> int:
        """Merge the results of finished requests, in the order they finished (with ``block``,
        wait until one has finished); returns how many were merged. An engine that runs several
        calls at once finishes them in any order."""
        merged = 0
        while self.in_flight:
            done = [req for req in self.in_flight if req.future.done()]
            if not done and block and merged == 0:
                if len(self.in_flight) == 1:
                    done = self.in_flight[:1]  # its result() waits
                else:
                    wait_any([req.future for req in self.in_flight], WAIT_S)
                    continue
            if not done:
                break
            for req in done:
                self.in_flight.remove(req)
                self._merge(req, req.future.result())
                merged += 1
        if not self.in_flight and self._idle_since is None:
            self._idle_since = time.perf_counter()
        return merged

    def first_round_rate(self) -> float:
        """Share of the groups whose first round (all ``n`` samples in one request) left them
        complete, counting one group that did so before any was seen."""
        rounds, complete = self.first_rounds
        return (complete + 1) / (rounds + 1)

    def _merge(self, req: _Request, gens: list[list[Generation]]) -> None:
        firsts = {serial for serial, _ in req.entries if self._sample((serial, 0)).rounds == 0} \
            if all(serial in self.groups for serial, _ in req.entries) else set()
        for (serial, k), room, glist in zip(req.entries, req.room, gens):
            self._busy.discard((serial, k))
            group = self.groups.get(serial)
            if group is None:  # dropped by a restore while in flight
                continue
            s = group.samples[k]
            gen = glist[0]
            toks, lps = list(gen.token_ids)[:room], list(gen.logprobs)[:room]
            vers = list(gen.versions)[:room] if len(gen.versions) == len(gen.token_ids) else [req.version] * len(toks)
            s.tokens += toks
            s.logprobs += lps
            s.versions += vers
            s.rounds += 1
            s.truncated = s.truncated or gen.truncated
            if gen.finish_reason == "error":
                s.finish_reason, s.error = "error", gen.error
            elif len(gen.token_ids) > room or (len(s.tokens) >= self.max_new_tokens and gen.finish_reason == "aborted"):
                s.finish_reason = "length"
            elif gen.finish_reason != "aborted":
                s.finish_reason = gen.finish_reason
        for serial in firsts:
            group = self.groups[serial]
            if all(s.rounds == 1 for s in group.samples):
                self.first_rounds[0] += 1
                self.first_rounds[1] += int(group.complete)

    def take_idle(self) -> float:
        """Seconds the engine had no request in flight since the last call."""
        now = time.perf_counter()
        idle, self.idle_s = self.idle_s, 0.0
        if self._idle_since is not None:
            idle += now - self._idle_since
            self._idle_since = now
        return idle

    def wait_ready(self, count: int, generate, params, policy_version: int, keep_busy: bool,
                   groups: int | None = None, widen: Callable[[int], int] | None = None) -> None:
        """Block until ``count`` groups are complete (or nothing more can complete): merge
        finished requests and send the pending samples (of the first ``groups`` groups) again
        as the next round; with ``keep_busy`` after every merge, else once every request of the
        round has been merged and groups are still missing. ``widen(missing)``, when given, is
        asked before each such round for the new ``groups`` (it may admit groups first), so a
        round can start fresh groups beside the unfinished ones instead of waiting for those."""
        while self.ready() < count:
            if not self.in_flight:
                if widen is not None:
                    groups = widen(count - self.ready())
                if self.dispatch(generate, params, policy_version, groups) == 0:
                    return
            self.poll(block=True)
            if keep_busy:
                self.dispatch(generate, params, policy_version, groups)
            else:  # a round ends with the last of its requests (its final-round samples have their own)
                while self.in_flight:
                    self.poll(block=True)

    # ------------------------------------------------------------------ take
    def take(self, count: int, policy_version: int) -> list[GroupState]:
        """Up to ``count`` complete groups, the one with the oldest token first (then the oldest
        admitted), none staler than the bound at ``policy_version`` (stale samples are reset
        instead and their groups stay)."""
        self._expire(policy_version)
        done = [g for g in self.groups.values() if g.complete]
        done.sort(key=lambda g: (min((min(s.versions) for s in g.samples if s.versions), default=policy_version),
                                 g.serial))
        return [self.groups.pop(g.serial) for g in done[:count]]

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the groups not taken, with their samples as merged so far."""
        return {
            "next_serial": self.next_serial,
            "regenerated": self.regenerated,
            "first_rounds": list(self.first_rounds),
            "groups": [{"serial": g.serial, "record": g.record, "prompt_ids": g.prompt_ids, "meta": g.meta,
                        "samples": [asdict(s) for s in g.samples]} for g in self.groups.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; requests in flight are forgotten."""
        self.in_flight, self._busy = [], set()
        self.next_serial = int(state.get("next_serial", 0))
        self.regenerated = int(state.get("regenerated", 0))
        self.first_rounds = [int(x) for x in state.get("first_rounds", [0, 0])]
        self.groups = {}
        for g in state.get("groups", []):
            samples = [SampleState(**s) for s in g["samples"]]
            self.groups[int(g["serial"])] = GroupState(int(g["serial"]), dict(g["record"]), list(g["prompt_ids"]),
                                                       samples, dict(g.get("meta", {})))
