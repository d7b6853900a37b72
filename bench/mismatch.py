"""Train/inference mismatch: GRPO with a bf16 rollout engine and an fp32 policy, per rollout correction.

Each rollout correction runs against none and against a matched-precision run, in one table.

Every row is one ``rlweave train`` of an example's GRPO config (``examples/arith/grpo.yaml``, or
``examples/moe/grpo.yaml`` with ``--example moe``) in its own process, one after the other, from the
same SFT model with the same seed and budget; only the engine's dtype and the rollout correction
differ (``docs/algorithms.md``, "Rollout corrections"):

* ``matched``: the engine in fp32 like the policy (``roles.rollout.options.dtype=float32``);
* ``none``: the engine in ``--engine-dtype`` (bf16), no correction (the plain GRPO loss);
* ``token_tis``, ``seq_tis``, ``token_mis``, ``seq_mis``, ``icepop``, ``geo_mask``: the bf16 engine
  and ``algorithm.off_policy.correction=<name>`` with the correction's default options,
  ``decoupled`` mode (one update per batch: the proximal policy is the current one);
* ``<correction>:<option>=<value>[:...]``: that correction with those options (e.g.
  ``geo_mask:high=1.01``), the bf16 engine, ``decoupled`` mode;
* ``r3`` (only when named, MoE models): the bf16 engine, no correction, MoE router replay R3
  (``algorithm.router_replay=r3``: the engine's expert choices replayed in training, ``docs/moe.md``);
  it needs an engine that records routing (``--engine hf``).

``--engine`` runs every row's rollout on another engine plugin with that engine's default options
(the example configs set vLLM's).

Printed per row: held-out exact match before, at the end and at the best evaluation during the
run (``eval/accuracy`` of ``metrics.jsonl``: greedy, **by the run's own engine**, so bf16 for the
bf16 rows); the final weights evaluated again in fp32 on the transformers engine (``rlweave eval
RUN_DIR --engine hf --dtype float32``), the same judge for every row; the means over all steps of
the mismatch metrics (``mismatch/k1``, ``k3``, ``dlogp_abs_mean``, ``dlogp_abs_p99``, and the share of
trained tokens truncated or masked and of samples masked by the correction) and, with router replay,
of ``moe_replay_changed_frac`` (the share of replayed routing decisions that differ from the
trainer's routers' own: R3, where trainer and engine disagree); the largest ``mismatch/k3`` and
``mismatch/dlogp_abs_max`` of any step; and the wall time of the whole ``rlweave train`` process
(start-up and evaluations included).

The runs go to ``<--out-dir>/mismatch-<example>[-<engine>]-<row>[-s<seed>]``. The bench marks each run
directory it creates (``bench-mismatch.json``; before the run starts, its name goes into
``<--out-dir>/bench-mismatch-runs.txt``, so a run the bench was stopped in is known as its own) and
replaces only those (``--overwrite``: the old one is moved aside, never deleted); it refuses to
start when a run directory it would use holds another run. Run from the repository root, after the example's SFT stage, on a quiet machine:

    python bench/mismatch.py                                     # arith, 8 rows, 200 steps each
    python bench/mismatch.py --model /path/to/sft/hf --steps 100
    python bench/mismatch.py --example moe --engine hf --rows matched,none,r3,token_tis
    python bench/mismatch.py --rows matched,none --seeds 1,2 --out rows.json
    python bench/mismatch.py --rows none,geo_mask,geo_mask:high=1.01
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {"arith": (REPO / "examples" / "arith" / "grpo.yaml", REPO / "runs" / "arith-sft" / "hf"),
            "moe": (REPO / "examples" / "moe" / "grpo.yaml", REPO / "runs" / "moe-sft" / "hf")}
CORRECTIONS = ("token_tis", "seq_tis", "token_mis", "seq_mis", "icepop", "geo_mask")
ROWS = ("matched", "none", *CORRECTIONS)
#: rows run only when named: MoE router replay (R3) with the bf16 engine, no correction
EXTRA_ROWS = ("r3",)
MARKER = "bench-mismatch.json"
#: in the output directory: the run directories the bench started, one name a line
LEDGER = "bench-mismatch-runs.txt"
#: table column -> metrics.jsonl key, averaged over the steps that logged it
MEANS = {"k1": "mismatch/k1", "k3": "mismatch/k3", "dlogp_mean": "mismatch/dlogp_abs_mean",
         "dlogp_p99": "mismatch/dlogp_abs_p99", "truncated": "mismatch/truncated_frac",
         "masked": "mismatch/masked_frac", "samples_masked": "mismatch/samples_masked_frac",
         "routing_changed": "moe_replay_changed_frac"}
#: table column -> metrics.jsonl key, the largest value over the steps
PEAKS = {"k3_peak": "mismatch/k3", "dlogp_max": "mismatch/dlogp_abs_max"}


def parse_row(row: str) -> tuple[str, dict[str, str]]:
    """``(name, options)`` of a row: ``name`` or ``<correction>:<option>=<value>[:...]``."""
    name, *opts = row.split(":")
    if name not in ROWS + EXTRA_ROWS:
        raise ValueError(f"unknown row {row!r}; choose from {', '.join(ROWS + EXTRA_ROWS)}, or "
                         "<correction>:<option>=<value>")
    if opts and name not in CORRECTIONS:
        raise ValueError(f"row {row!r}: only a correction ({', '.join(CORRECTIONS)}) takes options")
    options = dict(o.split("=", 1) for o in opts if "=" in o)
    if len(options) != len(opts):
        raise ValueError(f"row {row!r}: options are <option>=<value>, separated by ':'")
    return name, options


def overrides(row: str, engine_dtype: str, engine: str | None = None) -> list[str]:
    """The ``key=value`` overrides of one row (beyond the model, run name and budget); with
    ``engine``, the rollout runs on that engine with its default options and the row's dtype."""
    row, options = parse_row(row)
    out = [f"roles.rollout.engine={engine}", "roles.rollout.options={}"] if engine else []
    if row == "matched":
        return [*out, "roles.rollout.options.dtype=float32"]
    out.append(f"roles.rollout.options.dtype={engine_dtype}")
    if row == "r3":
        return [*out, "algorithm.router_replay=r3"]
    if row == "none":
        return out
    if options:
        spec = ", ".join(f"{k}: {v}" for k, v in options.items())
        return [*out, f"algorithm.off_policy.correction={{name: {row}, {spec}}}"]
    return [*out, f"algorithm.off_policy.correction={row}"]


