"""Run the reliability suite (``tests/reliability``) and print what each guarantee measured.

    .venv/bin/python bench/reliability.py              # a table on the terminal
    .venv/bin/python bench/reliability.py --markdown   # the same as a Markdown table (README, RESULTS)
    .venv/bin/python bench/reliability.py -k sandbox   # a subset (any further pytest arguments)

Each test of the suite records one row (guarantee, measured) through its ``guarantee``
fixture (``tests/reliability/conftest.py``); this script adds each test's outcome from pytest's
JUnit XML and names the machine (CPU model and vector extensions) and the date. It exits
with pytest's exit code, so a failing guarantee fails the command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "reliability"


def outcomes(junit: Path) -> dict[str, str]:
    """pytest node id (as the fixture records it) -> passed / failed / skipped."""
    out: dict[str, str] = {}
    if not junit.is_file():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "")
        state = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            state = "FAILED"
        elif case.find("skipped") is not None:
            state = "skipped"
        out[name] = state
        out[f"{path}::{name}"] = state
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlweave-reliability-") as tmp:
        rows_file, junit = Path(tmp) / "rows.jsonl", Path(tmp) / "junit.xml"
        env = dict(os.environ, RLWEAVE_RELIABILITY_OUT=str(rows_file), RAY_AUTH_MODE="disabled")
        cmd = [sys.executable, "-m", "pytest", str(SUITE), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
               *pytest_args]
        code = subprocess.call(cmd, cwd=REPO, env=env)
        rows = [json.loads(x) for x in rows_file.read_text().splitlines()] if rows_file.is_file() else []
        states = outcomes(junit)
    for row in rows:
        test_name = row["test"].split("::")[-1]
        row["result"] = states.get(row["test"], states.get(test_name, "?"))
    recorded = {r["test"].split("::")[-1] for r in rows}
    for name, state in states.items():  # a test that failed before it could record its row
        if "::" not in name and name not in recorded and state != "passed":
            rows.append({"guarantee": name, "measured": "(no measurement: the test did not get that far)",
                         "test": name, "result": state})
    header = f"Reliability guarantees, {dt.date.today().isoformat()}, {cpu_name()}"
    if args.markdown:
        print(f"{header}\n\n| guarantee | measured | result |\n|---|---|---|")
        cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731 - a "|" in a cell ends it otherwise
        for r in rows:
            print(f"| {cell(r['guarantee'])} | {cell(r['measured'])} | {r['result']} |")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=header, show_lines=True)
        for col in ("guarantee", "measured", "result"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(r["guarantee"], r["measured"], r["result"])
        Console(width=max(Console().width, 140)).print(table)
    return code


if __name__ == "__main__":
    sys.exit(main())
