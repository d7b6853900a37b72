"""examples/longtail: the shipped data is what make_data.py writes, its lengths are heavy-tailed,
no held-out prompt is trained on, the rule reward scores known answers right, and the configs
(every run mode) validate."""

import argparse
import importlib.util
import json
import random
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "longtail"
DATA = EXAMPLE / "data"
BENCH = ROOT / "bench" / "async_rollout.py"


def _load(name, path=None):
    spec = importlib.util.spec_from_file_location(f"longtail_{name}_t", path or EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_modes() -> dict[str, list[str]]:
    """The overrides bench/async_rollout.py runs grpo.yaml with, per mode (its defaults)."""
    bench = _load("bench", BENCH)
    args = argparse.Namespace(budget=48, max_rounds=6, max_staleness=2, request_groups=4)
    return {m: bench.mode_overrides(m, args) for m in bench.MODE_NAMES}


MODES = bench_modes()


def _rows(name):
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_shipped_data_is_what_make_data_writes(tmp_path):
    sizes = _load("make_data").make(tmp_path)
    assert set(sizes) == {"sft_train.jsonl", "rl_train.jsonl", "test.jsonl"}
    for name, n in sizes.items():
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
        assert len(_rows(name)) == n
    assert sum((DATA / name).stat().st_size for name in sizes) < 1_000_000  # small enough to ship in git


def test_another_seed_gives_other_data(tmp_path):
    mk = _load("make_data")
    mk.make(tmp_path / "a", seed=1)
    mk.make(tmp_path / "b", seed=1)
    assert (tmp_path / "a" / "rl_train.jsonl").read_bytes() == (tmp_path / "b" / "rl_train.jsonl").read_bytes()
    assert (tmp_path / "a" / "rl_train.jsonl").read_bytes() != (DATA / "rl_train.jsonl").read_bytes()


def test_answers_count_from_a_to_b():
    for r in _rows("rl_train.jsonl") + _rows("test.jsonl"):
        a, b = map(int, r["prompt"].rstrip("=").split(".."))
        assert 0 <= a <= b <= 99 and r["answer"].split(",") == [str(k) for k in range(a, b + 1)]
    for r in _rows("sft_train.jsonl"):
        a, b = map(int, r["query"].rstrip("=").split(".."))
        assert r["response"] == ",".join(str(k) for k in range(a, b + 1))


def test_no_held_out_prompt_in_any_train_file():
    test = {r["prompt"] for r in _rows("test.jsonl")}
    train = {r["prompt"] for r in _rows("rl_train.jsonl")} | {r["query"] for r in _rows("sft_train.jsonl")}
    assert len(test) > 50 and not test & train


def test_response_lengths_are_heavy_tailed():
    """Most responses are a dozen or two tokens (one per character), one in a hundred is 200
    or more; the prompt sets the length, so no policy that answers right can shorten them."""
    lengths = sorted(len(r["answer"]) for r in _rows("rl_train.jsonl"))
    assert 12 <= statistics.median(lengths) <= 20
    assert statistics.mean(lengths) < 45
    assert lengths[int(0.99 * (len(lengths) - 1))] >= 200 and sum(n >= 150 for n in lengths) >= 100
    # a batch of 16 prompts usually holds a response several times its mean length
    rng = random.Random(0)
    ratios = []
    for _ in range(200):
        batch = rng.sample(lengths, 16)
        ratios.append(max(batch) / statistics.mean(batch))
    assert statistics.median(ratios) > 3


def test_sft_set_draws_every_count_equally_often():
    """So the SFT model learns long counts too, and its answers keep the prompts' lengths."""
    counts = [len(r["response"].split(",")) for r in _rows("sft_train.jsonl")]
    assert set(counts) == set(range(1, 81))
    assert 0.45 < sum(c > 40 for c in counts) / len(counts) < 0.55


def test_count_law_is_clipped_power_law():
    mk = _load("make_data")
    rng = random.Random(0)
    counts = [mk.draw_count(rng, alpha=1.1, max_count=80, scale=3.5) for _ in range(20000)]
    assert min(counts) == 3 and max(counts) == 80
    for k in (5, 10, 20, 40):
        share = sum(c >= k for c in counts) / len(counts)
        assert abs(share - (k / 3.5) ** -1.1) < 0.02, k
    assert [mk.draw_count(random.Random(1), alpha=0.9, max_count=80, scale=1.0) for _ in range(3)][0] >= 1


def test_reward_scores_known_answers():
    fn = _load("reward").count_exact
    assert fn("7..10=", "7,8,9,10", answer="7,8,9,10") == 1.0
    assert fn("7..10=", " 7,8,9,10\n", answer="7,8,9,10") == 1.0  # whitespace is ignored
    assert fn("5..5=", "5", answer="5") == 1.0
    for wrong in ("7,8,9", "7,8,9,10,11", "7,8,10", "78910", "7,8,9,10,", "", "7..10"):
        assert fn("7..10=", wrong, answer="7,8,9,10") == 0.0, wrong
    with pytest.raises(ValueError, match="answer"):
        fn("7..10=", "7,8,9,10")


def test_reward_agrees_with_the_data():
    fn = _load("reward").count_exact
    for r in _rows("test.jsonl")[:50]:
        assert fn(r["prompt"], r["answer"], answer=r["answer"]) == 1.0


def test_the_bench_runs_the_four_modes_of_the_issue():
    assert {"sync", "partial", "one_step_off", "async"} <= set(MODES)


@pytest.mark.parametrize("mode", list(MODES))
def test_grpo_config_validates_in_every_mode_of_the_bench(mode, monkeypatch):
    from rlweave.config.loader import load_config
    from rlweave.plugins.manager import PluginManager

    monkeypatch.chdir(ROOT)
    cfg, resolved = load_config("examples/longtail/grpo.yaml", MODES[mode], pm=PluginManager(), check_inputs=False)
    assert resolved.algorithm.name == "grpo" and set(resolved.role_names) == {"policy", "rollout"}
    assert cfg.resources.colocate == [] and cfg.roles["rollout"].engine == "vllm"
    assert cfg.run.mode == ("async" if mode.startswith("async") else "one_step_off" if mode == "one_step_off" else "sync")
    assert (cfg.rollout.partial is not None) == ("partial" in mode)
    assert cfg.algorithm.max_new_tokens >= max(len(r["answer"]) for r in _rows("rl_train.jsonl")) + 1


def test_sft_config_validates_with_the_cli(monkeypatch):
    from rlweave import cli
    from typer.testing import CliRunner

    monkeypatch.chdir(ROOT)
    for name in ("sft.yaml", "grpo.yaml"):
        result = CliRunner().invoke(cli.app, ["validate", "--schema-only", f"examples/longtail/{name}"])
        assert result.exit_code == 0, result.output
        assert "count_exact" in result.output


def test_the_bench_states_what_overlap_can_gain_at_most():
    """From sync's split: a step of generation G and the rest R overlapped takes max(G, R)."""
    bench = _load("bench", BENCH)
    sync = {"mode": "sync", "timed_s": 24.6, "timed_steps": 10, "generate_s": 1.79}
    line = bench.overlap_ceiling([sync, {"mode": "one_step_off", "timed_s": 17.7, "timed_steps": 10}])
    assert "generation 1.79 s + the rest 0.67 s" in line and "at most 1.37x (2.46 / 1.79)" in line
    train_bound = {**sync, "generate_s": 0.9}  # the rest (1.56 s) is longer than generation
    assert "at most 1.58x (2.46 / 1.56)" in bench.overlap_ceiling([train_bound])
    assert bench.overlap_ceiling([{**sync, "generate_s": None}]) is None
    assert bench.overlap_ceiling([{"mode": "sync", "error": "boom", "log": "x"}]) is None


def test_the_bench_times_an_overlapping_mode_without_its_draining_steps(tmp_path):
    """one_step_off's last step trains the batch generated in the step before and generates
    none; async's last max_staleness steps generate less. They are the pipeline draining, not
    its steady state (one_step_off's would inflate its samples/s), so the bench leaves them out;
    sync and partial keep every step after warm-up."""
    bench = _load("bench", BENCH)
    args = argparse.Namespace(max_staleness=2)
    assert [bench.drain_steps(m, args) for m in ("sync", "partial", "one_step_off", "async", "async_partial")] \
        == [0, 0, 1, 2, 2]
    run = tmp_path / "run"
    run.mkdir()
    times = [9.0, 2.0, 2.0, 2.0, 2.0, 0.5]  # step 1 generates two batches, step 6 none
    rows = [{"step": i + 1, "time/step": t, "samples": 64} for i, t in enumerate(times)] + [{"step": 6, "eval": 1}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (run / "summary.json").write_text("{}")
    every = bench.summarize(run, 1)
    assert every["timed_steps"] == 5 and every["timed_s"] == pytest.approx(8.5)
    drained = bench.summarize(run, 1, bench.drain_steps("one_step_off", args))
    assert drained["timed_steps"] == 4 and drained["timed_s"] == pytest.approx(8.0)
    assert drained["timed_samples"] / drained["timed_s"] == pytest.approx(32.0)  # the steady 64 samples / 2 s


def test_the_bench_runs_rlweave_from_the_python_path_without_the_command(monkeypatch, tmp_path):
    """On a machine where rlweave is importable but not installed (scripts/gpu_run.sh), the bench
    runs ``python -m rlweave.cli``."""
    import shutil
    import sys

    bench = _load("bench", BENCH)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    assert bench.rlweave_cmd() == [str(tmp_path / "python3"), "-m", "rlweave.cli"]
