"""The GPU check: every ``gpu`` test and the short GPU benches, one table (``scripts/gpu_check.sh``).

Groups, run one after another within one time budget (``--budget``, default 560 s: the whole
check fits in 9.5 minutes), each in its own process group, killed at its own cap or when the budget
runs out:

* one per test folder holding ``gpu`` tests (``core/tests``, ``plugins/<name>/tests``, ``tests``):
  pytest ``-m gpu`` over the files of that folder that carry the marker, found by reading every
  test file under the ``testpaths`` of ``pyproject.toml`` (so new GPU tests are included as they
  are written, and no other file is collected: the GPU machine has no Ray or vLLM). A test may
  report one key figure with ``record_property("key_figure", text)``;
* the short GPU benches: weight sync (cuda_ipc against a device copy), one MoE experts layer,
  FSDP and megatron training throughput (a few steps of a Qwen2.5-0.5B-shaped model in bf16),
  and what a decoding step of the transformers engine costs by its sequences (the long-tail model).
  Without a CUDA device they are not run; the megatron one needs megatron-core.

The table (group, passed, failed, skipped, key figure, seconds), headed by the GPU, its driver,
the date and the versions of torch, CUDA, transformers, triton and megatron-core, goes to stdout
and to ``<out>/gpu_check.md``, each group's output to ``<out>/logs/``. Exit code 1 when any group
failed or timed out, else 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GPU_MARK = re.compile(r"\bmark\.gpu\b")
#: seconds a group is given at most (tests by folder, then the benches by name)
TEST_CAPS = {"core/tests": 60, "plugins/backend_fsdp/tests": 240, "plugins/kernel_moe/tests": 120, "tests": 120}
TEST_CAP = 90
#: a group that would get less than this is not started
MIN_GROUP_S = 15


@dataclass
class Group:
    """One row of the table: a command, its cap, how to read what it measured."""

    name: str
    argv: list[str]
    cap_s: float
    junit: Path | None = None
    figure: Callable[[str], str] | None = None  # bench: printed output -> key figure
    not_run: str | None = None  # why it is not started
    result: dict = field(default_factory=dict)


def gpu_test_files(repo: Path = REPO) -> dict[str, list[str]]:
    """Test folder -> the test files in it that carry the ``gpu`` marker (paths relative to
    ``repo``), over the ``testpaths`` of ``pyproject.toml``."""
    import tomllib

    paths = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    out: dict[str, list[str]] = {}
    for top in paths:
        for f in sorted((repo / top).rglob("test_*.py")):
            if GPU_MARK.search(f.read_text(encoding="utf-8", errors="replace")):
                rel = f.relative_to(repo)
                folder = "/".join(rel.parts[:rel.parts.index("tests") + 1]) if "tests" in rel.parts else rel.parts[0]
                out.setdefault(folder, []).append(rel.as_posix())
    return out


def groups_of_tests(py: str, logs: Path) -> list[Group]:
    """One group per test folder with ``gpu`` tests (see the module docstring)."""
    out = []
    for folder, files in gpu_test_files().items():
        junit = logs / f"{folder.replace('/', '_')}.xml"
        argv = [py, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
        out.append(Group(f"gpu tests: {folder}", argv, TEST_CAPS.get(folder, TEST_CAP), junit=junit))
    return out


def bench_groups(py: str, logs: Path, work: Path, cuda: bool, megatron: bool) -> list[Group]:
    """The short GPU benches (not run without CUDA; megatron's without megatron-core); their
    results go to ``logs``, the random model they build to ``work``."""
    model = ["--preset", "qwen2.5-0.5b", "--model-dir", str(work / "qwen2.5-0.5b"), "--device", "cuda",
             "--precision", "bf16", "--tokens-per-step", "32768", "--micro-tokens", "16384", "--max-len", "1024",
             "--steps", "2", "--warmup", "1", "--force"]

    def training(name: str) -> Group:
        out = logs / f"{name}_training.txt"
        rows = out.with_suffix(".json")  # the bench writes its rows beside --out
        return Group(f"bench: {name} training", [py, "bench/backend_throughput.py", "--backends", name, *model,
                                                 "--out", str(out)], 120, figure=lambda _text: figures.training(rows))

    groups = [
        Group("bench: weight sync", [py, "bench/weight_sync.py", "--gpu", "--sizes-mb", "1024", "--dst-ranks", "1",
                                     "--repeats", "3"], 60, figure=figures.weight_sync),
        Group("bench: MoE experts layer", [py, "bench/moe_experts.py", "--device", "cuda", "--preset",
                                           "qwen3-30b-a3b-layer", "--tokens", "4096", "--repeats", "3"], 60,
              figure=figures.moe_experts),
        training("fsdp"),
        training("megatron"),
        Group("bench: decode cost (hf)", ["bash", "-c", decode_cost_script(py, work / "longtail")], 90,
              figure=figures.decode_cost),
    ]
    for g in groups:
        if not cuda:
            g.not_run = "no CUDA device"
        elif g.name.startswith("bench: megatron") and not megatron:
            g.not_run = "megatron-core not installed (carry its wheel: docs/gpu.md)"
    return groups


def decode_cost_script(py: str, model: Path) -> str:
    """Shell commands: build the long-tail example's model (random weights, its own tokenizer) at
    ``model``, then ``bench/decode_cost.py`` with the transformers engine on the GPU."""
    py, where = shlex.quote(py), shlex.quote(str(model))
    return (f"{py} examples/longtail/build_model.py --out {where} && "
            f"{py} bench/decode_cost.py --engine hf --device cuda --model {where} --rest 0.5")


def run_group(g: Group, seconds: float, log: Path, env: dict[str, str]) -> None:
    """Run ``g`` for at most ``seconds`` (its process group is killed then) and fill ``g.result``."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(g.argv) + "\n")
        f.flush()
        proc = subprocess.Popen(g.argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            rc = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    res = {"seconds": wall, "rc": rc, "passed": 0, "failed": 0, "skipped": 0, "figure": ""}
    if g.junit is not None and g.junit.exists():
        res["passed"], res["failed"], res["skipped"], figs = figures.junit_counts(g.junit)
        res["figure"] = "; ".join(figs)
        if rc not in (0, 5) and not res["failed"]:  # pytest itself failed (usage, collection)
            res["failed"] = 1
    elif g.junit is not None:  # stopped before the XML was written: what its -v lines say
        res["passed"], res["failed"], res["skipped"] = figures.verbose_counts(text)
    elif g.figure is not None and rc == 0:
        try:
            res["figure"], res["passed"] = g.figure(text), 1
        except (ValueError, KeyError, OSError) as exc:
            res["failed"], res["figure"] = 1, f"no result: {exc}"
    else:
        res["failed"] = 1
    if rc is None:
        res["failed"] = max(1, res["failed"])
        res["figure"] = (f"timed out after {seconds:.0f} s; " + res["figure"]).rstrip("; ")
    elif rc not in (0, 5) and not res["figure"]:
        res["figure"] = f"exit code {rc}: see logs/{log.name}"
    g.result = res


def environment(py: str, env: dict[str, str]) -> dict[str, str]:
    """GPU name, driver and versions, asked of ``nvidia-smi`` and of ``py`` (not this process)."""
    probe = r"""
import json, importlib.metadata as md
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda or "none"
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    out["gpus"] = torch.cuda.device_count()
except Exception as exc:
    out["torch"] = f"not importable ({type(exc).__name__})"
for dist in ("transformers", "triton", "megatron-core", "pydantic"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = "not installed"
try:
    import megatron.core  # noqa: F401
    out["megatron_import"] = "ok"
except Exception as exc:
    out["megatron_import"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
    info: dict[str, str] = {}
    try:
        info.update(json.loads(subprocess.run([py, "-c", probe], env=env, capture_output=True, text=True,
                                              timeout=120).stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        info["torch"] = f"probe failed: {exc}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        if smi:
            info["nvidia_smi"] = smi[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def render(groups: list[Group], info: dict, budget: float, took: float) -> str:
    gpu = info.get("nvidia_smi") or info.get("gpu") or "no CUDA device visible"
    head = [f"## GPU check: {gpu} ({dt.date.today()})", "",
            f"`scripts/gpu_check.sh`, {took:.0f} s of a {budget:.0f} s budget. torch {info.get('torch')} (CUDA "
            f"{info.get('cuda')}), transformers {info.get('transformers')}, triton {info.get('triton')}, megatron-core "
            f"{info.get('megatron-core')}; no Ray or vLLM needed.", "",
            "| group | passed | failed | skipped | key figure | s |", "|---|---:|---:|---:|---|---:|"]
    rows = []
    for g in groups:
        r = g.result
        if g.not_run:
            rows.append(f"| {g.name} | 0 | 0 | 1 | not run: {g.not_run} | 0 |")
        else:
            rows.append(f"| {g.name} | {r['passed']} | {r['failed']} | {r['skipped']} | {r['figure'] or '-'} | "
                        f"{r['seconds']:.0f} |")
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "runs"
                    / "gpu_check", help="folder of gpu_check.md and logs/ (default: $OUT, else runs/gpu_check)")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET_S", 560)),
                    help="seconds for all groups together (default 560; GPU_CHECK_BUDGET_S)")
    ap.add_argument("--only", nargs="+", default=None, help="run only the groups whose name contains one of these")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of every group (default: this one)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_AUTH_MODE="disabled")
    info = environment(args.python, env)
    cuda = bool(info.get("gpu"))
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))  # the benches' random model: GBs, not kept
    groups = groups_of_tests(args.python, logs) + bench_groups(args.python, logs, work, cuda,
                                                              info.get("megatron_import") == "ok")
    if args.only:
        groups = [g for g in groups if any(s in g.name for s in args.only)]
    try:
        run_groups(groups, deadline, args.budget, logs, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = render(groups, info, args.budget, time.monotonic() - start)
    (args.out / "gpu_check.md").write_text(table)
    print(table)
    print(f"[gpu_check] table: {args.out / 'gpu_check.md'}; logs: {logs}", file=sys.stderr)
    return 1 if any(g.result.get("failed") for g in groups) else 0


def run_groups(groups: list[Group], deadline: float, budget: float, logs: Path, env: dict[str, str]) -> None:
    """Each group in turn, within what is left of the budget; the log tail of a failed one to stderr."""
    for g in groups:
        if g.not_run:
            continue
        left = deadline - time.monotonic()
        if left < MIN_GROUP_S:
            g.not_run = f"out of time ({budget:.0f} s budget)"
            continue
        log = logs / f"{re.sub(r'[^A-Za-z0-9]+', '_', g.name).strip('_')}.log"
        print(f"[gpu_check] {g.name} (at most {min(g.cap_s, left):.0f} s) ...", file=sys.stderr, flush=True)
        run_group(g, min(g.cap_s, left), log, env)
        r = g.result
        print(f"[gpu_check] {g.name}: {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped in "
              f"{r['seconds']:.0f} s", file=sys.stderr, flush=True)
        if r["failed"]:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(f"    {line}" for line in tail), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
