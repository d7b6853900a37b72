"""Partial rollout and the overlapping run modes on the long-tail task, side by side in one run.

The task of ``examples/longtail`` (count from a to b; the prompt sets the response length, heavy-tailed:
median 17 tokens, p99 239) from its SFT model, GRPO as ``examples/longtail/grpo.yaml`` has it
(16 prompts x 4 samples a step, FSDP policy and vLLM rollout on devices of their own, no
colocation), once per mode, each through ``rlweave train`` in its own process:

* ``sync``: generate, train, sync; generation waits for the batch's longest response.
* ``partial``: sync steps with ``rollout.partial`` (``--budget`` tokens a round, ``--max-rounds``).
* ``one_step_off``: the next batch is generated while this one trains.
* ``async``: groups stream through a bounded queue, at most ``run.max_staleness`` versions old.
* ``async_partial`` (only when named in ``--modes``): ``async`` with ``rollout.partial``.

Every mode trains ``data.batch_size`` complete groups a step, so the same ``--steps`` is the same
number of trained samples. On a CPU the two roles' devices are virtual and share the cores: each
role gets ``--role-threads`` of them (default: half), as if each had devices of its own; without
that, overlapping generation and training oversubscribes the cores.

Per mode, from each run's ``metrics.jsonl`` (the steps after the first ``--warmup``, without the
last steps of an overlapping mode, where its pipeline drains: :func:`drain_steps`): steps per
hour and trained samples per second (over the sum of ``time/step``), the ratio to sync, the
held-out reward after the last step (``eval/reward_mean`` on ``data/test.jsonl``, in points; in
brackets the difference to sync), the trained response lengths (each step's p50/p90/p99 averaged
over the timed steps, and the longest), the mean and largest staleness, the share of trained samples
that took more than one round, and each role's idle seconds per step (``time/idle/rollout``,
``time/idle/policy``; plain sync steps report none, so they are derived and marked ``~``: the
policy waits while the engine generates, ``time/generate``, and the engine for the rest), and each
role's on-CPU seconds per step (its ranks' user + system time over the timed steps but the last, read
while the run goes on: :mod:`rank_cpu`; with one core per role, a role whose figure is close to the
step's is what the step waits for).
``--repeat N`` runs all modes N times, taking turns, with seeds ``run.seed + k``; throughput is
pooled over the repeats and the reward averaged. Below the table: the most overlap can gain, from
sync's split of a step into generation and the rest (:func:`overlap_ceiling`).

The SFT model is ``runs/longtail-sft/hf`` when it exists (``rlweave train
examples/longtail/sft.yaml``), else it is built in the work directory first (the base model, then
that SFT run). Run on a quiet machine, from anywhere:

    python bench/async_rollout.py                                 # the four modes, 60 steps each
    python bench/async_rollout.py --steps 20 --modes sync,async --out /tmp/async.json

``--task tools`` runs ``examples/tools/grpo.yaml`` instead: multi-turn episodes with a calculator
tool (16 prompts x 8 episodes a step, at most 3 model turns of 96 tokens), from
``runs/tools-sft/hf`` (or an SFT run of ``examples/tools/sft.yaml`` in the work directory); its
episodes take ``sync``, ``one_step_off`` and ``partial`` (episodes in rounds), not ``async``:

    python bench/async_rollout.py --task tools --steps 15 --modes sync,one_step_off --repeat 2
    python bench/async_rollout.py --task tools --steps 15 --modes sync,partial --budget 32
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: per task: the example folder and what a step's batch is
TASKS = {
    "longtail": ("longtail", "16 prompts x 4 samples, <= 256 new tokens"),
    "tools": ("tools", "16 prompts x 8 episodes of <= 3 model turns (<= 96 tokens each)"),
}
EXAMPLE = ROOT / "examples" / "longtail"
CONFIG = EXAMPLE / "grpo.yaml"
SFT_CONFIG = EXAMPLE / "sft.yaml"
SFT_MODEL = ROOT / "runs" / "longtail-sft" / "hf"
MODE_NAMES = ("sync", "partial", "one_step_off", "async", "async_partial")
DEFAULT_MODES = MODE_NAMES[:4]
SEED = 1  # run.seed of both examples' grpo.yaml
POLL_S = 0.5  # how often a run's step count is looked at (StepWindowCPU)


def select_task(name: str) -> None:
    """Point the example paths (``EXAMPLE``, ``CONFIG``, ``SFT_CONFIG``, ``SFT_MODEL``) at ``name``'s."""
    global EXAMPLE, CONFIG, SFT_CONFIG, SFT_MODEL
    folder = TASKS[name][0]
    EXAMPLE = ROOT / "examples" / folder
    CONFIG, SFT_CONFIG = EXAMPLE / "grpo.yaml", EXAMPLE / "sft.yaml"
    SFT_MODEL = ROOT / "runs" / f"{folder}-sft" / "hf"


