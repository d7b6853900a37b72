"""A regular install works as the README promises: wheels of the core and three plugins
(``rlweave-algo-grpo``, ``rlweave-backend-fsdp``, ``rlweave-infer-hf``), installed (not editable)
into a fresh virtual environment with torch 2.13.0 and nothing else named, list their plugins
and run a 3-step GRPO with the HF engine to its end: metrics, checkpoint, Hugging Face export,
TensorBoard events and the plot. So every package declares what a run imports.

The wheels are built from copies of the package folders (setuptools writes ``build/`` and
``*.egg-info`` beside the sources), so the source tree is left as it was. pip reads the local
package index and the torch CPU build this machine's pip configuration points at, with
``constraints-cpu.txt`` so that no CUDA torch is ever pulled. Measured 2026-11-24 on the 2-core
AMD EPYC (AVX-512) machine with other jobs running: 2.3-2.5 minutes in all, of which installing
took 36-70 s, the run 45-60 s and removing the 1.4 GB environment afterwards ~40 s.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "plugins/algo_grpo", "plugins/backend_fsdp", "plugins/infer_hf")
DISTRIBUTIONS = {"rlweave", "rlweave-algo-grpo", "rlweave-backend-fsdp", "rlweave-infer-hf"}


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def build_wheels(root: Path) -> list[Path]:
    """Wheels of :data:`PACKAGES`, built from copies under ``root`` into ``root/wheels``."""
    copies = []
    for pkg in PACKAGES:
        dest = root / "src" / pkg
        shutil.copytree(REPO / pkg, dest, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", "tests", ".pytest_cache"))
        copies.append(dest)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", root / "wheels", *copies])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted((root / "wheels").glob("*.whl"))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that points at the development install."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("RLWEAVE_")}
    env.update(extra)
    return env


def processes_of(venv: Path) -> list[psutil.Process]:
    """Running processes started from ``venv`` (its python, Ray's binaries inside it)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(venv) in " ".join(proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment holding the four wheels and what they require (removed after
    the module: it takes ~1.4 GB)."""
    root = tmp_path_factory.mktemp("install")
    try:
        wheels = build_wheels(root)
        assert {w.name.split("-")[0].replace("_", "-") for w in wheels} == DISTRIBUTIONS
        venv = root / "venv"
        proc = run([sys.executable, "-m", "venv", venv])
        assert proc.returncode == 0, proc.stderr
        # --no-compile: byte-compiling all of torch and ray would take longer than the run imports
        proc = run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", "-c",
                    REPO / "constraints-cpu.txt", "torch==2.13.0", *wheels], env=clean_env(), timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_wheels_install_what_they_import(installed):
    py = installed / "bin" / "python"
    proc = run([py, "-m", "pip", "check"], env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run([py, "-c", "import rlweave, torch; print(rlweave.__file__); print(torch.__version__)"], env=clean_env())
    assert proc.returncode == 0, proc.stderr
    where, torch_version = proc.stdout.split()
    assert Path(where).is_relative_to(installed) and torch_version == "2.13.0+cpu"  # not the source tree; CPU torch
    proc = run([installed / "bin" / "rlweave", "list-plugins", "--json"], env=clean_env())
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["distribution"] for r in rows} == DISTRIBUTIONS
    assert all(r["status"] == "ok" for r in rows), rows
    assert {("algorithm", "grpo"), ("backend", "fsdp"), ("engine", "hf"), ("reward", "arith_exact")} <= \
        {(r["kind"], r["name"]) for r in rows}


def test_a_grpo_run_finishes_in_the_installed_environment(installed, grpo_workspace, tmp_path):
    ws = grpo_workspace
    cfg = ws.config("installed", 3, run={"save_every": 3})  # FSDP policy, HF rollout, arith_exact
    try:
        proc = run([installed / "bin" / "rlweave", "train", cfg], env=clean_env(RAY_AUTH_MODE="disabled"),
                   cwd=tmp_path, timeout=400)
    finally:
        left = processes_of(installed)
        for p in left:
            p.kill()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert not left, [p.info["cmdline"] for p in left]
    run_dir = ws.root / "runs" / "installed"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["reward/mean"]) for r in steps), steps
    assert (run_dir / "checkpoints" / "step_000003" / "COMPLETE").is_file()
    assert (run_dir / "hf" / "model.safetensors").is_file() and (run_dir / "summary.json").is_file()
    assert any((run_dir / "tensorboard").iterdir()) and (run_dir / "metrics.png").is_file()
    assert "not available" not in out and "could not draw" not in out, out[-4000:]
