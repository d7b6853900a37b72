"""Built-in environments and tool-call parsers, registered through the same
``rlweave_environments`` and ``rlweave_tool_parsers`` hooks as third-party plugins (entry point
``builtin-environments`` in core's pyproject.toml). Light: the environment classes and parser
functions are imported by ``record.load()``."""

from __future__ import annotations

from rlweave.plugins import EnvironmentRecord, ToolParserRecord, hookimpl


@hookimpl
def rlweave_environments() -> list[EnvironmentRecord]:
    from rlweave.environments.tools import ToolsArgs

    return [
        EnvironmentRecord(
            name="tools",
            summary="the model calls Python tools declared in YAML (hermes <tool_call> JSON), run in a sandbox",
            target="rlweave.environments.tools:ToolsEnvironment",
            config_model=ToolsArgs,
        ),
    ]


@hookimpl
def rlweave_tool_parsers() -> list[ToolParserRecord]:
    return [
        ToolParserRecord(
            name="hermes",
            summary="Hermes / Qwen function calling: <tool_call>{JSON name and arguments}</tool_call>",
            target="rlweave.environments.parsers:hermes",
            call_format='<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>',
        ),
    ]
