"""Built-in environments, registered through the same ``rlweave_environments`` hook as
third-party environment plugins (entry point ``builtin-environments`` in core's pyproject.toml).
Light: the environment classes are imported by ``record.load()``."""

from __future__ import annotations

from rlweave.plugins import EnvironmentRecord, hookimpl


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
