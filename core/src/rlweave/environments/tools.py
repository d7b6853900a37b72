"""The built-in ``tools`` environment: the model calls Python functions declared in YAML.

Each episode opens with a system message listing the tools (name, typed arguments, the first
line of their docstring) and how to call them (the parser's format), then the record's prompt as
the user message. After each model turn the calls in its text are parsed (``parser``, default
``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and run; each result
comes back as a ``tool`` message. A turn without a tool call is the final answer and ends the
episode (the run's rewards score it).

Tools run in sandboxed worker processes (:class:`rlweave.sandbox.pool.RewardPool` with text
results): an address-space limit (``memory_mb``), a time limit per call (``timeout_s``), no child
processes, network off unless ``network: true``. Whatever goes wrong in a call (an exception, a
timeout, a crash, an allocation past the limit, bad JSON, an unknown tool, arguments the function
does not take, more than ``max_tool_calls`` calls in an episode) becomes an error message to the
model (``error: ...``) and counts in ``tool_errors``; the episode goes on.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlweave.interfaces.environment import Environment, EnvStep


class ToolSpec(BaseModel):
    """One tool: the name the model calls it by and the Python function behind it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, description="Name the model uses in its calls.")
    target: str = Field(..., description="The function, as module:function or path/to/file.py:function (typed "
                        "keyword arguments), e.g. rlweave.environments.calculator:calculate.")
    description: str | None = Field(None, description="What the tool does; null: its docstring's first line.")

    @field_validator("target")
    @classmethod
    def _importable(cls, v: str) -> str:
        from rlweave.plugins.references import user_function

        user_function(v, "tool")  # a missing file, module or function fails validation (TargetError: a ValueError)
        return v


class ToolsArgs(BaseModel):
    """``algorithm.multi_turn.env.args`` of the ``tools`` environment."""

    model_config = ConfigDict(extra="forbid")

    tools: list[ToolSpec] = Field(..., min_length=1, description="The tools the model may call.")
    parser: str = Field("hermes", description="Tool-call parser (rlweave list-plugins shows them): hermes, a "
                        "plugin's, or module:function.")
    max_tool_calls: int = Field(8, ge=0, description="Tool calls run per episode; later calls get an error message.")
    timeout_s: float = Field(5.0, gt=0, description="Wall-clock limit of one tool call (its worker is replaced).")
    memory_mb: int | None = Field(1024, ge=64, description="Address-space limit of a tool worker; null: none.")
    network: bool = Field(False, description="Let tools open network connections.")
    system_prompt: str | None = Field(
        None, description="The episode's system message; null: one listing the tools and the call format; '' none.")
    prompt_key: str = Field("prompt", description="Record field holding the user's message.")

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        from rlweave.environments.parsers import resolve_parser

        try:  # an unknown name or a bad reference fails validation, before any worker starts
            resolve_parser(v, load=False)
        except LookupError as exc:
            raise ValueError(str(exc)) from None
        return v


def _signature(target: str) -> tuple[str, str]:
    """``(arguments with their types, first docstring line)`` of the tool function ``target``."""
    from rlweave.plugins.references import user_function

    fn = user_function(target, "tool")
    params = []
    for p in inspect.signature(fn).parameters.values():
        ann = p.annotation
        kind = ann.__name__ if isinstance(ann, type) else (str(ann) if ann is not inspect.Parameter.empty else "any")
        params.append(f"{p.name}: {kind}")
    doc = (inspect.getdoc(fn) or "").strip().splitlines()
    return ", ".join(params), doc[0] if doc else ""


def system_text(args: ToolsArgs, call_format: str) -> str:
    """The default system message: the tools and the parser's ``call_format``."""
    lines = ["You can call these tools:"]
    for t in args.tools:
        params, doc = _signature(t.target)
        lines.append(f"- {t.name}({params}): {t.description or doc}".rstrip(": "))
    how = f"To call a tool, write {call_format}. " if call_format else ""
    lines.append(how + "Answer without a tool call when you are done.")
    return "\n".join(lines)


