"""``make test`` runs two pytest-xdist workers with ``--dist loadgroup``, and the root
``conftest.py`` puts each test file (or each test of a shared session fixture) in one group, so
module and session fixtures are built once. pytest-xdist 3.8 stopped grouping silently under
pytest 9.2 (pytest-dev/pytest-xdist#1386); this runs a small suite with the root conftest and
checks that every group ran whole on one worker, with the groups holding ``slow`` tests first
(``make test``'s ``--no-loadscope-reorder`` keeps that order; xdist would sort by group size).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORD = '''import json, os, pytest
def _log(name):
    with open(os.environ["GROUPING_LOG"], "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")
'''


def _module(name: str, n: int, slow: bool = False, fixture: bool = False) -> str:
    marks = "pytestmark = pytest.mark.slow\n" if slow else ""
    arg = "shared_thing" if fixture else ""
    tests = "".join(f"def test_{i}({arg}):\n    _log('{name}::{i}')\n" for i in range(n))
    return RECORD + marks + tests


def test_each_file_and_each_shared_fixture_runs_on_one_worker(tmp_path):
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(REPO / "conftest.py", suite / "conftest.py")
    for name in ("a", "b", "c"):  # the slow group is the smallest: xdist's own order would put it last
        (suite / f"test_{name}.py").write_text(_module(name, 2 if name == "c" else 6, slow=name == "c"))
    # tests of two files that use the shared session fixture 'reference_run' form one group
    fixture = "import pytest\n@pytest.fixture(scope='session')\ndef reference_run():\n    return 1\n" \
              "@pytest.fixture\ndef shared_thing(reference_run):\n    return reference_run\n"
    (suite / "conftest.py").write_text((suite / "conftest.py").read_text() + "\n" + fixture)
    for name in ("d", "e"):
        (suite / f"test_{name}.py").write_text(_module(name, 3, fixture=True))
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["GROUPING_LOG"] = str(log)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
                           "-p", "no:cacheprovider",
                           "-q", "-o", "addopts=", str(suite)], cwd=suite, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2 * 6 + 2 + 2 * 3
    workers: dict[str, set] = {}
    for r in rows:
        group = r["test"].split("::")[0]
        workers.setdefault("shared" if group in ("d", "e") else group, set()).add(r["worker"])
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) == 2, workers  # both workers had work
    first = {}
    for r in rows:
        first.setdefault(r["worker"], r["test"].split("::")[0])
    assert "c" in first.values(), first  # the slow group was handed out first
