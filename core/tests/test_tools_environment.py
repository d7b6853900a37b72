"""The built-in ``tools`` environment: the hermes parser, the system message, and every way a tool
call can go wrong turning into an error message to the model while the episode goes on (real
sandboxed worker processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from rlweave.environments import parsers
from rlweave.environments.calculator import calculate
from rlweave.environments.tools import ToolsArgs, ToolsEnvironment, close_runners

FNS = str(Path(__file__).with_name("tool_fns") / "fns.py")


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_hermes_parser_reads_calls_and_reports_malformed_ones():
    text = "I will add. " + _call("add", a=1, b=2) + " and " + '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call>'
    calls, problems = parsers.hermes(text)
    assert calls == [parsers.ToolCall("add", {"a": 1, "b": 2}), parsers.ToolCall("add", {"a": 3})] and problems == []
    calls, problems = parsers.hermes("<tool_call>{not json</tool_call><tool_call>[1, 2]</tool_call>")
    assert calls == [] and len(problems) == 2
    assert "not valid JSON" in problems[0] and "string 'name'" in problems[1]
    assert parsers.hermes("the answer is 4") == ([], [])
    fn, call_format = parsers.resolve_parser("hermes")  # a registered plugin record
    assert fn is parsers.hermes and call_format.startswith("<tool_call>")
    with pytest.raises(ValidationError, match="tool-call parser 'xml'.*hermes"):
        ToolsArgs(tools=[{"name": "c", "target": "rlweave.environments.calculator:calculate"}], parser="xml")


def test_calculator():
    assert calculate("12*(3+4)") == "84" and calculate("7/2") == "3.5" and calculate("-2**3") == "-8"
    for bad in ("__import__('os')", "2**1000", "x+1"):
        with pytest.raises(ValueError):
            calculate(bad)


@pytest.fixture
def env():
    tools = [{"name": n, "target": f"{FNS}:{n}"} for n in ("add", "slow", "crash", "hog", "fail")]
    args = ToolsArgs(tools=tools, timeout_s=1.5, memory_mb=512, max_tool_calls=9)
    yield ToolsEnvironment(args)
    close_runners()


def test_reset_lists_the_tools_then_the_prompt(env):
    msgs = env.reset({"prompt": "What is 2+3?", "answer": "5"})
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == "What is 2+3?"
    assert "- add(a: int, b: int): Add two integers." in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    with pytest.raises(KeyError, match="no 'prompt' field"):
        env.reset({"question": "?"})


def test_every_failure_is_an_error_message_and_the_episode_goes_on(env):
    env.reset({"prompt": "p"})
    ok = env.step(_call("add", a=2, b=40))
    assert not ok.done and ok.messages == [{"role": "tool", "name": "add", "content": "42"}]
    assert ok.info["tool_calls"] == 1 and ok.info["tool_errors"] == 0
    bad = env.step(_call("slow", seconds=30) + _call("crash") + _call("hog", gib=10) + _call("fail", message="boom")
                   + _call("nope") + _call("add", a=1) + "<tool_call>{oops</tool_call>")
    got = [m["content"] for m in bad.messages]
    assert not bad.done and len(got) == 7 and all(c.startswith("error: ") for c in got), got
    assert "not valid JSON" in got[0]  # parse problems come first
    assert "timeout" in got[1] and "crash" in got[2] and "MemoryError" in got[3] and "RuntimeError: boom" in got[4]
    assert "unknown tool 'nope'; tools: add, slow, crash, hog, fail" in got[5] and "TypeError" in got[6]
    assert bad.info["tool_errors"] == 7 and bad.info["tool_calls"] == 6
    after = env.step(_call("add", a=1, b=1))  # the workers were replaced: tools still run
    assert after.messages[0]["content"] == "2"
    assert env.step("The answer is 42.").done  # no tool call: the final answer


def test_tool_call_limit(env):
    env.reset({"prompt": "p"})
    env.args.max_tool_calls = 1
    out = env.step(_call("add", a=1, b=2) + _call("add", a=3, b=4))
    assert [m["content"] for m in out.messages] == ["3", "error: tool call limit reached (max_tool_calls=1)"]


def test_a_tool_in_a_file_relative_to_the_run_directory_runs_in_its_sandboxed_worker(tmp_path, monkeypatch):
    """The workers run in private directories of their own: a relative ``file.py`` target is taken
    from where the run starts (the pool makes it absolute before they import it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tools.py").write_text("def twice(x: int) -> int:\n    return 2 * x\n")
    env = ToolsEnvironment(ToolsArgs(tools=[{"name": "twice", "target": "my_tools.py:twice"}], timeout_s=5.0))
    try:
        step = env.step(_call("twice", x=21))
        assert [m["content"] for m in step.messages] == ["42"] and step.info["tool_errors"] == 0.0
    finally:
        close_runners()
