"""What recording the run's timeline costs: the main job's GRPO with ``run.trace`` on and off.

    .venv/bin/python bench/trace_overhead.py                  # 3 turns of 12 steps per setting
    .venv/bin/python bench/trace_overhead.py --turns 2 --steps 8 --mode one_step_off

Each turn runs ``rlweave train examples/arith/grpo.yaml`` once with ``run.trace=true`` and once
with ``run.trace=false`` (separate processes, taking turns so a noisy neighbour hits both), on
the demo's model as ``make demo`` builds it (``examples/arith/artifacts/base``, random weights,
~1M parameters: a step is nearly all fixed cost, dispatch and engine calls, the case where the
per-call recording weighs most). A step's time is its ``time/step`` metric; the first
``--warmup`` steps of each run are not counted. The table gives the median step time of each
setting, their ratio, the spans recorded per step, and the time the end of a run spends writing
``trace.json`` and drawing ``timeline.png`` (once per run, not per step). On a machine shared with
other work the two medians move more than the recording costs, so the script also times the
recording itself (a span recorded, its timing taken and its ``Timed`` result pickled, 200,000
times) and gives that times the spans per step as a share of a step: the overhead without noise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "arith" / "grpo.yaml"
MODEL = REPO / "examples" / "arith" / "artifacts" / "base"


def one_run(out: Path, name: str, trace: bool, steps: int, mode: str) -> dict:
    """One ``rlweave train`` of ``steps`` steps; its step times and trace facts."""
    args = [sys.executable, "-m", "rlweave.cli", "train", str(CONFIG), f"run.name={name}", f"run.output_dir={out}",
            f"run.total_steps={steps}", "run.eval_every=0", "run.save_every=0", "run.save_hf=false",
            "data.eval_size=8", f"model.path={MODEL}", f"run.trace={str(trace).lower()}", f"run.mode={mode}"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"run {name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = out / name
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = {r["step"]: r["time/step"] for r in rows if r.get("step", 0) >= 1 and "time/step" in r}
    facts: dict = {"times": times}
    if trace:
        from rlweave.runner.timeline import draw_timeline

        t0 = time.perf_counter()
        events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        facts["spans_per_step"] = len(spans) / steps
        # what the end of a run does with them: write the JSON, draw the picture (timed here)
        (out / f"{name}.again.json").write_text(json.dumps({"traceEvents": events}))
        tracks = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
        draw_timeline([{"track": tracks[e["pid"]], "rank": e["tid"], "name": e["name"], "start": e["ts"] / 1e6,
                        "end": (e["ts"] + e["dur"]) / 1e6, "step": e["args"].get("step", 0)} for e in spans],
                      out / f"{name}.png", title=name)
        facts["write_s"] = time.perf_counter() - t0
    return facts


def span_cost_s(n: int = 200_000) -> float:
    """Seconds one recorded span costs: the controller's :meth:`Trace.span` plus the rank's
    timing (two clock reads) and the pickling of its :class:`Timed` result (what Ray sends)."""
    import pickle

    from rlweave.scheduler.trace import Timed, Trace

    t = Trace()
    t.start()
    t0 = time.perf_counter()
    for i in range(n):
        a = time.time()
        pickle.loads(pickle.dumps(Timed(i, a, time.time())))
        t.span("policy", 0, "train_step", a, a + 1.0)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--mode", default="sync", help="run.mode of every run")
    args = ap.parse_args()
    if not MODEL.is_dir():
        sys.exit(f"{MODEL} is missing: build it with .venv/bin/python examples/arith/build_model.py --out {MODEL}")
    step_s: dict[bool, list[float]] = {True: [], False: []}
    spans, writes = [], []
    with tempfile.TemporaryDirectory(prefix="rlweave-trace-bench-") as tmp:
        for turn in range(args.turns):
            for trace in (True, False):
                facts = one_run(Path(tmp), f"t{turn}-{'on' if trace else 'off'}", trace, args.steps, args.mode)
                step_s[trace] += [t for s, t in facts["times"].items() if s > args.warmup]
                if trace:
                    spans.append(facts["spans_per_step"])
                    writes.append(facts["write_s"])
                print(f"turn {turn + 1}/{args.turns} trace={trace}: median step "
                      f"{statistics.median(step_s[trace]):.3f}s", file=sys.stderr, flush=True)
    on, off = statistics.median(step_s[True]), statistics.median(step_s[False])
    print(f"# run.trace on vs off, GRPO {args.mode}, {args.turns} turns x {args.steps} steps "
          f"({args.warmup} warm-up steps not counted); {cpu_name()}; {dt.date.today()}")
    print("| setting | steps timed | median step (s) | mean step (s) |")
    print("|---|---|---|---|")
    for trace in (True, False):
        xs = step_s[trace]
        setting = f"run.trace={str(trace).lower()}"
        print(f"| {setting} | {len(xs)} | {statistics.median(xs):.3f} | {statistics.fmean(xs):.3f} |")
    cost = span_cost_s()
    per_step = statistics.fmean(spans)
    print(f"\nrecording one span: {cost * 1e6:.2f} us; {per_step:.0f} spans per step: "
          f"{per_step * cost * 1e3:.3f} ms per step = {100 * per_step * cost / off:.3f}% of the median step without it")
    print(f"on/off median step time: {on / off:.3f} ({100 * (on / off - 1):+.1f}%); "
          f"spans per step: {statistics.fmean(spans):.0f}; writing trace.json and drawing timeline.png at the end: "
          f"{statistics.fmean(writes):.2f} s per run")


if __name__ == "__main__":
    main()
