"""The calculator task of examples/tools as an ordinary function-calling agent, written only against
the `openai` package: ask, run the calculator on each tool call, send the results back, until the
model answers without a call. rlweave calls `solve` once per episode with an `episode` holding an
OpenAI client pointed at the policy (`episode.client`) and the data record (`episode.record`)."""

from __future__ import annotations

import ast
import json
import operator

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
MAX_TOOL_CALLS = 2
MAX_TURNS = 3

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Numbers, + - * / // % ** and parentheses; anything else is an error message."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / // % ** are allowed")
    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def solve(episode):
    """One episode: returns None, so the run's reward (arith_exact) scores the final answer."""
    messages = [{"role": "user", "content": episode.record["prompt"]}]
    calls = 0
    for _ in range(MAX_TURNS):
        reply = episode.client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                       max_tokens=96).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return None  # the final answer
        for call in reply.tool_calls:
            calls += 1
            if calls > MAX_TOOL_CALLS:
                result = f"error: tool call limit reached (max_tool_calls={MAX_TOOL_CALLS})"
            else:
                try:
                    result = calculator(**json.loads(call.function.arguments))
                except (TypeError, json.JSONDecodeError) as exc:
                    result = f"error: {type(exc).__name__}: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
