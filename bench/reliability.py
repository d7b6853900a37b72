"""Run the reliability suite (``tests/reliability``) and print what each guarantee measured.

    .venv/bin/python bench/reliability.py              # a table on the terminal
    .venv/bin/python bench/reliability.py --markdown   # the same as a Markdown table (README, RESULTS)
    .venv/bin/python bench/reliability.py -k sandbox   # a subset (any further pytest arguments)
    .venv/bin/python bench/reliability.py --chaos [--mode M] [--kills N] [--steps S] [--seed S] [--markdown]

``--chaos`` runs the long form of the chaos test (``tests/reliability/test_chaos.py``): one run per
mode (every mode, or ``--mode``, repeatable) with ``--kills`` random SIGKILLs (default 6) of
rollout and policy ranks, reward workers and the controller (then ``--resume``), over ``--steps``
steps (default 4 per kill + 2), also waiting for Ray's agents of every killed controller to end.
Each run draws a fresh seed unless ``--seed`` fixes it (the same seed replays the same plan). It
prints one row per run: mode, seed, kills survived (made and recovered from), restarts, resumes,
prompts trained, lost, trained twice, wall seconds, and the result.

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
import time
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


CHAOS_TEST = SUITE / "test_chaos.py"
CHAOS_MODES = ("sync", "one_step_off", "async", "partial", "multi_turn")
CHAOS_COLUMNS = ("mode", "seed", "kills survived", "restarts", "resumes", "prompts trained", "lost", "trained twice",
                 "wall s", "result")


def chaos(args: argparse.Namespace, pytest_args: list[str]) -> int:
    """The long chaos runs (module docstring): pytest on the chaos test with the long form's
    settings, then one table row per run from what each wrote to ``RLWEAVE_CHAOS_OUT``."""
    modes = args.mode or list(CHAOS_MODES)
    unknown = sorted(set(modes) - set(CHAOS_MODES))
    if unknown:
        raise SystemExit(f"--mode: unknown {', '.join(unknown)}; choose from {', '.join(CHAOS_MODES)}")
    with tempfile.TemporaryDirectory(prefix="rlweave-chaos-") as tmp:
        rows_file, junit = Path(tmp) / "chaos.jsonl", Path(tmp) / "junit.xml"
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RLWEAVE_CHAOS_OUT=str(rows_file), RLWEAVE_CHAOS_LONG="1",
                   RLWEAVE_CHAOS_KILLS=str(args.kills))
        if args.steps:
            env["RLWEAVE_CHAOS_STEPS"] = str(args.steps)
        if args.seed is not None:
            env["RLWEAVE_CHAOS_SEED"] = str(args.seed)
        nodes = [f"{CHAOS_TEST}::test_chaos_run_keeps_every_guarantee[{m}]" for m in modes]
        cmd = [sys.executable, "-m", "pytest", *nodes, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-s",
               f"--junitxml={junit}", *pytest_args]
        t0 = time.monotonic()
        code = subprocess.call(cmd, cwd=REPO, env=env)
        took = time.monotonic() - t0
        runs = [json.loads(x) for x in rows_file.read_text().splitlines()] if rows_file.is_file() else []
        states = outcomes(junit)
    table = []
    for r in runs:
        made = f"{r['kills']} ({', '.join(r['targets'])})" if r["targets"] else "0"
        state = states.get(f"test_chaos_run_keeps_every_guarantee[{r['mode']}]", "?")
        table.append([r["mode"], str(r["seed"]), made, str(r["restarts"]), str(r["resumes"]), str(r["prompts_trained"]),
                      str(r["lost"]), str(r["trained_twice"]), f"{r['wall_s']:.0f}",
                      state + ("" if not r["problems"] else ": " + "; ".join(r["problems"]))])
    for m in modes:  # a run that failed before it wrote its row
        if m not in {r["mode"] for r in runs}:
            table.append([m, "?", "?", "?", "?", "?", "?", "?", "?",
                          states.get(f"test_chaos_run_keeps_every_guarantee[{m}]", "did not run")])
    header = (f"Chaos runs, {dt.date.today().isoformat()}, {cpu_name()}: {args.kills} kills a run, "
              f"{len(modes)} run(s) in {took / 60:.1f} min")
    _print_table(header, CHAOS_COLUMNS, table, args.markdown)
    return code


def _print_table(header: str, columns: tuple[str, ...], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731 - a "|" in a cell ends it otherwise
        print(f"{header}\n\n| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
        for r in rows:
            print("| " + " | ".join(cell(c) for c in r) + " |")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=header, show_lines=True)
    for col in columns:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(*r)
    Console(width=max(Console().width, 140)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--chaos", action="store_true", help="run the long chaos runs instead of the suite")
    parser.add_argument("--mode", action="append", help="--chaos: this run mode only (repeatable)")
    parser.add_argument("--kills", type=int, default=6, help="--chaos: kills a run (default 6)")
    parser.add_argument("--steps", type=int, default=0, help="--chaos: steps a run (default 4 per kill + 2)")
    parser.add_argument("--seed", type=int, default=None, help="--chaos: the plans' seed (default: a fresh one a run)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.chaos:
        return chaos(args, pytest_args)
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
    _print_table(header, ("guarantee", "measured", "result"),
                 [[r["guarantee"], r["measured"], r["result"]] for r in rows], args.markdown)
    return code


if __name__ == "__main__":
    sys.exit(main())