def mode_overrides(mode: str, a: argparse.Namespace) -> list[str]:
    """The ``key=value`` overrides that select ``mode`` on top of grpo.yaml."""
    partial = f"rollout.partial={{token_budget_per_step: {a.budget}, max_rounds: {a.max_rounds}}}"
    staleness = f"run.max_staleness={a.max_staleness}"
    groups = [f"rollout.request_groups={a.request_groups}"] if a.request_groups else []
    table = {
        "sync": ["run.mode=sync", "rollout.partial=null"],
        "partial": ["run.mode=sync", partial],
        "one_step_off": ["run.mode=one_step_off", "rollout.partial=null", staleness],
        "async": ["run.mode=async", "rollout.partial=null", staleness, *groups],
        "async_partial": ["run.mode=async", partial, staleness, *groups],
    }
    if mode not in table:
        raise SystemExit(f"unknown mode {mode!r}: choose from {', '.join(MODE_NAMES)}")
    return table[mode]


def drain_steps(mode: str, a: argparse.Namespace) -> int:
    """The last steps of a ``mode`` run left out of its throughput: an overlapping mode generates
    up to its lookahead ahead (one_step_off one step, async ``run.max_staleness``) and nothing
    past the run's end, so its last steps are the pipeline draining, not its steady state:
    one_step_off's last step only trains (a batch generated in the step before), async's wait
    for the last long samples with nothing left to overlap them with."""
    return {"one_step_off": 1, "async": a.max_staleness, "async_partial": a.max_staleness}.get(mode, 0)


# ------------------------------------------------------------------------------ inputs
def rlweave_cmd() -> list[str]:
    """The ``rlweave`` command beside this interpreter or on ``PATH``; else ``python -m rlweave.cli``
    (rlweave importable from ``PYTHONPATH``, as ``scripts/gpu_run.sh`` sets it up)."""
    exe = Path(sys.executable).with_name("rlweave")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("rlweave")
    if found:
        return [found]
    try:
        import rlweave.cli  # noqa: F401 - only whether it imports
    except ImportError:
        raise SystemExit("rlweave is not installed in this environment (make setup) nor on PYTHONPATH") from None
    return [sys.executable, "-m", "rlweave.cli"]


def ensure_data() -> None:
    """The shipped data files; written by the example's make_data.py when missing."""
    if all((EXAMPLE / "data" / n).is_file() for n in ("sft_train.jsonl", "rl_train.jsonl", "test.jsonl")):
        return
    print(f"{EXAMPLE.relative_to(ROOT)}/data is incomplete: running {EXAMPLE.relative_to(ROOT)}/make_data.py",
          flush=True)
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py")], check=True, cwd=ROOT)


