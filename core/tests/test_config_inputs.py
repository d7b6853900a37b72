"""Input checks of ``load_config``: model directories, data files and a dry run of each reward,
reported by dotted key together with the errors of both validation passes."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import yaml
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins import AlgorithmRecord

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

MISSING_MODEL = "does not exist (a local Hugging Face model directory; nothing is downloaded)"


def not_cached(name: str) -> str:
    """The message for a path that is neither a local directory nor a cached hub model."""
    return (f"'{name}' is neither a local directory nor a hub model in the Hugging Face cache (hf-cache): for a hub "
            f"model, download it first with `hf download {name}` (older huggingface_hub: `huggingface-cli download "
            f"{name}`); nothing is downloaded during a run")


@pytest.fixture(autouse=True)
def in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", "hf-cache")  # an empty cache: nothing of the user's is read


def jsonl(name: str, *rows) -> str:
    Path(name).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return name


def config(**changes):
    data = {"resources": {"pools": {"default": {"devices_per_node": 2}}},
            "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
            "algorithm": {"name": "grpo"}, "rewards": [{"name": "arith_exact"}]}
    data.update(changes)
    return data


def errors(data, pm=None, **kw) -> list[str]:
    Path("c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml", pm=pm or fakes.make_pm(), **kw)
    return [str(i) for i in err.value.issues]


def valid(data, pm=None, **kw):
    Path("c.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config("c.yaml", pm=pm or fakes.make_pm(), **kw)


def test_every_missing_path_is_reported_by_its_key_with_both_passes_errors():
    Path("models/reference").mkdir(parents=True)
    data = config(run={"total_steps": 0}, model={"path": "models/base", "tokenizer": "tok"},
                  roles={"policy": {"backend": "fsdp", "model": {"path": "models/policy"}},
                         "rollout": {"engine": "vllm", "model": {"path": "models/reference", "tokenizer": "c.yaml"}},
                         "critic": {"backend": "fsdp", "model": {"path": "models/unused"}}},
                  algorithm={"name": "grpo", "group_sz": 4},
                  data={"train": "train.jsonl", "eval": "eval.jsonl"})
    assert errors(data) == [
        "c.yaml: run.total_steps: Input should be greater than or equal to 1 (got 0)",
        "c.yaml: algorithm.group_sz: unknown key. Did you mean 'group_size'?",
        f"c.yaml: model.path: {not_cached('models/base')}",
        f"c.yaml: model.tokenizer: model directory 'tok' {MISSING_MODEL}",
        f"c.yaml: roles.policy.model.path: {not_cached('models/policy')}",
        "c.yaml: roles.rollout.model.tokenizer: 'c.yaml' is not a directory (a local Hugging Face model directory "
        "or a .gguf file is expected)",
        "c.yaml: data.train: data file 'train.jsonl' does not exist",
        "c.yaml: data.eval: data file 'eval.jsonl' does not exist"]
    cfg, resolved = valid({**data, "run": {"total_steps": 1}, "algorithm": {"name": "grpo"}}, check_inputs=False)
    assert cfg.model.path == "models/base" and resolved.role_names == ("policy", "rollout")


def test_data_files_must_start_with_json_objects():
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2}, "", '{"prompt": oops}')
    jsonl("eval.jsonl", "[1, 2]")
    Path("empty.jsonl").write_text("\n\n")
    assert errors(config(data={"train": "train.jsonl", "eval": "eval.jsonl"})) == [
        "c.yaml: data.train: train.jsonl line 3: invalid JSON: Expecting value (column 12)",
        "c.yaml: data.eval: eval.jsonl line 1: expected a JSON object, got list"]
    assert errors(config(data={"train": "empty.jsonl", "eval": "."})) == [
        "c.yaml: data.train: empty.jsonl has no records",
        "c.yaml: data.eval: . is a directory but not a dataset saved with datasets' save_to_disk (no state.json); "
        "give a jsonl or parquet file, or such a directory"]


def test_a_reward_missing_its_field_fails_on_the_first_record():
    jsonl("train.jsonl", {"prompt": "1+1="}, {"prompt": "2+2=", "answer": 4})
    jsonl("eval.jsonl", {"prompt": "3+3=", "answer": 6})
    assert errors(config(data={"train": "train.jsonl", "eval": "eval.jsonl"})) == [
        "c.yaml: rewards.0: reward 'arith_exact' fails on the first record of data.train (train.jsonl line 1) with an "
        "empty response: ValueError: arith_exact needs an 'answer' field in the data record"]
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2})
    cfg, _ = valid(config(data={"train": "train.jsonl", "eval": "eval.jsonl"}))
    assert cfg.data.train == "train.jsonl"


def test_user_rewards_are_called_with_the_records_fields_and_their_args():
    Path("rw.py").write_text(textwrap.dedent("""
        def exact(prompt, response, answer):
            return float(response == str(answer))
        def needs_label(prompt, response, label, **fields):
            return 1.0
        def boom(prompt, response, **fields):
            raise RuntimeError("no luck with " + repr(sorted(fields)))
    """))
    Path("broken_rw.py").write_text("import not_there\ndef f(**kw):\n    return 0.0\n")
    jsonl("train.jsonl", {"id": "a", "query": "1+1=", "answer": 2})
    rewards = [{"name": "rw.py:exact", "args": {"scale": 2}}, {"name": "rw.py:needs_label"}, {"name": "rw.py:boom"},
               {"name": "missing.py:f"}, {"name": "broken_rw.py:f"}, {"name": "rw.py:exact"}]
    head = "on the first record of data.train (train.jsonl line 1) with an empty response"
    assert errors(config(rewards=rewards, data={"train": "train.jsonl"})) == [
        f"c.yaml: rewards.3.name: file 'missing.py' of reward 'missing.py:f' not found (looked for {Path.cwd()}/missing.py)",
        f"c.yaml: rewards.4.name: importing '{Path.cwd()}/broken_rw.py' of reward 'broken_rw.py:f' failed: this run "
        "needs 'not_there', which is not installed",
        f"c.yaml: rewards.0: reward 'rw.py:exact' fails {head}: TypeError: exact() got an unexpected keyword "
        "argument 'scale'",
        f"c.yaml: rewards.1: reward 'rw.py:needs_label' fails {head}: TypeError: needs_label() missing 1 required "
        "positional argument: 'label'",
        f"c.yaml: rewards.2: reward 'rw.py:boom' fails {head}: RuntimeError: no luck with ['answer']"]


def test_a_reward_that_hangs_times_out():
    Path("slow.py").write_text("import time\ndef wait(**kw):\n    time.sleep(30)\n")
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2})
    (line,) = errors(config(rewards=[{"name": "slow.py:wait"}], reward_runtime={"timeout_s": 0.5},
                            data={"train": "train.jsonl"}))
    assert line.startswith("c.yaml: rewards.0: reward 'slow.py:wait' times out on the first record of data.train "
                           "(train.jsonl line 1) with an empty response: ")


def test_the_algorithm_says_which_data_its_rewards_score():
    pm = fakes.make_pm()
    pm.register(fakes.plugin(rlweave_algorithms=lambda: [AlgorithmRecord(
        "judge", "rewards judge eval answers only", "x:y", roles=lambda cfg: ("policy",),
        reward_data=lambda cfg: ("eval",))]), name="judge", distribution="rlweave-judge", version="1.0")
    jsonl("train.jsonl", {"prompt": "1+1=", "chosen": "2", "rejected": "3"})
    jsonl("eval.jsonl", {"prompt": "3+3="})
    data = config(algorithm={"name": "judge"}, roles={"policy": {"backend": "fsdp"}},
                  data={"train": "train.jsonl", "eval": "eval.jsonl"})
    assert errors(data, pm=pm) == [
        "c.yaml: rewards.0: reward 'arith_exact' fails on the first record of data.eval (eval.jsonl line 1) with an "
        "empty response: ValueError: arith_exact needs an 'answer' field in the data record"]


def test_inputs_of_entries_with_config_errors_are_not_checked_again():
    jsonl("train.jsonl", {"prompt": "1+1="})
    assert errors(config(rewards=[{"name": "format", "args": {"patern": "x"}}, {"name": "arith_exct"}],
                         data={"train": "train.jsonl", "eval": 5})) == [
        "c.yaml: data.eval: Input should be a valid string (got 5)",
        "c.yaml: rewards.0.args.patern: unknown key. Did you mean 'pattern'?",
        "c.yaml: rewards.1.name: unknown reward 'arith_exct'. Choose one of: arith_exact (rlweave 0.1.0), "
        "format (rlweave 0.1.0). Did you mean 'arith_exact'?"]


def test_parquet_and_saved_datasets_are_checked_by_row():
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = {"messages": [{"role": "user", "content": "1+1="}], "answer": 2}
    bad = {"messages": [{"role": "user", "content": None}], "answer": 3}
    pq.write_table(pa.Table.from_pylist([good, good, bad]), "train.parquet")
    datasets.Dataset.from_list([{"prompt": "1+1="}]).save_to_disk("eval_set")
    Path("m").mkdir()
    Path("m/tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert errors(config(model={"path": "m"}, data={"train": "train.parquet", "eval": "eval_set"})) == [
        "c.yaml: data.train: train.parquet row 2: field 'messages': message 0 has no 'content'",
        "c.yaml: rewards.0: reward 'arith_exact' fails on the first record of data.eval (eval_set row 0) with an "
        "empty response: ValueError: arith_exact needs an 'answer' field in the data record"]


def test_chat_records_need_a_chat_template():
    jsonl("train.jsonl", {"prompt": "1+1=", "answer": 2}, {"messages": [{"role": "user", "content": "2+2="}],
                                                          "answer": 4})
    Path("m").mkdir()
    Path("m/tokenizer_config.json").write_text("{}")
    data = config(model={"path": "m"}, data={"train": "train.jsonl"})
    assert errors(data) == [
        "c.yaml: data.train: train.jsonl line 2: field 'messages': the tokenizer (m) has no chat template to render "
        "chat messages with: set data.chat_template (a Jinja template, or a .jinja file) or use a tokenizer that has "
        "one"]
    cfg, _ = valid({**data, "data": {"train": "train.jsonl", "chat_template": "{{ messages[0]['content'] }}"}})
    assert cfg.data.chat_template
    Path("m/chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert valid(data)[0].data.train == "train.jsonl"
