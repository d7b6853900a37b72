"""Every package declares what its code imports: each third-party module imported anywhere under a
package's ``src/`` (lazily inside functions too) belongs to a distribution in its pyproject's
``dependencies``, or in one of its extras, or is listed below as optional with the reason; and the
``dependencies`` are ranges, never exact pins (those live in ``constraints-cpu.txt``)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for p in [REPO / "core" / "pyproject.toml", *REPO.glob("plugins/*/pyproject.toml")])

#: (package folder, module): imported only behind a fallback or by optional helpers, and why
OPTIONAL = {
    ("core", "pytest"): "rlweave.testing: contract suites for plugin authors' own tests",
    ("core", "safetensors"): "rlweave.testing: the engine contract suite",
    ("core", "tensorboardX"): "fallback TensorBoard writer when torch's is missing",
    ("core", "flash_attn"): "backend_helpers.hf_model.attention: used when installed on CUDA, else SDPA",
}
#: modules whose distribution is not installed here (so metadata cannot name it)
KNOWN = {"vllm": "vllm", "flash_attn": "flash-attn", "tensorboardX": "tensorboardX", "sglang": "sglang",
         "megatron": "megatron-core"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(src: Path) -> set[str]:
    """Top-level modules imported by the ``.py`` files under ``src`` (absolute imports)."""
    out: set[str] = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    own = {p.name for p in src.iterdir() if p.is_dir()}
    return {m for m in out if m not in sys.stdlib_module_names and m not in own and m != "__future__"}


@functools.lru_cache(maxsize=1)
def installed_modules() -> dict[str, list[str]]:
    return md.packages_distributions()


def distributions_of(module: str) -> set[str]:
    names = installed_modules().get(module) or [KNOWN.get(module, module)]
    return {canonical(n) for n in names}


@pytest.mark.parametrize("pkg", PACKAGES, ids=[p.name for p in PACKAGES])
def test_every_import_is_declared(pkg):
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    required = {canonical(Requirement(r).name) for r in project.get("dependencies", [])}
    extras = {canonical(Requirement(r).name) for reqs in project.get("optional-dependencies", {}).values() for r in reqs}
    undeclared = []
    for module in sorted(imported_modules(pkg / "src")):
        dists = distributions_of(module)
        if canonical(module) == "rlweave" or dists & required:
            continue
        if dists & extras or (pkg.name, module) in OPTIONAL:
            continue
        undeclared.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not undeclared, f"{pkg.name}/pyproject.toml: imported but not declared: {', '.join(undeclared)}"


@pytest.mark.parametrize("pkg", PACKAGES, ids=[p.name for p in PACKAGES])
def test_dependencies_are_ranges_not_pins(pkg):
    project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
    pinned = [r for r in project.get("dependencies", [])
              if any(s.operator in ("==", "===") for s in Requirement(r).specifier)]
    assert not pinned, f"{pkg.name}/pyproject.toml pins {pinned}: use a range (pins live in constraints-cpu.txt)"