def ensure_model(model: Path | None, work: Path, env: dict) -> Path:
    """The SFT model to start from: ``model``, else runs/<task>-sft/hf, else built in ``work``."""
    if model is not None:
        if not (model / "config.json").is_file():
            raise SystemExit(f"--model {model}: no Hugging Face model there (config.json missing)")
        return model.resolve()
    if (SFT_MODEL / "config.json").is_file():
        return SFT_MODEL
    base = EXAMPLE / "artifacts" / "base"
    if not (base / "config.json").is_file():
        print(f"building the base model: python {EXAMPLE.relative_to(ROOT)}/build_model.py --out "
              f"{base.relative_to(ROOT)}", flush=True)
        subprocess.run([sys.executable, str(EXAMPLE / "build_model.py"), "--out", str(base)], check=True, cwd=ROOT)
    print(f"no SFT model at {SFT_MODEL.relative_to(ROOT)}: training one in {work} (several minutes; "
          f"`rlweave train {SFT_CONFIG.relative_to(ROOT)}` once keeps one for later runs)", flush=True)
    out, log = work / "sft", work / "sft.log"
    cmd = rlweave_cmd() + ["train", str(SFT_CONFIG), f"run.output_dir={out}", f"model.path={base}"]
    with open(log, "w") as f:
        proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"SFT failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    return out / SFT_MODEL.parent.name / "hf"


# --------------------------------------------------------------------------------- runs
def run_mode(mode: str, turn: int, model: Path, work: Path, a: argparse.Namespace, env: dict) -> dict:
    """One GRPO run of ``mode`` (seed ``SEED + turn``); its measurements, or ``{"error": ...}``."""
    from rank_cpu import StepWindowCPU  # bench/ is on sys.path (main)

    name = f"{mode}-{turn}"
    threads = [f"roles.{r}.cpu_threads={a.role_threads}" for r in ("policy", "rollout")] if a.role_threads else []
    overrides = [f"model.path={model}", f"run.output_dir={work / 'grpo'}", f"run.name={name}",
                 f"run.seed={SEED + turn}", f"run.total_steps={a.steps}", "run.eval_every=0", "run.save_every=0",
                 "run.save_hf=false", f"run.log_every={max(1, a.steps // 5)}", *threads, *mode_overrides(mode, a),
                 *a.override]
    cmd = rlweave_cmd() + ["train", str(CONFIG), *overrides]
    log = work / f"{name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        # on-CPU time over the timed steps but the last (after it the ranks evaluate and stop)
        last = a.steps - max(1, drain_steps(mode, a))
        window = StepWindowCPU(work / "grpo" / name, proc.pid, a.warmup, last) if last > a.warmup else None
        while (code := proc.poll()) is None:
            if time.perf_counter() - t0 > a.timeout:
                proc.kill()
                proc.wait()
                code = f"timeout after {a.timeout:.0f} s"
                break
            if window:
                window.poll()
            time.sleep(POLL_S)
    wall = time.perf_counter() - t0
    if code != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-12:]
        return {"mode": mode, "turn": turn, "error": f"exit {code}", "log": str(log), "log_tail": tail, "wall_s": wall}
    return {"mode": mode, "turn": turn, "overrides": overrides, "wall_s": wall, "log": str(log),
            **summarize(work / "grpo" / name, a.warmup, drain_steps(mode, a)),
            **{f"cpu_{role}_s": v for role, v in ((window and window.result()) or {}).items()}}


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.mean(vals) if vals else None


