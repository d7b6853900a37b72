"""The workspace's process guard (the root ``conftest.py``): a test module that leaves a child
process behind, running or as a zombie, errors at teardown naming it, and the leftover is
reaped; a module that waits for its processes passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("psutil")

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

MODULES = {
    "test_zombie.py": """
        import os
        def test_leaves_a_zombie():
            if os.fork() == 0:
                os._exit(0)  # the child ends at once; nobody waits for it
    """,
    "test_running.py": """
        import subprocess, sys
        def test_leaves_a_running_child():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    """,
    "test_clean.py": """
        import subprocess, sys
        def test_waits_for_its_child():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """,
}


def test_leaks_are_named_and_reaped(tmp_path):
    shutil.copy(ROOT_CONFTEST, tmp_path / "conftest.py")
    for name, code in MODULES.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    env = {**os.environ, "RLWEAVE_PROCESS_GUARD_GRACE_S": "1"}
    env.pop("RLWEAVE_PROCESS_GUARD", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path),
         str(tmp_path), "-W", "ignore::pytest.PytestConfigWarning"],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "3 passed, 2 errors" in text, text
    assert "test_zombie.py left 1 process(es)" in text and "(zombie)" in text, text
    assert "test_running.py left 1 process(es)" in text and "time.sleep(120)" in text, text
    assert "test_clean.py left" not in text, text
