"""A third-party environment package (``plugin_dists/guessenv``, installed with a real dist-info
outside the repository's packages) is listed by ``rlweave list-plugins``, validated by name and
arguments in ``algorithm.multi_turn.env``, and runs episodes; its tool-call parser is listed too,
and the built-in ``tools`` environment reads calls with it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("rlweave_test_installer_env",
                                               Path(__file__).parent / "plugin_dists" / "installer.py")
site_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_helpers)

USE = """
import json
from rlweave.algo_helpers.multi_turn import MultiTurnRollout, episodes_to_batch
from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig, check_multi_turn
from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.plugins.manager import get_plugin_manager
from rlweave.testing.tiny_tokenizer import char_tokenizer

cfg = MultiTurnConfig.model_validate({"env": {"name": "guess", "args": {"bonus": 2.0}}, "max_turns": 6})
bad = check_multi_turn(None, MultiTurnConfig.model_validate({"env": {"name": "guess", "args": {"bonsu": 2.0}}}))
record = get_plugin_manager().get("environment", "guess")
tok = char_tokenizer(["0123456789 abcdefghijklmnopqrstuvwxyz,"])
guesses = iter("5318")

def engine(prompts, params):  # guesses 5, 3, 1, 8 in turn
    return [[Generation(tok(next(guesses))["input_ids"] + [tok.eos_token_id], [-1.0, -1.0], "stop")] for _ in prompts]

rollout = MultiTurnRollout(cfg, record.load(), record.config_model.model_validate(cfg.env.args), tok)
(t,), = rollout.episodes([{"prompt": "", "secret": 8}], 1, SamplingParams(max_new_tokens=4), engine)
rollout.close()

from rlweave.environments.tools import ToolsArgs, ToolsEnvironment
tools = ToolsEnvironment(ToolsArgs(tools=[{"name": "calc", "target": "rlweave.environments.calculator:calculate"}],
                                   parser="parens"))
system = tools.reset({"prompt": "6*7?"})[0]["content"]
obs = tools.step("let me see\\ncalc(expression=6*7)")
tools.close()
ToolsEnvironment.shutdown()
print("RESULT=" + json.dumps({"bad": bad, "reward": t.reward, "turns": t.stats["turns"], "ended_by": t.ended_by,
                              "text": tok.decode(t.prompt_ids + t.ids), "system": system,
                              "obs": obs.messages, "calls": obs.info["tool_calls"]}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return site_helpers.install(["guessenv"], tmp_path_factory.mktemp("envsite"))


def test_third_party_environment_is_listed(site):
    proc = site_helpers.run_python("from rlweave.cli import app; app()", site=site, args=["list-plugins"])
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if " guess " in line)
    assert "environment" in row and "rlweave-testplug-guessenv" in row and " ok " in row
    row = next(line for line in proc.stdout.splitlines() if " parens " in line)
    assert "tool_parser" in row and "rlweave-testplug-guessenv" in row and " ok " in row
    assert any(" hermes " in line and "tool_parser" in line for line in proc.stdout.splitlines())


def test_third_party_environment_is_validated_and_used(site):
    proc = site_helpers.run_python(USE, site=site)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT="))[len("RESULT="):])
    assert res["bad"] == [["algorithm.multi_turn.env.args.bonsu", "unknown key. Did you mean 'bonus'?"]]
    assert res["turns"] == 4 and res["ended_by"] == "done" and res["reward"] == pytest.approx(2.0 - 0.3)
    assert res["text"] == "guess a digit5<eos>higher3<eos>higher1<eos>higher8<eos>"
    # the tools environment with the package's parser: its call format in the system message, its calls run
    assert "name(key=value, ...) on a line of its own" in res["system"] and "<tool_call>" not in res["system"]
    assert res["calls"] == 1 and res["obs"][0]["content"] == "42", res["obs"]
