#!/usr/bin/env bash
# The main job: build the tiny model and tokenizer, SFT it on examples/arith, then GRPO it
# (vLLM rollout + FSDP policy), printing held-out exact-match accuracy before and after each
# stage. Runs from any directory; outputs go to runs/arith-sft and runs/arith-grpo (the runs of an
# earlier demo are moved aside to runs/<name>.replaced-<UTC time>, never deleted).
#   bash scripts/demo.sh            (DEMO_STRICT=1: exit 1 if GRPO gains < 10 points)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
export RAY_AUTH_MODE=disabled
export PYTHONUNBUFFERED=1
start=$(date +%s)

echo "== 1/3 build the tiny Qwen2 model and its tokenizer"
mkdir -p examples/arith/artifacts
# the libraries' own lines (progress bars, accelerator notices) go to a log, shown only on failure
"$PY" examples/arith/build_model.py --out examples/arith/artifacts/base > examples/arith/artifacts/build.log 2>&1 \
  || { cat examples/arith/artifacts/build.log >&2; exit 1; }
grep '^wrote ' examples/arith/artifacts/build.log

echo "== 2/3 SFT: rlweave train examples/arith/sft.yaml"
timeout 1200 "$PY" -m rlweave.cli train examples/arith/sft.yaml --overwrite

echo "== 3/3 GRPO from the SFT model: rlweave train examples/arith/grpo.yaml"
timeout 1200 "$PY" -m rlweave.cli train examples/arith/grpo.yaml --overwrite

"$PY" - "$start" <<'PY'
import json, os, sys, time
sft = json.load(open("runs/arith-sft/summary.json"))
grpo = json.load(open("runs/arith-grpo/summary.json"))
acc = lambda s, k: 100.0 * s[k]["eval/accuracy"]
n = int(grpo["eval_after"]["eval/n"])
base, after_sft = acc(sft, "eval_before"), acc(sft, "eval_after")
before_grpo, after_grpo = acc(grpo, "eval_before"), acc(grpo, "eval_after")
gain = after_grpo - before_grpo
print()
print(f"held-out exact match on {n} test prompts never trained on (examples/arith/data/test.jsonl):")
print(f"  SFT : {base:5.1f}% -> {after_sft:5.1f}%   (random base model -> SFT model)")
print(f"  GRPO: {before_grpo:5.1f}% -> {after_grpo:5.1f}%   ({gain:+.1f} points over the SFT model; target >= +10)")
print(f"  final model: {grpo['hf_path']}   plots: {sft['plot_path']}, {grpo['plot_path']}")
print(f"  wall time: {time.time() - float(sys.argv[1]):.0f} s")
if os.environ.get("DEMO_STRICT") == "1" and gain < 10:
    sys.exit(1)
PY
