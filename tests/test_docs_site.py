"""The docs site (``mkdocs.yml`` over ``docs/``) builds in strict mode, and strict mode does fail on
a broken link; the configuration reference (``docs/reference/config.md``) is what the config
models give today and documents every key the examples use."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs")


def _build(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=300, check=False)


def test_the_docs_build_in_strict_mode_and_a_broken_link_fails_them(tmp_path):
    done = _build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()

    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(REPO / "docs", copy / "docs")
    page = copy / "docs" / "reliability.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no_such_page.md).\n")
    broken = _build(copy, tmp_path / "site2")
    assert broken.returncode != 0
    assert "no_such_page.md" in broken.stdout + broken.stderr


def _reference():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_configuration_reference_is_up_to_date():
    mod = _reference()
    assert mod.PAGE.read_text() == mod.render(), "run python scripts/config_reference.py"


def _keys(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{prefix}{k}"
            yield from _keys(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict):
                yield from _keys(v, f"{prefix[:-1]}[{i}].")


def test_every_key_the_examples_use_is_in_the_reference():
    rows = [line.split("|")[1:3] for line in _reference().PAGE.read_text().splitlines() if line.startswith("| `")]
    documented = {key.strip().strip("`"): typ.strip() for key, typ in rows}
    patterns = [(re.compile("^" + re.escape(k).replace(re.escape("<name>"), r"[^.\[]+")
                            .replace(re.escape("<kernel>"), r"[^.\[]+").replace(re.escape("[i]"), r"\[\d+\]") + "$"), t)
                for k, t in documented.items()]

    def covered(key: str) -> bool:
        parts = key.split(".")
        for n in range(len(parts), 0, -1):  # the key, or a free-form mapping above it
            head = ".".join(parts[:n])
            for pattern, typ in patterns:
                if pattern.match(head) and (n == len(parts) or "dict[" in typ):  # below: free names
                    return True
        return False

    configs = sorted(p for p in (REPO / "examples").rglob("*.yaml") if "artifacts" not in p.parts)
    assert len(configs) >= 10
    missing = {}
    for path in configs:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "roles" not in data and "algorithm" not in data:
            continue
        user_algorithm = ":" in str((data.get("algorithm") or {}).get("name", ""))
        for key in _keys(data):
            if user_algorithm and key.startswith("algorithm."):
                continue  # a user's own algorithm class validates its own section (docs/custom_algorithm.md)
            if not covered(key):
                missing.setdefault(key, str(path.relative_to(REPO)))
    assert not missing, json.dumps(missing, indent=1)
