#!/usr/bin/env bash
# Run the same PPO config with both placements and print their final metrics side by side:
#   colocated   (ppo.yaml):       all five roles on one device, taking turns, idle ones offloaded
#   split pools (ppo_split.yaml): every role on its own device(s); calls overlap
# Run from the repository root after sft.yaml and rm.yaml. Extra arguments are passed to both
# runs as overrides, e.g.  bash examples/arith/ppo_placements.sh run.total_steps=10
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
"$PY" -m rlweave.cli train examples/arith/ppo.yaml --overwrite "$@"
"$PY" -m rlweave.cli train examples/arith/ppo_split.yaml --overwrite "$@"
"$PY" - "$@" <<'PYEOF'
import json
import sys
from pathlib import Path

from rlweave.config.loader import load_config

runs = {}
for label, cfg_path in (("colocated", "examples/arith/ppo.yaml"), ("split pools", "examples/arith/ppo_split.yaml")):
    cfg, _ = load_config(cfg_path, sys.argv[1:])
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "time/step" in r]
    last = steps[-1] if steps else {}
    mean = lambda k: sum(r.get(k, 0.0) for r in steps) / max(1, len(steps))  # noqa: E731
    runs[label] = {
        "eval accuracy before": (summary.get("eval_before") or {}).get("eval/accuracy"),
        "eval accuracy after": (summary.get("eval_after") or {}).get("eval/accuracy"),
        "steps": summary.get("steps"),
        "wall time (s)": summary.get("wall_s"),
        "mean step time (s)": mean("time/step"),
        "  generate (s)": mean("time/generate"),
        "  experience (s)": mean("time/experience"),
        "  train policy (s)": mean("time/train"),
        "  train critic (s)": mean("time/critic_train"),
        "  sync (s)": mean("time/sync"),
        "  offload/onload (s)": mean("time/offload"),
        "final RM reward": last.get("reward/mean"),
        "final KL": last.get("kl"),
        "final value loss": last.get("value_loss"),
        "final explained var.": last.get("explained_variance"),
    }
labels = list(runs)
print()
print(f"{'':26s}" + "".join(f"{lab:>16s}" for lab in labels))
for key in runs[labels[0]]:
    cells = []
    for lab in labels:
        v = runs[lab][key]
        cells.append(f"{'-':>16s}" if v is None else f"{v:>16.3f}" if isinstance(v, float) else f"{v!s:>16s}")
    print(f"{key:26s}" + "".join(cells))
PYEOF
