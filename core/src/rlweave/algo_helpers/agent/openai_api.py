"""The OpenAI request schema the endpoint reads, and the responses it writes.

:func:`parse_chat` and :func:`parse_completion` check a request body field by field and raise
:class:`~rlweave.algo_helpers.agent.errors.RequestError` (400, the field in ``param``) for what is
malformed or not supported: ``stream: true``, ``top_logprobs`` above 0, penalties, ``logit_bias``,
a ``response_format`` other than text, ``echo``, ``suffix``, several prompts, an argument the
schema does not have. Supported: ``model`` (any name), ``messages`` / ``prompt`` (text or token
ids), ``n``, ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``,
``seed``, ``logprobs``, ``tools`` and ``tool_choice`` (``none`` turns the parser off; ``auto``,
``required`` and a named function parse the model's calls, they cannot force one).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rlweave.algo_helpers.agent.errors import RequestError

_ROLES = ("system", "developer", "user", "assistant", "tool")
#: accepted and ignored: they do not change what is sampled
_IGNORED = ("user", "metadata", "store", "parallel_tool_calls", "stream_options", "service_tier")
_ZERO = ("frequency_penalty", "presence_penalty")
MAX_N = 64


@dataclass
class Request:
    """A checked request: the sampling fields (None: the run's default) and its input."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    parse_tools: bool = False
    prompt: str | list[int] | None = None


def _bad(message: str, param: str | None = None, code: str | None = None) -> RequestError:
    return RequestError(400, message, param, code)


def _number(body: dict[str, Any], name: str, lo: float, hi: float, integer: bool = False) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise _bad(f"'{name}' must be {'an integer' if integer else 'a number'}, got {v!r}", name, "invalid_type")
    if not lo <= v <= hi:
        raise _bad(f"'{name}' must be between {lo} and {hi}, got {v!r}", name, "invalid_value")
    return v


def _common(body: Any, known: tuple[str, ...]) -> Request:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_json")
    for name in body:
        if name not in known and name not in _IGNORED and name not in _ZERO:
            raise _bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    if body.get("stream"):
        raise _bad("stream is not supported by this endpoint; set stream to false", "stream", "unsupported_value")
    for name in _ZERO:
        if body.get(name) not in (None, 0, 0.0):
            raise _bad(f"'{name}' is not supported (only 0)", name, "unsupported_value")
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported", "logit_bias", "unsupported_value")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("you must provide a model parameter (any name: the run's policy answers)", "model",
                   "missing_required_parameter")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise _bad("'stop' must be a non-empty string or a list of at most 4 of them", "stop", "invalid_value")
    n = _number(body, "n", 1, MAX_N, integer=True)
    max_tokens = _number(body, "max_completion_tokens", 1, 1 << 30, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", 1, 1 << 30, integer=True)
    return Request(model=model, n=n or 1, temperature=_number(body, "temperature", 0, 2),
                   top_p=_number(body, "top_p", 1e-9, 1), max_tokens=max_tokens, stop=stops,
                   seed=_number(body, "seed", -(1 << 63), (1 << 63) - 1, integer=True))


_CHAT = ("model", "messages", "n", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
         "logprobs", "top_logprobs", "tools", "tool_choice", "stream", "logit_bias", "response_format")


def parse_chat(body: Any) -> Request:
    """The checked ``/v1/chat/completions`` request (see the module docstring)."""
    req = _common(body, _CHAT)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty list of messages", "messages", "invalid_value")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(f"messages[{i}] must be an object with a role in {', '.join(_ROLES)}", f"messages[{i}]",
                       "invalid_value")
        if m.get("content") is None and not (m["role"] == "assistant" and m.get("tool_calls")):
            raise _bad(f"messages[{i}] ({m['role']}) has no content", f"messages[{i}].content", "invalid_value")
        if m["role"] == "tool" and not m.get("tool_call_id"):
            raise _bad(f"messages[{i}] (tool) needs a tool_call_id", f"messages[{i}].tool_call_id", "invalid_value")
    req.messages = msgs
    if body.get("top_logprobs"):
        raise _bad("'top_logprobs' is not supported (only 0)", "top_logprobs", "unsupported_value")
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise _bad("'logprobs' must be a boolean", "logprobs", "invalid_type")
    req.logprobs = bool(body.get("logprobs"))
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise _bad("only response_format {type: text} is supported", "response_format", "unsupported_value")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                                  and isinstance((t.get("function") or {}).get("name"), str)
                                                  for t in tools):
            raise _bad("'tools' must be a list of {type: function, function: {name, ...}}", "tools", "invalid_value")
        req.tools = tools or None
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required") and not (
            isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str)):
        raise _bad("'tool_choice' must be none, auto, required or {type: function, function: {name}}",
                   "tool_choice", "invalid_value")
    if choice not in (None, "none") and not req.tools:
        raise _bad("'tool_choice' is only allowed when 'tools' are given", "tool_choice", "invalid_value")
    req.parse_tools = bool(req.tools) and choice != "none"
    return req


