"""The deepspeed backend stands on the core's HF model layer alone: its source imports nothing
from the fsdp plugin, and its package does not depend on it (a plugin never depends on another)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rlweave_backend_deepspeed"


def _imported(path: Path) -> set[str]:
    """Absolute module names ``path`` imports, at any depth (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_source_imports_nothing_from_the_fsdp_plugin():
    files = sorted(SRC.rglob("*.py"))
    assert files
    found = {f"{f.relative_to(ROOT)}: {m}" for f in files for m in _imported(f)
             if m.split(".")[0] == "rlweave_backend_fsdp"}
    assert not found, f"the deepspeed backend imports the fsdp plugin: {sorted(found)}"


def test_the_package_does_not_depend_on_the_fsdp_plugin():
    text = (ROOT / "pyproject.toml").read_text()
    assert "rlweave-backend-fsdp" not in text and "rlweave_backend_fsdp" not in text
