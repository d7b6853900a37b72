"""Invalid configs: each produces exactly the expected error lines, all at once.

Every case runs both passes with in-process test plugins (named like the real ones); the
file is ``c.yaml`` in the working directory, so messages read ``c.yaml: <path>: <message>``.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import yaml

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins import EngineRecord

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

BASE = {
    "algorithm": {"name": "grpo"},
    "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
    "rewards": [{"name": "arith_exact"}],
}
PLACEMENT: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def setup(monkeypatch, tmp_path):
    """Run in tmp_path; placement (helper B's) answers what PLACEMENT holds."""
    monkeypatch.chdir(tmp_path)
    fake = types.ModuleType("rlweave.config.placement")
    fake.check_placement = lambda cfg, roles, supported=None, rank_spans=None: list(PLACEMENT)
    fake.spans_of = lambda record: ()
    monkeypatch.setitem(sys.modules, "rlweave.config.placement", fake)
    PLACEMENT.clear()


def errors(data=None, overrides=(), text=None, pm=None) -> list[str]:
    """Validate and return the error lines (the test fails if the config is valid)."""
    Path("c.yaml").write_text(text if text is not None else yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml", overrides, pm or fakes.make_pm())
    lines = str(err.value).splitlines()
    n = len(err.value.issues)
    if n == 1:  # one problem: one line
        assert lines == [f"invalid config: {err.value.issues[0]}"]
        return [str(err.value.issues[0])]
    assert lines[0] == f"invalid config ({n} errors):"
    return [line.strip() for line in lines[1:]]


def base(**changes):
    return fakes.changed(BASE, **changes)


# ---------------------------------------------------------------- pass one: core sections
def test_unknown_top_level_key_lists_the_sections():
    assert errors(base(trainer={"lr": 1})) == [
        "c.yaml: trainer: unknown key (allowed: required_plugins, run, ray, resources, model, roles, algorithm, "
        "rewards, reward_runtime, data, logging, weight_sync, rollout, kernels)"]


def test_unknown_nested_key_suggests_the_close_one():
    assert errors(base(run__totl_steps=3)) == ["c.yaml: run.totl_steps: unknown key. Did you mean 'total_steps'?"]


def test_unknown_key_inside_a_role_and_a_list_entry():
    assert errors(base(roles__policy__devics=2, rewards=[{"name": "arith_exact", "wieght": 2}])) == [
        "c.yaml: roles.policy.devics: unknown key. Did you mean 'devices'?",
        "c.yaml: rewards.0.wieght: unknown key. Did you mean 'weight'?"]


def test_wrong_type_shows_the_value():
    assert errors(base(run__total_steps="ten")) == [
        "c.yaml: run.total_steps: Input should be a valid integer, unable to parse string as an integer (got 'ten')"]


def test_out_of_range_and_bad_choice():
    assert errors(base(roles__policy__devices=0, model={"dtype": "fp8"})) == [
        "c.yaml: model.dtype: Input should be 'float32', 'bfloat16' or 'float16' (got 'fp8')",
        "c.yaml: roles.policy.devices: Input should be greater than or equal to 1 (got 0)"]


def test_missing_required_key_in_a_reward_entry():
    assert errors(base(rewards=[{"weight": 1.0}])) == ["c.yaml: rewards.0.name: required key is missing"]


# ---------------------------------------------------------------- YAML and overrides
def test_yaml_syntax_error_names_line_and_column():
    assert errors(text="run:\n  total_steps: 3\n bad: [\n") == [
        "c.yaml: invalid YAML at line 3, column 2: expected <block end>, but found '<block mapping start>'"]


def test_duplicate_yaml_key_is_an_error():
    assert errors(text="run:\n  seed: 1\n  seed: 2\n") == [
        "c.yaml: invalid YAML at line 3, column 3: duplicate key 'seed'"]


def test_top_level_must_be_a_mapping_and_file_must_exist():
    assert errors(text="- run\n") == ["c.yaml: the top level must be a mapping of sections, got list"]
    with pytest.raises(ConfigError, match=r"^invalid config: missing.yaml: file not found$"):
        load_config("missing.yaml", (), fakes.make_pm())


def test_bad_override_syntax_is_reported_for_each_override():
    assert errors(base(), ["foo", "=3", "run..name=x", "rewards.4.weight=1", "algorithm.name.x=1",
                           "rewards.first.weight=1", "run.seed=[1", "run.seed=3"]) == [
        "command line: override 'foo': expected key.path=value, e.g. run.total_steps=20",
        "command line: override '=3': missing key before '=', expected key.path=value",
        "command line: override 'run..name=x': invalid key path 'run..name': each part must be a name or a list index",
        "command line: override 'rewards.4.weight=1': index 4 is out of range (rewards has 1 entries)",
        "command line: override 'algorithm.name.x=1': algorithm.name is a str, so it has no key 'x'",
        "command line: override 'rewards.first.weight=1': rewards is a list: use an index, not 'first'",
        "command line: override 'run.seed=[1': value '[1' is not valid YAML: while parsing a flow sequence"]


def test_an_override_with_a_wrong_value_is_reported_at_its_path():
    assert errors(base(), ["run.total_steps=many"]) == [
        "c.yaml: run.total_steps: Input should be a valid integer, unable to parse string as an integer (got 'many')"]


# ---------------------------------------------------------------- pass two: plugins
def test_unknown_backend_lists_choices_with_distributions_and_suggests():
    assert errors(base(roles__policy__backend="megatorn")) == [
        "c.yaml: roles.policy.backend: unknown training backend 'megatorn'. Choose one of: fsdp "
        "(rlweave-backend-fsdp 0.1.0), megatron (rlweave-backend-megatron 0.1.0). Did you mean 'megatron'?"]


def test_unknown_algorithm_engine_and_reward():
    assert errors(base(algorithm={"name": "grop"}, roles__rollout__engine="vlm",
                       rewards=[{"name": "arith_exct"}])) == [
        "c.yaml: algorithm.name: unknown algorithm 'grop'. Choose one of: grpo (rlweave-algo-grpo 0.1.0), "
        "sft (rlweave-algo-grpo 0.1.0). Did you mean 'grpo'?",
        "c.yaml: roles.rollout.engine: unknown inference engine 'vlm'. Choose one of: hf (rlweave-infer-hf 0.1.0), "
        "vllm (rlweave-infer-vllm 0.1.0). Did you mean 'vllm'?",
        "c.yaml: rewards.0.name: unknown reward 'arith_exct'. Choose one of: arith_exact (rlweave 0.1.0), "
        "format (rlweave 0.1.0). Did you mean 'arith_exact'?"]


def test_algorithm_section_is_validated_against_the_plugin_model():
    assert errors(base(algorithm={"name": "grpo", "group_sz": 8, "kl_beta": -1})) == [
        "c.yaml: algorithm.kl_beta: Input should be greater than or equal to 0 (got -1)",
        "c.yaml: algorithm.group_sz: unknown key. Did you mean 'group_size'?"]


def test_role_options_are_validated_against_the_backend_and_engine_models():
    assert errors(base(roles={"policy": {"backend": "fsdp", "options": {"grad_accum": "many", "reshrad": False}},
                              "rollout": {"engine": "hf", "options": {"temperature": 1.0}}})) == [
        "c.yaml: roles.policy.options.grad_accum: Input should be a valid integer, unable to parse string as an "
        "integer (got 'many')",
        "c.yaml: roles.policy.options.reshrad: unknown key. Did you mean 'reshard'?",
        "c.yaml: roles.rollout.options.temperature: unknown key: engine 'hf' takes no options"]


def test_reward_args_are_validated_when_the_reward_has_a_model():
    assert errors(base(rewards=[{"name": "format", "args": {"patern": "x"}}])) == [
        "c.yaml: rewards.0.args.patern: unknown key. Did you mean 'pattern'?"]


def test_required_plugins_missing_too_old_and_malformed():
    lines = errors(base(required_plugins=["rlweave-algo-nonexistent>=0.1", "rlweave>=9", "rlweave-algo-grpo>>0.1"]))
    assert lines[:2] == [
        "c.yaml: required_plugins.0: required plugin 'rlweave-algo-nonexistent>=0.1' is not installed (installed "
        "plugins: rlweave 0.1.0, rlweave-algo-grpo 0.1.0, rlweave-backend-fsdp 0.1.0, rlweave-backend-megatron 0.1.0, "
        "rlweave-infer-hf 0.1.0, rlweave-infer-vllm 0.1.0)",
        "c.yaml: required_plugins.1: required plugin 'rlweave>=9' is not satisfied: rlweave 0.1.0 is installed"]
    # the rest of this line is packaging's own parser message
    assert lines[2].startswith("c.yaml: required_plugins.2: 'rlweave-algo-grpo>>0.1' is not a valid requirement: ")
    assert len(lines) == 3


def test_roles_the_algorithm_needs_must_be_present():
    assert errors(base(algorithm={"name": "grpo", "kl_beta": 0.1}, roles={"policy": {"backend": "fsdp"}})) == [
        "c.yaml: roles.rollout: missing: algorithm 'grpo' needs role 'rollout' (with an engine); it needs roles: "
        "policy, rollout, reference",
        "c.yaml: roles.reference: missing: algorithm 'grpo' needs role 'reference' (with a backend); it needs roles: "
        "policy, rollout, reference"]


def test_roles_need_the_right_plugin_kind():
    assert errors(base(roles={"policy": {"devices": 2}, "rollout": {"backend": "fsdp", "engine": "vllm"}})) == [
        "c.yaml: roles.policy.backend: role 'policy' needs a training backend; choose one of: fsdp, megatron",
        "c.yaml: roles.rollout.backend: role 'rollout' takes an engine (roles.rollout.engine), not a backend"]


def test_unknown_role_name_and_unsupported_parallelism():
    assert errors(base(roles={"policy": {"backend": "fsdp", "parallel": {"tp": 2}}, "rollout": {"engine": "vllm"},
                              "refrence": {"backend": "fsdp"}})) == [
        "c.yaml: roles.policy.parallel.tp: backend 'fsdp' does not support 'tp' parallelism; it supports: dp",
        "c.yaml: roles.refrence: unknown role 'refrence'; roles are: critic, policy, reference, reward, rollout. "
        "Did you mean 'reference'?"]


def test_kernel_that_cannot_run_here_and_unknown_kernel():
    assert errors(base(kernels={"moe_groupgemm": True, "flash": True, "off_one": False})) == [
        "c.yaml: kernels.flash: unknown kernel 'flash'. Choose one of: moe_groupgemm (rlweave 0.1.0, unavailable).",
        "c.yaml: kernels.moe_groupgemm: kernel 'moe_groupgemm' (rlweave 0.1.0) is unavailable here: needs CUDA"]


def test_selecting_a_name_two_distributions_offer_names_both():
    pm = fakes.make_pm()
    pm.register(fakes.plugin(rlweave_inference_engines=lambda: [EngineRecord("vllm", "another vLLM", "x:y")]),
                name="vllm-fork", distribution="rlweave-infer-vllm-fork", version="0.9.0")
    assert errors(base(), pm=pm) == [
        "c.yaml: roles.rollout.engine: inference engine 'vllm' is offered by more than one plugin: rlweave-infer-vllm "
        "0.1.0 and rlweave-infer-vllm-fork 0.9.0. Uninstall one of them, or block one with "
        "RLWEAVE_DISABLE_PLUGINS=<distribution>."]


def test_selecting_a_broken_plugin_shows_its_error():
    pm = fakes.make_pm()

    def explode():
        raise RuntimeError("cannot build records")

    info = pm.register(fakes.plugin(rlweave_algorithms=explode), name="ppo", distribution="rlweave-algo-ppo", version="0.1.0")
    assert (info.status, info.error) == ("broken", "RuntimeError: cannot build records")
    assert errors(base(algorithm={"name": "ppo"}), pm=pm) == [
        "c.yaml: algorithm.name: algorithm 'ppo': plugin 'ppo' (rlweave-algo-ppo 0.1.0) is broken: "
        "RuntimeError: cannot build records"]


def test_placement_problems_are_reported_with_the_others():
    PLACEMENT.append(("roles.policy.devices", "needs 4 devices but pool 'default' has 1"))
    assert errors(base(rewards=[{"name": "nope"}])) == [
        "c.yaml: rewards.0.name: unknown reward 'nope'. Choose one of: arith_exact (rlweave 0.1.0), format "
        "(rlweave 0.1.0).",
        "c.yaml: roles.policy.devices: needs 4 devices but pool 'default' has 1"]


def test_all_problems_of_both_passes_and_overrides_come_in_one_error():
    lines = errors(base(roles__policy__backend="megatorn", rewards=[{"name": "format", "args": {"patern": 1}}]),
                   ["oops", "algorithm.group_size=1"])
    assert [line.split(": ")[1] for line in lines] == [
        "override 'oops'", "algorithm.group_size", "roles.policy.backend", "rewards.0.args.patern"]


def test_plugin_problems_are_reported_even_when_an_unrelated_core_section_fails():
    assert errors(base(run__total_steps=0, data={"batch_sise": 4}, roles__policy__backend="fsdpp")) == [
        "c.yaml: run.total_steps: Input should be greater than or equal to 1 (got 0)",
        "c.yaml: data.batch_sise: unknown key. Did you mean 'batch_size'?",
        "c.yaml: roles.policy.backend: unknown training backend 'fsdpp'. Choose one of: fsdp "
        "(rlweave-backend-fsdp 0.1.0), megatron (rlweave-backend-megatron 0.1.0). Did you mean 'fsdp'?"]


# ---------------------------------------------------------------- both passes together
def test_a_core_error_in_a_section_pass_two_reads_still_lets_pass_two_report():
    assert errors(base(roles__policy__devices=0, algorithm={"name": "grpo", "group_sz": 8})) == [
        "c.yaml: roles.policy.devices: Input should be greater than or equal to 1 (got 0)",
        "c.yaml: algorithm.group_sz: unknown key. Did you mean 'group_size'?"]


def test_pass_two_paths_point_at_the_file_after_an_invalid_list_entry_is_dropped():
    assert errors(base(rewards=[{"weight": 1.0}, {"name": "arith_exct"}, {"name": "format", "args": {"patern": "x"}}])) == [
        "c.yaml: rewards.0.name: required key is missing",
        "c.yaml: rewards.1.name: unknown reward 'arith_exct'. Choose one of: arith_exact (rlweave 0.1.0), "
        "format (rlweave 0.1.0). Did you mean 'arith_exact'?",
        "c.yaml: rewards.2.args.patern: unknown key. Did you mean 'pattern'?"]


def test_pass_two_issues_that_only_echo_a_core_error_are_left_out():
    # the backend (wrong type) is dropped, so pass two would say the role has none
    assert errors(base(roles__policy__backend=5, roles__rollout__engine="vlm")) == [
        "c.yaml: roles.policy.backend: Input should be a valid string (got 5)",
        "c.yaml: roles.rollout.engine: unknown inference engine 'vlm'. Choose one of: hf (rlweave-infer-hf 0.1.0), "
        "vllm (rlweave-infer-vllm 0.1.0). Did you mean 'vllm'?"]


def test_an_invalid_algorithm_name_is_not_replaced_by_the_default_algorithm():
    # no checks of the default algorithm's keys or roles: only the real problems
    assert errors(base(algorithm={"name": ["grpo"], "group_size": "many"}, roles={"policy": {"backend": "fsdpp"}})) == [
        "c.yaml: algorithm.name: Input should be a valid string",
        "c.yaml: roles.policy.backend: unknown training backend 'fsdpp'. Choose one of: fsdp "
        "(rlweave-backend-fsdp 0.1.0), megatron (rlweave-backend-megatron 0.1.0). Did you mean 'fsdp'?"]


def test_selecting_an_unavailable_record_says_why():
    pm = fakes.make_pm()
    pm.register(fakes.plugin(rlweave_inference_engines=lambda: [EngineRecord(
        "sglang", "SGLang", "x:y", probe=lambda: "not implemented yet (needs CUDA)")]),
        name="sglang", distribution="rlweave-infer-sglang", version="0.1.0")
    assert errors(base(roles__rollout__engine="sglang", roles__rollout__options={"anything": 1}), pm=pm) == [
        "c.yaml: roles.rollout.engine: inference engine 'sglang' (rlweave-infer-sglang 0.1.0) is unavailable here: "
        "not implemented yet (needs CUDA)"]


def test_placement_issues_around_a_core_error_are_left_out_and_others_kept():
    PLACEMENT.extend([("resources.colocate.0", "a colocation group needs at least two roles, got ['policy']"),
                      ("resources.pools.default", "pool 'default' has 1 node x 1 devices = 1; needs 2")])
    assert errors(base(resources={"colocate": [[1, "policy"]]}, required_plugins=[3, "rlweave>=9"])) == [
        "c.yaml: required_plugins.0: Input should be a valid string (got 3)",
        "c.yaml: resources.colocate.0.0: Input should be a valid string (got 1)",
        "c.yaml: required_plugins.1: required plugin 'rlweave>=9' is not satisfied: rlweave 0.1.0 is installed",
        "c.yaml: resources.pools.default: pool 'default' has 1 node x 1 devices = 1; needs 2"]