_COMPLETION = ("model", "prompt", "n", "temperature", "top_p", "max_tokens", "stop", "seed", "logprobs", "echo",
               "suffix", "best_of", "stream", "logit_bias")


def parse_completion(body: Any) -> Request:
    """The checked ``/v1/completions`` request (see the module docstring)."""
    req = _common(body, _COMPLETION)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in prompt):
        req.prompt = list(prompt)
    elif isinstance(prompt, str) and prompt:
        req.prompt = prompt
    else:
        raise _bad("'prompt' must be one non-empty string or one list of token ids", "prompt", "invalid_value")
    if body.get("echo"):
        raise _bad("'echo' is not supported", "echo", "unsupported_value")
    if body.get("suffix"):
        raise _bad("'suffix' is not supported", "suffix", "unsupported_value")
    if body.get("best_of") not in (None, req.n):
        raise _bad("'best_of' is not supported (only equal to n)", "best_of", "unsupported_value")
    req.logprobs = _number(body, "logprobs", 0, 5, integer=True) is not None
    return req


def _finish(reason: str, tool_calls: bool) -> str:
    if reason == "stop":
        return "tool_calls" if tool_calls else "stop"
    return "length"


def chat_response(req: Request, replies: list[dict[str, Any]], choices: list[Any], tokens: list[list[str]],
                  prompt_tokens: int) -> dict[str, Any]:
    """A ``chat.completion`` object: ``replies`` the assistant messages, ``choices`` the
    generations, ``tokens`` each generation's token texts (for ``logprobs``)."""
    out = []
    for i, (msg, gen, toks) in enumerate(zip(replies, choices, tokens)):
        lp = {"content": [{"token": t, "logprob": float(p), "bytes": list(t.encode()), "top_logprobs": []}
                          for t, p in zip(toks, gen.logprobs)], "refusal": None} if req.logprobs else None
        out.append({"index": i, "message": msg, "logprobs": lp,
                    "finish_reason": _finish(gen.finish_reason, bool(msg.get("tool_calls")))})
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": req.model, "choices": out, "usage": _usage(prompt_tokens, choices)}


def completion_response(req: Request, texts: list[str], choices: list[Any], tokens: list[list[str]],
                        prompt_tokens: int) -> dict[str, Any]:
    """A ``text_completion`` object (see :func:`chat_response`)."""
    out = []
    for i, (text, gen, toks) in enumerate(zip(texts, choices, tokens)):
        offsets, at = [], 0
        for t in toks:
            offsets.append(at)
            at += len(t)
        lp = {"tokens": toks, "token_logprobs": [float(p) for p in gen.logprobs], "top_logprobs": None,
              "text_offset": offsets} if req.logprobs else None
        out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": _finish(gen.finish_reason, False)})
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model, "choices": out, "usage": _usage(prompt_tokens, choices)}


def _usage(prompt_tokens: int, choices: list[Any]) -> dict[str, int]:
    done = sum(len(g.token_ids) for g in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}