def summarize(run_dir: Path, warmup: int, drain: int = 0) -> dict:
    """Throughput, staleness and idle time over the steps after ``warmup`` and before the last
    ``drain`` (:func:`drain_steps`); the evaluations."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "time/step" in r]
    last = max((r["step"] for r in steps), default=0)
    timed = [r for r in steps if warmup < r["step"] <= last - drain] or steps
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    max_stale = [float(r["staleness/max"]) for r in timed if isinstance(r.get("staleness/max"), (int, float))]
    return {
        "steps": len(steps),
        "timed_steps": len(timed),
        "trained_samples": sum(float(r.get("samples", 0.0)) for r in steps),
        "timed_samples": sum(float(r.get("samples", 0.0)) for r in timed),
        "timed_s": sum(float(r["time/step"]) for r in timed),
        "eval_before": before.get("eval/reward_mean"),
        "eval_after": after.get("eval/reward_mean"),
        "staleness_mean": _mean(timed, "staleness/mean"),
        "staleness_max": max(max_stale) if max_stale else None,
        "regenerated": sum(float(r.get("staleness/regenerated", 0.0)) for r in steps),
        "partial_ratio": _mean(timed, "partial/ratio"),
        "partial_rounds": _mean(timed, "partial/rounds"),
        "idle_rollout_s": _mean(timed, "time/idle/rollout"),
        "idle_policy_s": _mean(timed, "time/idle/policy"),
        **{f"{k}_s": _mean(timed, f"time/{k}") for k in ("generate", "train", "train_compute", "sync")},
        "response_len_mean": _mean(timed, "response_len/mean"),
        "response_len_max": _mean(timed, "response_len/max"),
        **{f"response_len_p{q}": _mean(timed, f"response_len/p{q}") for q in (50, 90, 99)},
        "response_len_longest": max((float(r["response_len/max"]) for r in timed if "response_len/max" in r),
                                    default=None),
    }


def pooled(mode: str, runs: list[dict]) -> dict:
    """One mode's repeats as one row: throughput over all timed steps, the rest averaged."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"mode": mode, "error": failed[0]["error"], "log": failed[0]["log"]}
    out = {"mode": mode, "runs": len(runs)}
    for k in ("steps", "timed_steps", "trained_samples", "timed_samples", "timed_s", "regenerated"):
        out[k] = sum(r[k] for r in runs)
    out["steps_per_hour"] = 3600.0 * out["timed_steps"] / out["timed_s"]
    out["samples_per_s"] = out["timed_samples"] / out["timed_s"]
    for k in runs[0]:
        if k not in out and k not in ("turn", "overrides", "log", "wall_s"):
            out[k] = _mean(runs, k)
    maxes = [r["staleness_max"] for r in runs if r["staleness_max"] is not None]
    out["staleness_max"] = max(maxes) if maxes else None
    longest = [r["response_len_longest"] for r in runs if r.get("response_len_longest") is not None]
    out["response_len_longest"] = max(longest) if longest else None
    rewards = [r["eval_after"] for r in runs if r["eval_after"] is not None]
    out["eval_after_range"] = (min(rewards), max(rewards)) if rewards else None
    return out


# -------------------------------------------------------------------------------- table
HEAD = ("mode", "samples", "s/step", "steps/h", "samples/s", "vs sync", "held-out reward",
        "response len p50/p90/p99/max", "staleness mean/max", "partial", "idle rollout s/step", "idle policy s/step",
        "CPU s/step rollout/policy")


def lengths(r: dict) -> str:
    """Trained response lengths: the step's 50th, 90th and 99th percentiles averaged over the
    timed steps, and the longest response of the run(s)."""
    return "/".join(_f(r.get(k), ".0f") for k in ("response_len_p50", "response_len_p90", "response_len_p99",
                                                    "response_len_longest"))


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def cpu(r: dict) -> str:
    """On-CPU seconds per timed step of the rollout's and the policy's ranks (``rank_cpu``)."""
    return f"{_f(r.get('cpu_rollout_s'), '.2f')}/{_f(r.get('cpu_policy_s'), '.2f')}"


def idle(r: dict) -> tuple[str, str]:
    """Idle seconds per step of the rollout and the policy (see the module docstring)."""
    if r["idle_rollout_s"] is not None or r["idle_policy_s"] is not None:
        return _f(r["idle_rollout_s"], ".2f"), _f(r["idle_policy_s"], ".2f")
    if r["generate_s"] is None:
        return "-", "-"
    return f"~{r['timed_s'] / r['timed_steps'] - r['generate_s']:.2f}", f"~{r['generate_s']:.2f}"


