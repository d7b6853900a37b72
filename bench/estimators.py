"""The named advantage estimators and policy losses on the arith task, side by side in one run.

Each config of ``examples/arith/estimators/`` (plus ``examples/arith/grpo.yaml``, plain GRPO) runs
through ``rlweave train`` in its own process, one after the other, from the same SFT model
(``runs/arith-sft/hf``: ``make demo`` or ``rlweave train examples/arith/sft.yaml``) with the same
seed, budget (200 steps of 32 prompts x 8 samples) and sampling; only the named parts differ.
``grpo_rm`` also needs the reward model of ``examples/arith/rm.yaml`` (``runs/arith-rm/hf``) and
trains on its scores alone. Printed per run: held-out exact match on the 300 test prompts before
and after (``eval/accuracy``), the gain in points, and the wall time of the whole
``rlweave train`` process. Run from the repository root on a quiet machine:

    python bench/estimators.py                       # every row, ~1-2 min each
    python bench/estimators.py --runs rloo,gspo --steps 50 --out /tmp/est.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EST = REPO / "examples" / "arith" / "estimators"
ROWS = {"grpo": REPO / "examples" / "arith" / "grpo.yaml",
        **{p.stem: p for p in sorted(EST.glob("*.yaml"))}}


def run(name: str, cfg: Path, steps: int | None, out_dir: str) -> dict:
    args = [sys.executable, "-m", "rlweave.cli", "train", str(cfg), "--overwrite",
            f"run.name=bench-est-{name}", f"run.output_dir={out_dir}"]
    if steps:
        args.append(f"run.total_steps={steps}")
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, env=dict(os.environ, RAY_AUTH_MODE="disabled"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], file=sys.stderr)
        return {"run": name, "error": f"exit {proc.returncode}", "wall_s": wall}
    summary = json.loads((Path(out_dir) / f"bench-est-{name}" / "summary.json").read_text())
    before = 100.0 * summary["eval_before"]["eval/accuracy"]
    after = 100.0 * summary["eval_after"]["eval/accuracy"]
    return {"run": name, "config": str(cfg.relative_to(REPO)), "before": before, "after": after,
            "gain": after - before, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=",".join(ROWS), help="comma-separated rows (default: all)")
    ap.add_argument("--steps", type=int, default=None, help="override run.total_steps")
    ap.add_argument("--out-dir", default=str(REPO / "runs"), help="where the runs go")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    a = ap.parse_args()
    names = [n for n in a.runs.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    print(f"# {datetime.date.today()}, {cpu_name()}")
    rows = []
    for name in names:
        rows.append(run(name, ROWS[name], a.steps, a.out_dir))
        r = rows[-1]
        print(f"{r['run']}: " + (r.get("error") or f"{r['before']:.1f}% -> {r['after']:.1f}% "
                                 f"({r['gain']:+.1f}), {r['wall_s']:.0f} s"), flush=True)
    print("\n| run | config | held-out before | after | gain (points) | wall time |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['run']} | | | failed: {r['error']} | | {r['wall_s']:.0f} s |")
        else:
            print(f"| {r['run']} | `{r['config']}` | {r['before']:.1f}% | {r['after']:.1f}% | {r['gain']:+.1f} "
                  f"| {r['wall_s']:.0f} s |")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
