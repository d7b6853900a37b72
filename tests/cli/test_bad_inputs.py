"""Bad inputs end ``rlweave validate`` and ``rlweave train`` with one line and exit code 2.

One table of bad names and references, for every kind a config selects or references: the
environment of a multi-turn run and its arguments, tools, tool-call parsers, rewards, algorithm
parts (advantage estimator, policy loss, loss aggregation, KL estimator, rollout correction and its mode),
rollouts, run modes, algorithms, backends, engines and LoRA target modules. Each case is run
through the command line in this process (typer's runner) for both commands and must give
exactly one line on stderr, ``invalid config: <file>: <key>: <message>``, naming the key and the
kind, with exit code 2 and no traceback; ``train`` must stop before it writes its run directory.

The base config is the tools example (GRPO, multi-turn with the calculator) on a model directory
holding only a tiny Qwen2 ``config.json`` (what validation reads) and a two-record data file; it
validates as it is (checked first). The user files the references point at are written per test
in the working directory: a module that raises when imported, modules defining a few objects.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rlweave import cli as rlweave_cli
from typer.testing import CliRunner

KEY_ENV = "algorithm.multi_turn.env"
KEY_AGENT = "algorithm.multi_turn.agent"
TOOLS = f"{KEY_ENV}.args.tools"
CALC = "rlweave.environments.calculator:calculate"

#: the files the references point at, written in the working directory
USER_FILES = {
    "broken_mod.py": "raise ZeroDivisionError('division by zero at import')\n",
    "user_objs.py": (
        "from rlweave.interfaces.environment import Environment, EnvStep\n"
        "from rlweave.interfaces.algorithm import Algorithm\n"
        "CONST = 3\n"
        "def calc(expression: str) -> str:\n    return expression\n"
        "def parse(text):\n    return [], []\n"
        "def reward(prompt, response, **kw):\n    return 0.0\n"
        "def estimator(**kw):\n    return None\n"
        "class NotEnv:\n    pass\n"
        "class Half(Environment):\n    def reset(self, record):\n        return []\n"
        "class Echo(Environment):\n    def reset(self, record):\n        return []\n"
        "    def step(self, action):\n        return EnvStep(done=True)\n"
    ),
}

QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 64,
         "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 128,
         "max_position_embeddings": 64, "tie_word_embeddings": False}


def _base() -> dict:
    return {
        "run": {"name": "bad", "output_dir": "runs", "total_steps": 1, "scheduler": "in_process"},
        "model": {"path": "model", "dtype": "float32"},
        "resources": {"pools": {"default": {"devices_per_node": 2}}},
        "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 1.0e-4}},
                  "rollout": {"engine": "hf", "devices": 1}},
        "algorithm": {"name": "grpo", "n_samples": 2, "max_new_tokens": 8,
                      "multi_turn": {"env": {"name": "tools", "args": {
                          "tools": [{"name": "calculator", "target": CALC}], "max_tool_calls": 2}},
                          "max_turns": 2, "max_total_tokens": 60}},
        "rewards": [{"name": "arith_exact"}],
        "data": {"train": "train.jsonl", "batch_size": 2},
    }


def _tools(target: str) -> str:
    return f"{TOOLS}=[{{name: calculator, target: '{target}'}}]"


#: (case id, overrides, key the line names, fragments of the message: the kind and what is wrong)
CASES = [
    # -- the environment (algorithm.multi_turn.env.name) and its arguments
    ("env-unknown-name", [f"{KEY_ENV}.name=toolz"], f"{KEY_ENV}.name",
     ["unknown environment 'toolz'", "Did you mean 'tools'?"]),
    ("env-missing-file", [f"{KEY_ENV}.name=no_such_env.py:Env"], f"{KEY_ENV}.name",
     ["file 'no_such_env.py' of environment 'no_such_env.py:Env' not found"]),
    ("env-missing-module", [f"{KEY_ENV}.name=no_such_env_mod:Env"], f"{KEY_ENV}.name",
     ["module 'no_such_env_mod' of environment 'no_such_env_mod:Env' not found"]),
    ("env-missing-class", [f"{KEY_ENV}.name=user_objs.py:Ehco"], f"{KEY_ENV}.name",
     ["environment 'user_objs.py:Ehco'", "has no attribute 'Ehco'", "Did you mean 'Echo'?"]),
    ("env-import-error", [f"{KEY_ENV}.name=broken_mod.py:Env"], f"{KEY_ENV}.name",
     ["of environment 'broken_mod.py:Env' failed: ZeroDivisionError: division by zero at import"]),
    ("env-not-an-environment", [f"{KEY_ENV}.name=user_objs.py:NotEnv"], f"{KEY_ENV}.name",
     ["environment 'user_objs.py:NotEnv' is not a subclass of rlweave.interfaces.environment.Environment"]),
    ("env-abstract", [f"{KEY_ENV}.name=user_objs.py:Half"], f"{KEY_ENV}.name",
     ["environment 'user_objs.py:Half' does not implement step()"]),
    ("env-malformed", [f"{KEY_ENV}.name=:Echo"], f"{KEY_ENV}.name",
     ["environment ':Echo' must look like 'module:Class' or 'path/file.py:Class'"]),
    ("env-args-unknown-key", [f"{KEY_ENV}.args.max_tool_callz=2"], f"{KEY_ENV}.args.max_tool_callz",
     ["unknown key. Did you mean 'max_tool_calls'?"]),
    ("env-args-timeout", [f"{KEY_ENV}.args.timeout_s=0"], f"{KEY_ENV}.args.timeout_s", ["greater than 0"]),
    ("env-args-max-tool-calls", [f"{KEY_ENV}.args.max_tool_calls=-1"], f"{KEY_ENV}.args.max_tool_calls",
     ["greater than or equal to 0"]),
    ("env-args-memory", [f"{KEY_ENV}.args.memory_mb=8"], f"{KEY_ENV}.args.memory_mb",
     ["greater than or equal to 64"]),
    ("env-args-tool-key", [f"{TOOLS}=[{{name: calculator, target: '{CALC}', descripton: x}}]"],
     f"{TOOLS}.0.descripton", ["unknown key. Did you mean 'description'?"]),
    # -- tools (env.args.tools[].target)
    ("tool-missing-file", [_tools("no_such.py:calc")], f"{TOOLS}.0.target",
     ["file 'no_such.py' of tool 'no_such.py:calc' not found"]),
    ("tool-missing-function", [_tools("rlweave.environments.calculator:nosuch_fn")], f"{TOOLS}.0.target",
     ["tool 'rlweave.environments.calculator:nosuch_fn'", "has no attribute 'nosuch_fn'", "calculate"]),
    ("tool-missing-module", [_tools("no_such_tool_mod:calc")], f"{TOOLS}.0.target",
     ["module 'no_such_tool_mod' of tool 'no_such_tool_mod:calc' not found"]),
    ("tool-import-error", [_tools("broken_mod.py:calc")], f"{TOOLS}.0.target",
     ["of tool 'broken_mod.py:calc' failed: ZeroDivisionError"]),
    ("tool-not-callable", [_tools("user_objs.py:CONST")], f"{TOOLS}.0.target",
     ["tool 'user_objs.py:CONST' is not callable (type int)"]),
    # -- tool-call parsers (env.args.parser)
    ("parser-unknown-name", [f"{KEY_ENV}.args.parser=hermez"], f"{KEY_ENV}.args.parser",
     ["unknown tool-call parser 'hermez'", "hermes"]),
    ("parser-missing-file", [f"{KEY_ENV}.args.parser=no_such_parser.py:calls"], f"{KEY_ENV}.args.parser",
     ["file 'no_such_parser.py' of tool parser 'no_such_parser.py:calls' not found"]),
    ("parser-missing-function", [f"{KEY_ENV}.args.parser=user_objs.py:parser"], f"{KEY_ENV}.args.parser",
     ["tool parser 'user_objs.py:parser'", "has no attribute 'parser'", "Did you mean 'parse'?"]),
    ("parser-missing-module", [f"{KEY_ENV}.args.parser=no_such_parser_mod:calls"], f"{KEY_ENV}.args.parser",
     ["module 'no_such_parser_mod' of tool parser 'no_such_parser_mod:calls' not found"]),
    ("parser-import-error", [f"{KEY_ENV}.args.parser=broken_mod.py:calls"], f"{KEY_ENV}.args.parser",
     ["of tool parser 'broken_mod.py:calls' failed: ZeroDivisionError"]),
    # -- rewards (rewards[].name)
    ("reward-unknown-name", ["rewards.0.name=arith_exactt"], "rewards.0.name",
     ["unknown reward 'arith_exactt'", "Did you mean 'arith_exact'?"]),
    ("reward-missing-file", ["rewards.0.name=no_such_rw.py:f"], "rewards.0.name",
     ["file 'no_such_rw.py' of reward 'no_such_rw.py:f' not found"]),
    ("reward-missing-function", ["rewards.0.name=user_objs.py:rewrd"], "rewards.0.name",
     ["reward 'user_objs.py:rewrd'", "has no attribute 'rewrd'", "Did you mean 'reward'?"]),
    ("reward-missing-module", ["rewards.0.name=no_such_rw_mod:f"], "rewards.0.name",
     ["module 'no_such_rw_mod' of reward 'no_such_rw_mod:f' not found"]),
    ("reward-import-error", ["rewards.0.name=broken_mod.py:f"], "rewards.0.name",
     ["of reward 'broken_mod.py:f' failed: ZeroDivisionError"]),
    ("reward-not-callable", ["rewards.0.name=user_objs.py:CONST"], "rewards.0.name",
     ["reward 'user_objs.py:CONST' is not callable (type int)"]),
    # -- algorithm parts: advantage estimator, policy loss, loss aggregation, KL estimator, correction
    ("advantage-unknown-name", ["algorithm.advantage=rlooo"], "algorithm.advantage",
     ["unknown advantage estimator 'rlooo'", "Did you mean 'rloo'?"]),
    ("advantage-missing-file", ["algorithm.advantage=no_such_est.py:fn"], "algorithm.advantage",
     ["file 'no_such_est.py' of advantage estimator 'no_such_est.py:fn' not found"]),
    ("advantage-missing-function", ["algorithm.advantage=user_objs.py:estimatr"], "algorithm.advantage",
     ["advantage estimator 'user_objs.py:estimatr'", "Did you mean 'estimator'?"]),
    ("advantage-import-error", ["algorithm.advantage=broken_mod.py:fn"], "algorithm.advantage",
     ["of advantage estimator 'broken_mod.py:fn' failed: ZeroDivisionError"]),
    ("policy-loss-unknown-name", ["algorithm.policy_loss=ppo_clipp"], "algorithm.policy_loss",
     ["unknown policy loss 'ppo_clipp'", "Did you mean 'ppo_clip'?"]),
    ("policy-loss-missing-module", ["algorithm.policy_loss=no_such_loss_mod:fn"], "algorithm.policy_loss",
     ["module 'no_such_loss_mod' of policy loss 'no_such_loss_mod:fn' not found"]),
    ("policy-loss-not-callable", ["algorithm.policy_loss=user_objs.py:CONST"], "algorithm.policy_loss",
     ["policy loss 'user_objs.py:CONST' is not callable (type int)"]),
    ("loss-agg-unknown-name", ["algorithm.loss_agg=seq_avg"], "algorithm.loss_agg",
     ["unknown loss aggregation 'seq_avg'"]),
    ("loss-agg-missing-file", ["algorithm.loss_agg=no_such_agg.py:fn"], "algorithm.loss_agg",
     ["file 'no_such_agg.py' of loss aggregation 'no_such_agg.py:fn' not found"]),
    ("kl-estimator-unknown-name", ["algorithm.kl={estimator: k4, beta: 0.1}"], "algorithm.kl.estimator",
     ["unknown KL estimator 'k4'"]),
    ("kl-estimator-missing-module", ["algorithm.kl={estimator: 'no_such_kl_mod:k', beta: 0.1}"],
     "algorithm.kl.estimator", ["module 'no_such_kl_mod' of KL estimator 'no_such_kl_mod:k' not found"]),
    ("correction-unknown-name", ["algorithm.off_policy={correction: tiss}"], "algorithm.off_policy.correction",
     ["unknown rollout correction 'tiss'", "Did you mean 'tis'?"]),
    # -- agents (algorithm.multi_turn.agent)
    ("agent-missing-file", [f"{KEY_ENV}=null", f"{KEY_AGENT}=no_such_agent.py:solve"], f"{KEY_AGENT}.target",
     ["file 'no_such_agent.py' of agent 'no_such_agent.py:solve' not found"]),
    ("agent-missing-function", [f"{KEY_ENV}=null", f"{KEY_AGENT}=user_objs.py:solv"], f"{KEY_AGENT}.target",
     ["agent 'user_objs.py:solv'", "has no attribute 'solv'"]),
    ("agent-missing-module", [f"{KEY_ENV}=null", f"{KEY_AGENT}=no_such_agent_mod:solve"], f"{KEY_AGENT}.target",
     ["module 'no_such_agent_mod' of agent 'no_such_agent_mod:solve' not found"]),
    ("agent-not-callable", [f"{KEY_ENV}=null", f"{KEY_AGENT}=user_objs.py:CONST"], f"{KEY_AGENT}.target",
     ["agent 'user_objs.py:CONST' is not callable (type int)"]),
    ("agent-import-error", [f"{KEY_ENV}=null", f"{KEY_AGENT}=broken_mod.py:solve"], f"{KEY_AGENT}.target",
     ["of agent 'broken_mod.py:solve' failed: ZeroDivisionError"]),
    ("agent-parser", [f"{KEY_ENV}=null", f"{KEY_AGENT}={{target: 'user_objs.py:calc', parser: hermez}}"],
     f"{KEY_AGENT}.parser", ["unknown tool-call parser 'hermez'", "hermes"]),
    ("agent-timeout", [f"{KEY_ENV}=null", f"{KEY_AGENT}={{target: 'user_objs.py:calc', timeout_s: 0}}"],
     f"{KEY_AGENT}.timeout_s", ["greater than 0"]),
    ("agent-on-error", [f"{KEY_ENV}=null", f"{KEY_AGENT}={{target: 'user_objs.py:calc', on_error: skip}}"],
     f"{KEY_AGENT}.on_error", ["'exclude' or 'zero'"]),
    ("agent-and-env", [f"{KEY_AGENT}=user_objs.py:calc"], "algorithm.multi_turn",
     ["set exactly one of env (an environment) and agent (an agent function)"]),
    ("correction-missing-module", ["algorithm.off_policy={correction: 'no_such_corr_mod:fn'}"],
     "algorithm.off_policy.correction", ["module 'no_such_corr_mod' of rollout correction 'no_such_corr_mod:fn'"]),
    ("correction-band-inverted", ["algorithm.off_policy={correction: {name: icepop, low: 2.0, high: 1.5}}"],
     "algorithm.off_policy.correction", ["rollout correction 'icepop': bad options: low (2) must be smaller than "
                                         "high (1.5)"]),
    ("correction-unknown-option", ["algorithm.off_policy={correction: {name: seq_tis, cape: 3}}"],
     "algorithm.off_policy.correction", ["rollout correction 'seq_tis': bad options: cape: Extra inputs"]),
    ("correction-option-beside-it", ["algorithm.off_policy={correction: geo_mask, cap: 3}"], "algorithm.off_policy.cap",
     ["algorithm.off_policy.cap is an option of corrections tis and decoupled", "correction: {name: geo_mask, ...}"]),
    ("correction-bypass-without-proximal", ["algorithm.off_policy={correction: decoupled, mode: bypass}"],
     "algorithm.off_policy.mode", ["mode 'bypass' skips the recomputed proximal policy, which correction "
                                   "'decoupled' needs"]),
    # -- rollouts, run modes
    ("rollout-unknown-name", ["algorithm.multi_turn=null", "rollout.name=single_turnn"], "rollout.name",
     ["unknown rollout 'single_turnn'", "Did you mean 'single_turn'?"]),
    ("rollout-reference", ["algorithm.multi_turn=null", "rollout.name=my_rollout.py:Mine"], "rollout.name",
     ["unknown rollout 'my_rollout.py:Mine'"]),
    ("run-mode-unknown-name", ["run.mode=asyncc"], "run.mode", ["unknown run mode 'asyncc'", "Did you mean 'async'?"]),
    ("run-mode-reference", ["run.mode=modes.py:Mine"], "run.mode", ["unknown run mode 'modes.py:Mine'"]),
    # -- reproducible runs: rollout dumps (written per test in the workspace: dump/ fits, other_dump/ does not)
    ("replay-bad-path", ["rollout.replay=no_such_dump"], "rollout.replay",
     ["no rollout dump at 'no_such_dump'", "rollout.dump: true"]),
    ("replay-another-model", ["rollout.replay=other_dump"], "rollout.replay",
     ["the dump was made with another model", "fingerprint 000000000000"]),
    ("replay-async-mode", ["algorithm.multi_turn=null", "rollout.replay=dump", "run.mode=async"], "run.mode",
     ["rollout.replay trains in run.mode sync only, not 'async'"]),
    ("replay-short-dump", ["rollout.replay=dump", "run.total_steps=3"], "run.total_steps",
     ["holds steps 1..1; run.total_steps is 3"]),
    ("deterministic-engine", ["run.deterministic=true", "roles.rollout.engine=vllm"], "roles.rollout.engine",
     ["run.deterministic: true: engine 'vllm' does not promise identical generations"]),
    ("deterministic-async-mode", ["algorithm.multi_turn=null", "run.deterministic=true", "run.mode=async"],
     "run.mode", ["run.deterministic: true needs run.mode sync"]),
    # -- algorithms
    ("algorithm-unknown-name", ["algorithm.name=grpoo"], "algorithm.name",
     ["unknown algorithm 'grpoo'", "Did you mean 'grpo'?"]),
    ("algorithm-missing-file", ["algorithm.name=no_such_algo.py:Algo"], "algorithm.name",
     ["file 'no_such_algo.py' of algorithm 'no_such_algo.py:Algo' not found"]),
    ("algorithm-missing-class", ["algorithm.name=user_objs.py:Algo"], "algorithm.name",
     ["algorithm 'user_objs.py:Algo'", "has no attribute 'Algo'"]),
    ("algorithm-import-error", ["algorithm.name=broken_mod.py:Algo"], "algorithm.name",
     ["of algorithm 'broken_mod.py:Algo' failed: ZeroDivisionError"]),
    ("algorithm-not-an-algorithm", ["algorithm.name=user_objs.py:NotEnv"], "algorithm.name",
     ["algorithm 'user_objs.py:NotEnv' is not a subclass of rlweave.interfaces.algorithm.Algorithm"]),
    # -- backends, engines, LoRA target modules (read from the model's config.json, no weights)
    ("backend-unknown-name", ["roles.policy.backend=fsdpp"], "roles.policy.backend",
     ["unknown training backend 'fsdpp'", "Did you mean 'fsdp'?"]),
    ("engine-unknown-name", ["roles.rollout.engine=vlm"], "roles.rollout.engine",
     ["unknown inference engine 'vlm'", "Did you mean 'vllm'?"]),
    ("replay-router-dense-model", ["algorithm.multi_turn=null", "algorithm.router_replay=r3"], "algorithm.router_replay",
     ["router_replay r3 needs a mixture-of-experts policy; model model is dense"]),
    ("replay-router-engine-records-none", ["algorithm.multi_turn=null", "algorithm.router_replay=r3",
                                           "model.path=moe_model", "roles.rollout.engine=vllm"], "roles.rollout.engine",
     ["algorithm.router_replay r3 needs the engine's routing: engine 'vllm' does not record"]),
    ("replay-router-r2-bypass", ["algorithm.multi_turn=null", "algorithm.router_replay=r2", "model.path=moe_model",
                                 "algorithm.off_policy={correction: tis, mode: bypass}"], "algorithm.router_replay",
     ["router_replay r2 records the routing in the old-log-prob pass, which algorithm.off_policy.mode bypass skips"]),
    ("replay-router-multi-turn", ["algorithm.router_replay=r3", "model.path=moe_model"], "algorithm",
     ["router_replay r3 replays the routing of one engine continuation per sample"]),
    ("lora-unknown-target-module", ["roles.policy.lora={r: 4, target_modules: [q_proj, qkv]}"],
     "roles.policy.lora.target_modules",
     ["no linear layer named 'qkv' in model model", "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj"]),
]


def _write_dumps(root: Path) -> None:
    """Two one-step rollout dumps' headers: ``dump/`` of this workspace's model, ``other_dump/`` of
    another (its fingerprint differs); their step file is empty (validation reads only names)."""
    from rlweave.config.replay import model_fingerprint, tokenizer_fingerprint

    for name, fingerprint in (("dump", model_fingerprint(str(root / "model"))), ("other_dump", "0" * 64)):
        folder = root / name / "rollouts"
        folder.mkdir(parents=True)
        model = {"path": "model", "fingerprint": fingerprint}
        tokenizer = {"path": "model", "fingerprint": tokenizer_fingerprint(str(root / "model"))}
        (folder / "header.json").write_text(json.dumps({"format": 1, "algorithm": "grpo", "seed": 1, "model": model,
                                                        "tokenizer": tokenizer}))
        (folder / "step_000001.safetensors").write_bytes(b"")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(QWEN2))
    (root / "moe_model").mkdir()
    (root / "moe_model" / "config.json").write_text(json.dumps({**QWEN2, "architectures": ["Qwen3MoeForCausalLM"],
                                                               "model_type": "qwen3_moe", "num_experts": 4,
                                                               "num_experts_per_tok": 2, "moe_intermediate_size": 32}))
    rows = [{"id": "a", "prompt": "1+1=", "answer": 2}, {"id": "b", "prompt": "2+3=", "answer": 5}]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, text in USER_FILES.items():
        (root / name).write_text(text)
    _write_dumps(root)
    (root / "c.yaml").write_text(json.dumps(_base()))
    return root


@pytest.fixture
def rlweave(workspace, monkeypatch):
    """``rlweave(*args)`` -> typer's ``Result`` of the command run in this process, in the
    workspace; ``sys.path`` and the user modules imported are put back afterwards."""
    monkeypatch.chdir(workspace)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    runner = CliRunner()
    yield lambda *args: runner.invoke(rlweave_cli.app, [str(a) for a in args])
    for name in set(sys.modules) - before:
        if name.startswith(("rlweave_user_", "user_objs", "broken_mod")):
            del sys.modules[name]


def test_the_base_config_is_valid(rlweave):
    result = rlweave("validate", "c.yaml")
    assert result.exit_code == 0, result.output
    assert "algorithm: grpo (policy, rollout)" in result.output


@pytest.mark.parametrize("command", ["validate", "train"])
@pytest.mark.parametrize("case, overrides, key, fragments", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_naming_its_key(rlweave, workspace, command, case, overrides, key, fragments):
    result = rlweave(command, "c.yaml", *overrides)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"invalid config: c.yaml: {key}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not (workspace / "runs").exists(), "train must stop before it writes its run directory"


def test_the_table_covers_every_kind():
    covered = {case.split("-")[0] for case, *_ in CASES}
    assert {"env", "tool", "parser", "reward", "advantage", "policy", "loss", "kl", "correction", "rollout", "run",
            "algorithm", "backend", "engine", "lora", "agent", "replay", "deterministic"} <= covered
    assert len(CASES) >= 40