def sync_row(results: list[dict]) -> dict | None:
    """The sync mode's pooled row, None when it was not run or failed."""
    return next((r for r in results if r["mode"] == "sync" and "error" not in r), None)


def rows(results: list[dict]) -> list[tuple[str, ...]]:
    """One row per mode (a failed mode: its name and the error); ratios and reward differences
    against the sync row when there is one."""
    base = sync_row(results)
    out = []
    for r in results:
        if "error" in r:
            out.append((r["mode"], f"FAILED: {r['error']} (log: {r['log']})"))
            continue
        ratio = f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else "-"
        reward = _f(None if r["eval_after"] is None else 100 * r["eval_after"], ".1f")
        if r["runs"] > 1 and r["eval_after_range"]:
            reward += " [{:.1f}-{:.1f}]".format(*(100 * x for x in r["eval_after_range"]))
        if base and r is not base and r["eval_after"] is not None and base["eval_after"] is not None:
            reward += f" ({100 * (r['eval_after'] - base['eval_after']):+.1f})"
        out.append((r["mode"], f"{r['trained_samples'] / r['runs']:.0f}", f"{r['timed_s'] / r['timed_steps']:.2f}",
                    f"{r['steps_per_hour']:.0f}", f"{r['samples_per_s']:.1f}", ratio, reward, lengths(r),
                    f"{_f(r['staleness_mean'], '.2f')}/{_f(r['staleness_max'], '.0f')}",
                    _f(r["partial_ratio"], ".2f"), *idle(r), cpu(r)))
    return out


def table(results: list[dict], md: bool = False) -> str:
    body = rows(results)
    if md:
        lines = ["| " + " | ".join(HEAD) + " |", "|---" + "|---:" * (len(HEAD) - 1) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    full = [HEAD] + [r for r in body if len(r) == len(HEAD)]
    widths = [max(len(r[i]) for r in full) for i in range(len(HEAD))]
    lines = []
    for r in [HEAD] + body:
        if len(r) != len(HEAD):
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]}")
        else:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def overlap_ceiling(results: list[dict]) -> str | None:
    """The most that overlapping generation with training can gain, from the sync row's split:
    a sync step is generation G plus the rest R (reward, training, weight sync); a step that
    overlaps them fully takes max(G, R), so ``one_step_off`` gains at most (G + R) / max(G, R)
    over sync. None without a sync row that reports ``time/generate``."""
    base = sync_row(results)
    if base is None or not base.get("generate_s") or not base.get("timed_steps"):
        return None
    step = base["timed_s"] / base["timed_steps"]
    gen, rest = base["generate_s"], max(0.0, step - base["generate_s"])
    return (f"sync's step: generation {gen:.2f} s + the rest {rest:.2f} s; overlapping them gains at most "
            f"{step / max(gen, rest):.2f}x ({step:.2f} / {max(gen, rest):.2f})")


def describe(res: dict) -> str:
    if "error" in res:
        return f"FAILED ({res['error']}), last lines of {res['log']}:\n  " + "\n  ".join(res["log_tail"])
    return (f"{res['timed_samples'] / res['timed_s']:.1f} samples/s, held-out reward {_f(res['eval_before'], '.3f')} "
            f"-> {_f(res['eval_after'], '.3f')}, response length mean {_f(res['response_len_mean'], '.1f')} "
            f"(batch max {_f(res['response_len_max'], '.0f')}), "
            + (f"{res['partial_rounds']:.1f} rounds a step, " if res.get("partial_rounds") else "")
            + (f"on-CPU s/step rollout {_f(res.get('cpu_rollout_s'), '.2f')} policy "
               f"{_f(res.get('cpu_policy_s'), '.2f')} controller {_f(res.get('cpu_controller_s'), '.2f')}, "
               if "cpu_controller_s" in res else "")
            + f"wall {res['wall_s']:.0f} s")


