"""One agent episode, token by token: its samples and the rule that maps a request onto them.

A **sample** is one trajectory (:class:`~rlweave.algo_helpers.multi_turn.Trajectory`): prompt
ids, then model turns (the engine's sampled ids as they are, loss mask 1, their log-probs and
weight versions) and what the client added between them (loss mask 0). An episode usually is one
sample. A request is mapped like this:

* **chat** (``/v1/chat/completions``): it *extends* a sample when its messages are that sample's
  last request messages, then the assistant reply the endpoint gave for it
  (:func:`~rlweave.algo_helpers.agent.messages.same`), then messages that are not the assistant's
  (tool results, user turns), with the same ``tools``, and the chat template is append-only on
  them: its rendering of the new messages starts with its rendering of the last request and ends
  with the observation text (:func:`rlweave.algo_helpers.chat.observation_text`). Then the
  observation's ids are appended and the model continues the sample's own ids: the reply it was
  given is never re-rendered or re-tokenised.
* **completions** (``/v1/completions``): it extends a sample when its prompt (token ids, or text)
  starts with the sample's ids (or the text the client was shown); the rest is appended.
* Otherwise it **starts a new sample** of the same episode, its prompt the template's rendering
  of the messages (or the prompt), counted: ``resets`` (the history is not the sample's: edited,
  truncated, a reply that is not the one given), ``template_resets`` (the messages extend the
  sample but the template renders the history differently once they are added: a
  non-append-only template). Earlier samples keep their tokens; each model token is trained once,
  in the sample it was sampled in, with the context it was sampled from.
* A request for ``n`` > 1 choices extends the sample with the first and starts one sample per
  other choice (``forks``), its prompt the ids the choices continued.

Requests of one episode may arrive at once: a sample waiting for the engine is not extended by
another request (that one starts a sample of its own).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from rlweave.algo_helpers import chat
from rlweave.algo_helpers.agent.clock import AgentClock
from rlweave.algo_helpers.agent.errors import RequestError
from rlweave.algo_helpers.agent.messages import for_template, same
from rlweave.algo_helpers.multi_turn import Trajectory
from rlweave.interfaces.engine import Generation

#: per-episode counters of the agent rollout (``episode/<name>_mean``)
AGENT_COUNTERS = ("requests", "samples", "resets", "template_resets", "forks", "tool_calls", "agent_errors")


@dataclass
class Sample:
    """A trajectory and what a next request must start with to extend it."""

    traj: Trajectory
    messages: list[dict[str, Any]] | None = None  # chat: last request's messages + the reply given
    tools_key: str = ""
    rendered: str = ""  # chat: the template's text of the last request's messages, with the header
    text: str = ""  # completions: prompt + the texts returned
    open: bool = False  # a model turn ended it: the next request may extend it
    busy: bool = False  # waiting for the engine

    @property
    def context(self) -> list[int]:
        return self.traj.prompt_ids + self.traj.ids


class Ledger:
    """The samples of episode ``eid`` (for ``record``); see the module docstring. ``max_requests``
    model requests at most, ``max_total_tokens`` per sample."""

    def __init__(self, eid: str, record: dict[str, Any], tokenizer: Any, max_requests: int, max_total_tokens: int):
        self.eid, self.record, self.tok = eid, record, tokenizer
        self.max_requests, self.max_total_tokens = max_requests, max_total_tokens
        self.samples: list[Sample] = []
        self.counts = {k: 0.0 for k in AGENT_COUNTERS}
        self.final_ids: list[int] = []  # the last model turn returned: the episode's final answer
        self.closed: str | None = None  # why requests are refused now (the episode ended)
        self.lock = threading.Lock()  # the endpoint's handlers and the rollout share the samples
        self.clock = AgentClock()  # the episode's own time (paused while a request waits for the engine)

    # ------------------------------------------------------------------ requests in
    def admit(self) -> None:
        """Count a request; refuse it once the episode ended or used ``max_requests``."""
        if self.closed is not None:
            raise RequestError(409, f"episode '{self.eid}' has ended ({self.closed})", code="episode_ended")
        if self.counts["requests"] >= self.max_requests:
            raise RequestError(400, f"episode '{self.eid}' made its {self.max_requests} model requests "
                               "(algorithm.multi_turn.max_turns)", code="max_turns_exceeded")
        self.counts["requests"] += 1

    def chat_sample(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Sample:
        """The sample a chat request continues (extended by its new messages), or a new one."""
        tools_key = json.dumps(tools, sort_keys=True) if tools else ""
        full = chat.render(self.tok, for_template(messages), True, tools)
        mismatch = False
        for s in reversed(self.samples):
            k = len(s.messages or ())
            if (s.messages is None or not s.open or s.busy or s.tools_key != tools_key or len(messages) <= k
                    or not all(same(a, b) for a, b in zip(messages, s.messages))
                    or any(m.get("role") == "assistant" for m in messages[k:])):
                continue
            obs = self._observation(s, messages[k:], tools, full)
            if obs is None:
                mismatch = True
                break
            self._append(s, obs)
            s.messages, s.rendered = list(messages), full
            return self._take(s)
        self.counts["template_resets" if mismatch else "resets"] += bool(self.samples)
        ids, text = chat.prompt_ids(self.tok, for_template(messages), tools)
        return self._new(Sample(Trajectory(ids, text, record_id=self.eid), list(messages), tools_key, full))

    def completion_sample(self, prompt: str | list[int]) -> Sample:
        """The sample a completions request continues (extended by the rest of its prompt), or a
        new one."""
        for s in reversed(self.samples):
            if s.messages is not None or not s.open or s.busy:
                continue
            if isinstance(prompt, list) and prompt[:len(s.context)] == s.context:
                self._append(s, prompt[len(s.context):])
                s.text = ""  # token ids from here on: a text prompt no longer extends it
                return self._take(s)
            if isinstance(prompt, str) and s.text and prompt.startswith(s.text):
                self._append(s, chat.encode(self.tok, prompt[len(s.text):]) if len(prompt) > len(s.text) else [])
                s.text = prompt
                return self._take(s)
        self.counts["resets"] += bool(self.samples)
        if isinstance(prompt, list):
            return self._new(Sample(Trajectory(list(prompt), self.tok.decode(prompt), record_id=self.eid)))
        from rlweave.algo_helpers.rollout import encode_prompts

        return self._new(Sample(Trajectory(encode_prompts(self.tok, [prompt])[0], prompt, record_id=self.eid),
                                text=prompt))

    def room(self, sample: Sample) -> int:
        """Tokens the sample may still take (``max_total_tokens``)."""
        return self.max_total_tokens - sample.traj.length

    # ------------------------------------------------------------------ turns back
    def add_choices(self, sample: Sample, gens: list[Generation], version: int, replies: list[Any]) -> None:
        """Append the engine's choices for ``sample``'s request: the first to ``sample``, each other
        to a new sample (a fork: its prompt the ids they continued). ``replies``: per choice, the
        assistant message given (chat) or the text returned (completions)."""
        context, base = sample.context, sample
        messages, text = base.messages, base.text
        for i, (gen, given) in enumerate(zip(gens, replies)):
            if i:
                sample = Sample(Trajectory(list(context), base.traj.prompt_text, record_id=self.eid),
                                tools_key=base.tools_key, rendered=base.rendered)
                self.samples.append(sample)
                self.counts["forks"] += 1
                self.counts["samples"] += 1
            sample.traj.add_turn(gen, version)
            if messages is not None:
                sample.messages = [*messages, given]
            elif text:
                sample.text = text + given
            sample.open, sample.busy = True, False
            if isinstance(given, dict):
                self.counts["tool_calls"] += len(given.get("tool_calls") or ())
            self.final_ids = list(gen.token_ids)
        base.busy = False

    def release(self, sample: Sample) -> None:
        """The request of ``sample`` failed before a turn was added: other requests may take it."""
        sample.busy = False

    def trajectories(self) -> list[Trajectory]:
        """The samples with model tokens, each scoring the episode's final answer."""
        out = []
        for s in self.samples:
            if any(s.traj.mask):
                s.traj.final_ids = list(self.final_ids)
                s.traj.stats.update(self.counts)
                out.append(s.traj)
        return out

    # ------------------------------------------------------------------ helpers
    def _observation(self, s: Sample, new: list[dict[str, Any]], tools: Any, full: str) -> list[int] | None:
        """Ids of the new messages after ``s``'s last turn; None when the template is not
        append-only on them."""
        t = s.traj
        stopped = t.finish_reason == "stop"
        stop_text = self.tok.decode(t.final_ids[-1:]) if stopped and t.final_ids else None
        try:
            text = chat.observation_text(self.tok, for_template(new), stopped, stop_text, tools)
        except ValueError:
            return None
        if not (full.startswith(s.rendered) and full.endswith(text)):
            return None
        return chat.encode(self.tok, text)

    def _append(self, s: Sample, ids: list[int]) -> None:
        if s.traj.length + len(ids) >= self.max_total_tokens:
            raise RequestError(400, f"this request needs {s.traj.length + len(ids)} tokens; the episode's limit is "
                               f"{self.max_total_tokens} (algorithm.multi_turn.max_total_tokens)", "messages",
                               "context_length_exceeded")
        s.traj.add_observation(ids)

    def _take(self, s: Sample) -> Sample:
        s.open, s.busy = False, True
        return s

    def _new(self, s: Sample) -> Sample:
        if s.traj.length >= self.max_total_tokens:
            raise RequestError(400, f"the prompt has {s.traj.length} tokens; the episode's limit is "
                               f"{self.max_total_tokens} (algorithm.multi_turn.max_total_tokens)", "messages",
                               "context_length_exceeded")
        self.samples.append(s)
        self.counts["samples"] += 1
        return self._take(s)
