"""Scripted agents of the agent-rollout tests (``test_agent_endpoint.py``, ``test_agent_training.py``):
plain functions written against the stock ``openai`` client, and a tool-call parser that reads
every model turn as a call (a tiny random model writes no well-formed ``<tool_call>``)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from rlweave.environments.parsers import ToolCall

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]


def every_turn_calls(text):
    """A parser for which each turn is a call of ``calculator`` with the turn's text."""
    return [ToolCall("calculator", {"x": text})], []


def _as_message(msg):
    return msg.model_dump(exclude_none=True)


def tool_agent(episode):
    """Two chat turns with a tool result between them; returns the length of the final answer."""
    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    first = episode.client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=4,
                                                   logprobs=True)
    msg = first.choices[0].message
    msgs.append(_as_message(msg))
    for call in msg.tool_calls or []:
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
    if not msg.tool_calls:
        msgs.append({"role": "user", "content": "go on"})
    final = episode.client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=4)
    return float(len(final.choices[0].message.tool_calls[0].function.arguments)) / 10


def forking_agent(episode):
    """n=2 in one request, then continues the second choice."""
    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    first = episode.client.chat.completions.create(model="policy", messages=msgs, n=2, max_tokens=4)
    msgs += [_as_message(first.choices[1].message), {"role": "user", "content": "1+1="}]
    episode.client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    return None


async def parallel_agent(episode):
    """Two requests at once on the same history (async client), then one continuing the first."""
    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    client = episode.async_client
    a, b = await asyncio.gather(*(client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
                                  for _ in range(2)))
    msgs += [_as_message(a.choices[0].message), {"role": "user", "content": "2+2="}]
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    await client.close()  # in the loop it ran in (scripted() runs it in a loop of its own)
    return 0.5


def editing_agent(episode):
    """Rewrites its history between turns (a reset), then uses the completions endpoint with text
    and with token ids."""
    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    first = episode.client.chat.completions.create(model="policy", messages=msgs, max_tokens=3)
    edited = [{"role": "user", "content": "0" + episode.record["prompt"]},
              {"role": "assistant", "content": first.choices[0].message.content or ""},
              {"role": "user", "content": "3-1="}]
    episode.client.chat.completions.create(model="policy", messages=edited, max_tokens=3)
    c1 = episode.client.completions.create(model="policy", prompt=episode.record["prompt"], max_tokens=3)
    episode.client.completions.create(model="policy", prompt=episode.record["prompt"] + c1.choices[0].text + "=",
                                      max_tokens=3)
    return 0.0


def failing_agent(episode):
    """One turn, then raises (an error episode)."""
    episode.client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+"}],
                                           max_tokens=2)
    raise RuntimeError("the agent's own bug")


def mixed_agent(episode):
    """The agent of the training test: records whose prompt ends with "7=" fail, the rest are
    :func:`tool_agent` episodes."""
    if episode.record["prompt"].endswith("7="):
        return failing_agent(episode)
    tool_agent(episode)
    return None


#: what :func:`timed_agent` saw of its sleeps: "cancelled" when its episode's end cancelled one
SLEEPS: list[str] = []


async def timed_agent(episode):
    """By the record's ``kind``: "quick" asks twice (the engine's time, not its own), "blocks" asks,
    blocks for ``record["sleep_s"]`` (its own code) and asks again, "sleeps" asks and awaits a sleep
    of ``sleep_s`` (noting in :data:`SLEEPS` whether it was cancelled)."""
    client, kind = episode.async_client, episode.record["kind"]
    msgs = [{"role": "user", "content": episode.record["prompt"]}]
    first = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=2)
    if kind == "blocks":
        time.sleep(episode.record["sleep_s"])
    elif kind == "sleeps":
        try:
            await asyncio.sleep(episode.record["sleep_s"])
        except asyncio.CancelledError:
            SLEEPS.append("cancelled")
            raise
        SLEEPS.append("slept")
    msgs += [_as_message(first.choices[0].message), {"role": "user", "content": "1+1="}]
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=2)
    return 1.0


AGENTS = [tool_agent, forking_agent, parallel_agent, editing_agent]


def scripted(episode):
    """One of :data:`AGENTS` by the record's ``kind``."""
    agent = AGENTS[int(episode.record["kind"])]
    if asyncio.iscoroutinefunction(agent):
        return asyncio.run(agent(episode))
    return agent(episode)


_REPLIES_LOCK = threading.Lock()


def recording_agent(episode):
    """Two chat turns with a tool result between them, asking for log-probs; appends each episode's
    replies (their tokens and log-probs, in order) as one JSON line to the file named by the
    environment variable ``AGENT_REPLIES``, and returns None (the run's rewards score it)."""
    msgs, replies = [{"role": "user", "content": episode.record["prompt"]}], []
    for turn in range(2):
        out = episode.client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=4,
                                                     logprobs=True).choices[0]
        replies.append([(t.token, t.logprob) for t in out.logprobs.content])
        msgs.append(_as_message(out.message))
        msgs += [{"role": "tool", "tool_call_id": call.id, "content": "42"} for call in out.message.tool_calls or []]
    with _REPLIES_LOCK, open(os.environ["AGENT_REPLIES"], "a") as f:
        f.write(json.dumps(replies) + "\n")