# --------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="longtail",
                    help="longtail: examples/longtail; tools: examples/tools (multi-turn episodes)")
    ap.add_argument("--steps", type=int, default=60, help="GRPO steps per run (each trains 16 groups)")
    ap.add_argument("--warmup", type=int, default=3, help="first steps of a run left out of the throughput")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from: {', '.join(MODE_NAMES)}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode, taking turns, seeds run.seed + k")
    ap.add_argument("--budget", type=int, default=48, help="partial: rollout.partial.token_budget_per_step")
    ap.add_argument("--max-rounds", type=int, default=6,
                    help="partial: rollout.partial.max_rounds (6 x 48 tokens cover the task's 256)")
    ap.add_argument("--max-staleness", type=int, default=2,
                    help="one_step_off and async: run.max_staleness (async: a long response spans steps)")
    ap.add_argument("--request-groups", type=int, default=None,
                    help="async: rollout.request_groups (default: the config's)")
    ap.add_argument("--role-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="roles.{policy,rollout}.cpu_threads (default: half the cores each; 0: the config's)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override for every run (repeatable), e.g. algorithm.off_policy.correction=none")
    ap.add_argument("--model", type=Path, default=None,
                    help=f"SFT model to start from (default: {SFT_MODEL.relative_to(ROOT)}, built when missing)")
    ap.add_argument("--work", type=Path, default=None,
                    help="keep the runs and logs here (default: a temporary directory, removed at the end)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a run may take")
    ap.add_argument("--out", type=Path, default=None, help="write the results (every run's too) as JSON here")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    a = ap.parse_args()
    select_task(a.task)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in a.modes:
        mode_overrides(m, a)  # an unknown name fails before anything runs
    drain = max((drain_steps(m, a) for m in a.modes), default=0)
    if a.steps <= a.warmup + drain:
        raise SystemExit(f"--steps ({a.steps}) must be larger than --warmup ({a.warmup}) plus the {drain} last "
                         "step(s) an overlapping mode leaves out of its throughput")
    return a


def main() -> int:
    a = parse_args()
    sys.path.insert(0, str(HERE))
    from machine import cpu_name, gpu_name

    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    tmp = None if a.work else tempfile.mkdtemp(prefix="rlweave_bench_async_")
    work = (a.work or Path(tmp)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        ensure_data()
        model = ensure_model(a.model, work, env)
        when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        gpu = gpu_name()
        machine = cpu_name() + (f", {gpu}" if gpu else "")
        print(f"\n{when}, {machine}; model {model}; {a.steps} steps a run ({a.warmup} warm-up), "
              f"{a.repeat} run(s) a mode; {TASKS[a.task][1]}; partial budget {a.budget} x "
              f"{a.max_rounds} rounds; max_staleness {a.max_staleness}; cpu threads per role "
              f"{a.role_threads or 'as configured'}; work dir {work}", flush=True)
        runs: dict[str, list[dict]] = {m: [] for m in a.modes}
        for turn in range(a.repeat):
            for m in a.modes:
                res = run_mode(m, turn, model, work, a, env)
                runs[m].append(res)
                print(f"{m} (run {turn + 1}/{a.repeat}): {describe(res)}", flush=True)
        results = [pooled(m, runs[m]) for m in a.modes]
        print()
        print(table(results))
        if a.markdown:
            print()
            print(table(results, md=True))
        ceiling = overlap_ceiling(results)
        if ceiling:
            print(f"\n{ceiling}")
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
            a.out.write_text(json.dumps({"date": when, "machine": cpu_name(), "model": str(model), "args": args,
                                         "results": results, "runs": runs}, indent=2))
            print(f"\nresults: {a.out}")
        return 1 if any("error" in r for r in results) else 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