def _finite(v) -> bool:
    """Whether a metrics.jsonl value is a finite number."""
    return isinstance(v, (int, float)) and math.isfinite(v)


def summarize(run_dir: Path) -> dict:
    """Held-out accuracy (before, final, best after step 0 and its step), the step means of
    :data:`MEANS` and the step maxima of :data:`PEAKS` from a run directory's ``metrics.jsonl``."""
    evals: list[tuple[int, float]] = []
    sums = {k: [0.0, 0] for k in MEANS}
    peaks: dict[str, float | None] = {k: None for k in PEAKS}
    steps = 0
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if "eval/accuracy" in rec:
                evals.append((int(rec["step"]), 100.0 * rec["eval/accuracy"]))
            if "mismatch/tokens" in rec:
                steps += 1
            for col, key in MEANS.items():
                if _finite(rec.get(key)):
                    sums[col][0] += rec[key]
                    sums[col][1] += 1
            for col, key in PEAKS.items():
                if _finite(rec.get(key)):
                    peaks[col] = max(rec[key], peaks[col]) if peaks[col] is not None else rec[key]
    if not evals:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no eval/accuracy")
    during = [e for e in evals if e[0] > 0] or evals
    best_step, best = max(during, key=lambda e: (e[1], -e[0]))
    out = {"before": evals[0][1], "final": evals[-1][1], "best": best, "best_step": best_step, "steps": steps}
    out.update({col: (s / n if n else None) for col, (s, n) in sums.items()})
    out.update(peaks)
    return out


