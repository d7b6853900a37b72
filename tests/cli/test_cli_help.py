"""``--help`` of every command names every option, each with a description."""

from __future__ import annotations

import pytest
import typer
from rlweave import cli as rlweave_cli
from typer.core import TyperOption


@pytest.mark.parametrize("name", ["list-plugins", "validate", "train", "generate", "export", "eval"])
def test_help_lists_every_option_with_a_description(cli, name):
    command = typer.main.get_command(rlweave_cli.app).commands[name]
    result = cli(name, "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    options = [p for p in command.params if isinstance(p, TyperOption)]
    assert options
    for param in command.params:
        assert (param.help or "").strip(), f"{name}: {param.name} has no description"
        # the description is shown (first words; rich may wrap the rest)
        assert " ".join(param.help.split()[:3]) in text, (param.name, result.output)
    for option in options:
        for flag in option.opts:
            assert flag in result.output, (flag, result.output)


def test_commands_are_listed_and_import_nothing_heavy():
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from rlweave import cli; "
            "out = CliRunner().invoke(cli.app, ['--help']).output; "
            "print(all(c in out for c in ('generate', 'export', 'eval')), "
            "[m for m in ('torch', 'ray', 'vllm', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"
