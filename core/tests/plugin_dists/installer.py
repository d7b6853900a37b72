"""Install the test plugin distributions of this folder into a directory, as pip would.

Each sub-folder is a real project (pyproject.toml + one package). :func:`install` copies the
package and writes a real ``<name>-<version>.dist-info`` (METADATA with Requires-Dist,
entry_points.txt, RECORD, INSTALLER), so ``importlib.metadata`` finds the entry points when
the directory is on ``sys.path`` (e.g. via PYTHONPATH in a subprocess). Nothing is written
into the virtual environment. :func:`run_python` runs code in such a subprocess.

Test modules load this file by path (``--import-mode=importlib``, no conftest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

HEAVY = ("torch", "ray", "vllm", "transformers", "sglang", "megatron")

HERE = Path(__file__).resolve().parent
ALL = sorted(p.name for p in HERE.iterdir() if (p / "pyproject.toml").is_file())


def install(names: list[str], target: Path, where: Path = HERE) -> Path:
    """Install the named sub-folders of ``where`` (default: this folder) into ``target``
    (created); returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        root = where / name
        meta = tomllib.loads((root / "pyproject.toml").read_text())
        project = meta["project"]
        files = []
        for pkg in meta["tool"]["setuptools"]["packages"]:
            shutil.copytree(root / pkg, target / pkg, ignore=shutil.ignore_patterns("__pycache__"))
            files += [p.relative_to(target).as_posix() for p in (target / pkg).rglob("*.py")]
        info = target / f"{re.sub(r'[-_.]+', '_', project['name'])}-{project['version']}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}"]
        lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        eps = ["[rlweave.plugins]"] + [f"{k} = {v}" for k, v in project["entry-points"]["rlweave.plugins"].items()]
        (info / "entry_points.txt").write_text("\n".join(eps) + "\n")
        (info / "INSTALLER").write_text("rlweave-tests\n")
        record = files + [f"{info.name}/{f}" for f in ("METADATA", "entry_points.txt", "INSTALLER", "RECORD")]
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in record))
    return target


HEAVY_PROBE = f"import sys, json; print('HEAVY=' + json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"


def run_python(code: str, site: Path | None = None, env: dict[str, str] | None = None,
               args: list[str] = (), cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv, ``site`` first on PYTHONPATH."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLWEAVE_")}
    if site is not None:
        full["PYTHONPATH"] = os.pathsep.join([str(site)] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], env=full, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def heavy_modules(stdout: str) -> list[str]:
    """The list printed by :data:`HEAVY_PROBE`."""
    line = next(l for l in stdout.splitlines() if l.startswith("HEAVY="))
    return json.loads(line[len("HEAVY="):])