def fp32_eval(run_dir: Path, env: dict) -> float | None:
    """Held-out exact match of the run's final weights, greedy, fp32, transformers engine."""
    args = [sys.executable, "-m", "rlweave.cli", "eval", str(run_dir), "--engine", "hf", "--dtype", "float32",
            "--json"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"fp32 eval of {run_dir} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return 100.0 * json.loads(lines[-1])["exact_match"]


def started_here(run_dir: Path) -> bool:
    """Whether the bench started the run in ``run_dir`` (its name in the output directory's ledger)."""
    ledger = run_dir.parent / LEDGER
    return ledger.is_file() and run_dir.name in ledger.read_text().split()


def check_run_dir(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run of this bench (to be replaced); exits when it holds another."""
    if not run_dir.exists():
        return False
    if (run_dir / MARKER).exists() or started_here(run_dir):
        return True
    sys.exit(f"bench/mismatch.py: {run_dir} holds a run this bench did not create; move it or pass --out-dir")


def run(example: str, row: str, seed: int, a: argparse.Namespace) -> dict:
    """One ``rlweave train`` of ``row``; its summary row."""
    cfg, _ = EXAMPLES[example]
    engine = f"-{a.engine}" if a.engine else ""
    label = row.replace(":", "-").replace("=", "")
    name = f"mismatch-{example}{engine}-{label}" + (f"-s{seed}" if len(a.seed_list) > 1 else "")
    run_dir = Path(a.out_dir) / name
    args = [sys.executable, "-m", "rlweave.cli", "train", str(cfg), f"run.name={name}",
            f"run.output_dir={a.out_dir}", f"run.seed={seed}", f"model.path={a.model}",
            *overrides(row, a.engine_dtype, a.engine)]
    if a.steps:
        args.append(f"run.total_steps={a.steps}")
    if a.eval_every is not None:
        args.append(f"run.eval_every={a.eval_every}")
    if check_run_dir(run_dir):
        args.append("--overwrite")
    elif not started_here(run_dir):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(run_dir.parent / LEDGER, "a") as f:
            f.write(name + "\n")
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    base = {"example": example, "row": row, "seed": seed, "run_dir": str(run_dir), "wall_s": wall,
            "overrides": overrides(row, a.engine_dtype, a.engine)}
    if run_dir.exists():
        (run_dir / MARKER).write_text(json.dumps(base, indent=1))
    if proc.returncode != 0:
        print(proc.stdout[-3000:], file=sys.stderr)
        return {**base, "error": f"exit {proc.returncode}"}
    out = {**base, **summarize(run_dir), "fp32_final": fp32_eval(run_dir, env)}
    (run_dir / MARKER).write_text(json.dumps(out, indent=1))
    return out


def _f(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def table(rows: list[dict]) -> str:
    """The markdown table of the rows (one per run)."""
    multi = len({r["seed"] for r in rows}) > 1
    head = ["row", *(["seed"] if multi else []), "held-out before", "final", "best (step)", "final, fp32 eval",
            "k1", "k3", "k3 peak", "\\|dlogp\\| mean", "\\|dlogp\\| p99", "\\|dlogp\\| max", "tokens truncated",
            "tokens masked", "samples masked", "routing changed", "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        seed = [str(r["seed"])] if multi else []
        if "error" in r:
            cells = [r["row"], *seed, f"failed: {r['error']}", *[""] * (len(head) - 3 - len(seed)),
                     f"{r['wall_s']:.0f} s"]
        else:
            cells = [r["row"], *seed, f"{r['before']:.1f}%", f"{r['final']:.1f}%",
                     f"{r['best']:.1f}% ({r['best_step']})", _f(r["fp32_final"], ".1f") + "%",
                     _f(r["k1"], ".1e"), _f(r["k3"], ".1e"), _f(r.get("k3_peak"), ".1e"), _f(r["dlogp_mean"], ".1e"),
                     _f(r["dlogp_p99"], ".1e"), _f(r.get("dlogp_max"), ".2g"), _f(r["truncated"], ".1%"),
                     _f(r["masked"], ".1%"), _f(r["samples_masked"], ".1%"), _f(r.get("routing_changed"), ".2%"),
                     f"{r['wall_s']:.0f} s"]
            if r["fp32_final"] is None:
                cells[len(seed) + 4] = "failed"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_means(rows: list[dict]) -> str:
    """With several seeds: each row's held-out accuracy averaged over its seeds."""
    by_row: dict[str, list[dict]] = {}
    for r in rows:
        if "error" not in r:
            by_row.setdefault(r["row"], []).append(r)
    lines = ["| row | seeds | final (mean) | best (mean) | final, fp32 eval (mean) |", "|---|---|---|---|---|"]
    for row, rs in by_row.items():
        fp32 = [r["fp32_final"] for r in rs if r["fp32_final"] is not None]
        lines.append(f"| {row} | {len(rs)} | {sum(r['final'] for r in rs) / len(rs):.1f}% "
                     f"| {sum(r['best'] for r in rs) / len(rs):.1f}% "
                     f"| {(sum(fp32) / len(fp32)) if fp32 else float('nan'):.1f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", choices=sorted(EXAMPLES), default="arith", help="whose GRPO config")
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"comma-separated rows (default: {','.join(ROWS)}; also {','.join(EXTRA_ROWS)}, "
                    "or <correction>:<option>=<value>[:...])")
    ap.add_argument("--model", default=None, help="the SFT model (default: runs/<example>-sft/hf)")
    ap.add_argument("--engine", default=None,
                    help="rollout engine plugin for every row, with its default options (default: the config's)")
    ap.add_argument("--engine-dtype", default="bfloat16", choices=["bfloat16", "float16"],
                    help="the engine's dtype in every row but matched")
    ap.add_argument("--steps", type=int, default=None, help="override run.total_steps (the config's: 200)")
    ap.add_argument("--eval-every", type=int, default=None, help="override run.eval_every (the config's: 50)")
    ap.add_argument("--seeds", default="1", help="comma-separated run.seed values; each row runs once per seed")
    ap.add_argument("--out-dir", default=str(REPO / "runs"), help="where the runs go")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    a = ap.parse_args()
    names = [n for n in a.rows.split(",") if n]
    for n in names:
        try:
            parse_row(n)
        except ValueError as exc:
            raise SystemExit(f"bench/mismatch.py: --rows: {exc}") from None
    a.seed_list = [int(s) for s in a.seeds.split(",") if s]
    a.model = str(Path(a.model).resolve()) if a.model else str(EXAMPLES[a.example][1])
    if not Path(a.model).is_dir():
        raise SystemExit(f"bench/mismatch.py: no SFT model at {a.model}: run the example's sft.yaml or pass --model")
    print(f"# {datetime.date.today()}, {cpu_name()}; {a.example}: {EXAMPLES[a.example][0].relative_to(REPO)} from "
          f"{a.model}, engine {a.engine or 'of the config'} in {a.engine_dtype} (matched: float32), policy float32",
          flush=True)
    rows = []
    for seed in a.seed_list:
        for name in names:
            r = run(a.example, name, seed, a)
            rows.append(r)
            print(f"{name} (seed {seed}): " + (r.get("error") or
                  f"{r['before']:.1f}% -> {r['final']:.1f}% (best {r['best']:.1f}% at {r['best_step']}, "
                  f"fp32 eval {_f(r['fp32_final'], '.1f')}%), |dlogp| p99 {_f(r['dlogp_p99'], '.1e')}, "
                  f"{r['wall_s']:.0f} s"), flush=True)
    print()
    print(table(rows))
    if len(a.seed_list) > 1:
        print()
        print(seed_means(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
