"""Reproducible and replayable runs (docs/reproducibility.md), end to end through ``rlweave train``.

Three runs of 20 steps of tiny GRPO (in process, FSDP policy, HF engine, a length reward beside
``arith_exact`` so every step moves the weights), each with ``run.deterministic: true``:

* ``first`` dumps its rollouts (``rollout.dump``), ``second`` does not: their step-20 checkpoints
  hash the same (:func:`rlweave.backend_helpers.weights_hash.checkpoint_hash`) and their metrics rows are
  equal but for the times;
* ``replayed`` trains from ``first``'s dump with no rollout role in its config (no engine, no
  reward called): the same checkpoint hash, and the same rows but for the times, the weight sync
  and the evaluations it skips.

The dump holds what a replay needs (token ids, masks, engine log-probs, rewards) in safetensors,
with a header naming the model; a replay into another model is refused at ``rollout.replay``
before anything starts.
"""

from __future__ import annotations

import json
import shutil

import pytest

from rlweave.testing.runs import cli_env, length_reward, metrics_rows, run_cli

STEPS = 20
#: metrics a replay cannot have: no engine to sync or evaluate with
NOT_REPLAYED = ("sync_bytes",)


def _comparable(rows: list[dict], drop_eval: bool = False) -> list[dict]:
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if not k.startswith("time") and not k.endswith("time_s")
               and k not in NOT_REPLAYED and not (drop_eval and k.startswith("eval/"))}
        if set(row) > {"step"}:
            out.append(row)
    return out


@pytest.fixture(scope="module")
def runs(grpo_workspace, tmp_path_factory):
    """``{name: run_dir}`` of the three runs (see the module docstring)."""
    ws, tmp = grpo_workspace, tmp_path_factory.mktemp("repro")
    rewards = [{"name": "arith_exact"}, {"name": length_reward(tmp), "weight": 0.5}]
    run = {"scheduler": "in_process", "deterministic": True}
    out = {}
    for name, rollout in (("first", {"dump": True}), ("second", {}),
                          ("replayed", {"replay": str(ws.root / "runs" / "first")})):
        path = ws.config(name, STEPS, run=run, rewards=rewards, rollout=rollout, logging={"backends": ["jsonl"]})
        if name == "replayed":  # no engine at all: the rollout role is not even configured
            cfg = json.loads(path.read_text())
            del cfg["roles"]["rollout"]
            path.write_text(json.dumps(cfg))
        rc, text, _ = run_cli(["train", str(path)], cli_env(tmp), timeout=600)
        assert rc == 0, text[-4000:]
        out[name] = ws.root / "runs" / name
    return out


def _hash(run_dir) -> str:
    from rlweave.backend_helpers.weights_hash import checkpoint_hash

    return checkpoint_hash(run_dir / "checkpoints" / f"step_{STEPS:06d}")


def test_two_deterministic_runs_are_bitwise_identical(runs):
    assert _hash(runs["first"]) == _hash(runs["second"])
    first = _comparable(metrics_rows(runs["first"]))
    assert len(first) >= STEPS and any(r.get("grad_norm", 0) > 0 for r in first)
    assert first == _comparable(metrics_rows(runs["second"]))


def test_a_replayed_dump_reproduces_the_weights(runs):
    assert json.loads((runs["replayed"] / "workers.json").read_text()).keys() == {"policy"}  # no engine started
    assert _hash(runs["replayed"]) == _hash(runs["first"])
    assert _comparable(metrics_rows(runs["replayed"]), drop_eval=True) == \
        _comparable(metrics_rows(runs["first"]), drop_eval=True)


def test_the_dump_holds_each_steps_trajectories_and_rewards(runs):
    from safetensors import safe_open

    folder = runs["first"] / "rollouts"
    header = json.loads((folder / "header.json").read_text())
    assert header["algorithm"] == "grpo" and header["seed"] == 5 and len(header["model"]["fingerprint"]) == 64
    assert sorted(p.name for p in folder.glob("step_*")) == [f"step_{i:06d}.safetensors" for i in range(1, STEPS + 1)]
    with safe_open(str(folder / "step_000001.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        events = json.loads(f.metadata()["rlweave"])["events"]
        n = len(f.get_tensor("1.scores"))
    assert {"0.cu_seqlens", "0.token.input_ids", "0.token.loss_mask", "0.token.rollout_logprobs", "1.scores"} <= keys
    assert [e["kind"] for e in events] == ["batch", "scores"] and len(events[0]["ids"]) == n == 16
    assert "reward/rules" in events[1]["metrics"]


def test_a_dump_of_another_model_is_refused(runs, grpo_workspace, tmp_path):
    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    other = tmp_path / "other_model"
    shutil.copytree(grpo_workspace.model, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5 if cfg.get("rms_norm_eps") != 1e-5 else 1e-6
    (other / "config.json").write_text(json.dumps(cfg))
    path = grpo_workspace.config("other", STEPS, model={"path": str(other)},
                                 rollout={"replay": str(runs["first"])})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "rollout.replay: the dump was made with another model" in str(err.value)