class ToolRunner:
    """Runs tool calls in sandboxed workers: one single-worker pool per calling thread (the
    rollout steps episodes in threads, so one slow tool holds only its own episode)."""

    def __init__(self, args: ToolsArgs):
        from rlweave.sandbox.limits import SandboxLimits

        self.targets = [t.target for t in args.tools]
        self.timeout_s = args.timeout_s
        self.limits = SandboxLimits(memory_mb=args.memory_mb, cpu_s=None, private_dir=True, network=args.network,
                                    processes=False)
        self._pools: dict[int, Any] = {}
        self._lock = threading.Lock()

    def call(self, index: int, arguments: dict[str, Any]) -> tuple[str, str]:
        """``(status, text)`` of one call: ``ok`` and the result, or ``error`` / ``timeout`` /
        ``crash`` and why."""
        from rlweave.sandbox.pool import RewardPool

        me = threading.get_ident()
        with self._lock:
            pool = self._pools.get(me)
            if pool is None:
                pool = self._pools[me] = RewardPool(self.targets, workers=1, timeout_s=self.timeout_s,
                                                    sandbox=self.limits, numeric=False)
        status, value = pool.run([(index, arguments)])[0]
        return status, str(value)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


_RUNNERS: dict[str, ToolRunner] = {}
_RUNNERS_LOCK = threading.Lock()


def runner_for(args: ToolsArgs) -> ToolRunner:
    """The process-wide runner of this tool set (its workers are shared by the episodes)."""
    key = args.model_dump_json()
    with _RUNNERS_LOCK:
        if key not in _RUNNERS:
            _RUNNERS[key] = ToolRunner(args)
        return _RUNNERS[key]


def close_runners() -> None:
    """Stop every tool worker (the end of a rollout's life; safe to call twice)."""
    with _RUNNERS_LOCK:
        runners = list(_RUNNERS.values())
        _RUNNERS.clear()
    for r in runners:
        r.close()


def _first_line(text: str) -> str:
    return next((line for line in text.strip().splitlines() if line.strip()), text.strip())[:300]


class ToolsEnvironment(Environment):
    """One episode with tools (see the module docstring)."""

    def __init__(self, args: Any = None):
        args = args if isinstance(args, ToolsArgs) else ToolsArgs.model_validate(dict(args or {}))
        super().__init__(args)
        from rlweave.environments.parsers import resolve_parser

        self.parse, self.call_format = resolve_parser(args.parser)
        self.index = {t.name: i for i, t in enumerate(args.tools)}
        self.calls = 0

    @classmethod
    def shutdown(cls) -> None:
        close_runners()

    def reset(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        a = self.args
        if a.prompt_key not in record:
            raise KeyError(f"tools environment: the record has no {a.prompt_key!r} field (env.args.prompt_key); "
                           f"its fields: {sorted(record)}")
        system = system_text(a, self.call_format) if a.system_prompt is None else a.system_prompt
        msgs = [{"role": "system", "content": system}] if system else []
        return msgs + [{"role": "user", "content": str(record[a.prompt_key])}]

    def step(self, action: str) -> EnvStep:
        calls, problems = self.parse(action)
        if not calls and not problems:
            return EnvStep(done=True)
        a = self.args
        out: list[dict[str, Any]] = []
        info = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_time_s": 0.0}

        def reply(name: str, text: str, error: bool = False) -> None:
            out.append({"role": "tool", "name": name, "content": f"error: {text}" if error else text})
            info["tool_errors"] += float(error)

        for p in problems:
            reply("?", p, error=True)
        runner = runner_for(a)
        for c in calls:
            if self.calls >= a.max_tool_calls:
                reply(c.name, f"tool call limit reached (max_tool_calls={a.max_tool_calls})", error=True)
                continue
            self.calls += 1
            info["tool_calls"] += 1
            if c.name not in self.index:
                reply(c.name, f"unknown tool {c.name!r}; tools: {', '.join(self.index)}", error=True)
                continue
            t0 = time.perf_counter()
            status, text = runner.call(self.index[c.name], c.arguments)
            info["tool_time_s"] += time.perf_counter() - t0
            if status == "ok":
                reply(c.name, text)
            else:
                reply(c.name, _first_line(text) if status == "error" else f"{status}: {_first_line(text)}", error=True)
        return EnvStep(messages=out, info=info)
