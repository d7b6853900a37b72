"""What one GPU check group measured, read from its output (standard library only).

* :func:`junit_counts` reads pytest's JUnit XML: passed, failed (failures and errors), skipped,
  and every ``key_figure`` property a test recorded (``record_property("key_figure", text)``);
  :func:`verbose_counts` the same counts from ``pytest -v`` output, for a run stopped early;
* the bench readers take a bench's printed output (or its JSON) and return the key figure as
  one short text; each raises :class:`ValueError` when the output does not hold it.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_counts(path: Path) -> tuple[int, int, int, list[str]]:
    """``(passed, failed, skipped, key figures)`` of a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    figures = [p.get("value", "") for p in root.iter("property") if p.get("name") == "key_figure"]
    return tests - failed - skipped, failed, skipped, figures


_VERBOSE = re.compile(r"^\S+::\S.* (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)


def verbose_counts(text: str) -> tuple[int, int, int]:
    """``(passed, failed, skipped)`` from the result lines of ``pytest -v`` output: what a run
    that was stopped before writing its JUnit XML had finished."""
    outcomes = _VERBOSE.findall(text)
    return (sum(o in ("PASSED", "XPASS") for o in outcomes), sum(o in ("FAILED", "ERROR") for o in outcomes),
            sum(o in ("SKIPPED", "XFAIL") for o in outcomes))


_SYNC_ROW = re.compile(r"^\| ([\d.]+) MiB \| (\d+) \| [\d.]+ \(([\d.]+)\) \| [\d.]+ \(([\d.]+)\) \| ([\d.]+)x \|", re.M)


def weight_sync(text: str) -> str:
    """``bench/weight_sync.py --gpu``: the largest state's cuda_ipc rate beside the device copy."""
    rows = _SYNC_ROW.findall(text)
    if not rows:
        raise ValueError("no result row of bench/weight_sync.py --gpu in its output")
    mb, receivers, ipc, copy, ratio = max(rows, key=lambda r: (float(r[0]), -int(r[1])))
    return (f"cuda_ipc {float(ipc):.1f} GiB/s vs device copy {float(copy):.0f} GiB/s ({float(mb):.0f} MiB, "
            f"{receivers} receiver{'s' if receivers != '1' else ''})")


_MOE_ROW = re.compile(r"^\| (hf eager|hf grouped_mm|ours torch|ours triton|ours reference) \| ([\d.]+) \| ([\d.]+)x \|",
                      re.M)


def moe_experts(text: str) -> str:
    """``bench/moe_experts.py``: the kernel's implementations in ms and against the eager loop."""
    rows = {label: (float(ms), float(x)) for label, ms, x in _MOE_ROW.findall(text)}
    if "hf eager" not in rows or "ours torch" not in rows:
        raise ValueError("bench/moe_experts.py printed no 'hf eager' and 'ours torch' rows")
    parts = [f"{label.split()[1]} {ms:.1f} ms ({x:.1f}x)" for label, (ms, x) in rows.items()
             if label in ("ours torch", "ours triton")]
    return f"grouped experts fwd+bwd: {', '.join(parts)} vs hf eager {rows['hf eager'][0]:.1f} ms"


def training(path: Path) -> str:
    """``bench/backend_throughput.py --out``'s JSON: tokens/s, MFU and peak memory of each row."""
    data = json.loads(Path(path).read_text())
    rows = data.get("rows") or []
    if not rows:
        raise ValueError(f"{path}: no rows")
    ceil = float(data["ceiling_flop_s"])
    preset = data.get("args", {}).get("preset", "?")
    return "; ".join(f"{r['config']}: {r['tok_s']:,.0f} tokens/s, MFU {100 * r['flop_s'] / ceil:.1f}%"
                     + (f", {r['mem_gib']:.1f} GiB" if r.get("mem_gib") is not None else "")
                     for r in rows) + f" ({preset} shape, {data.get('precision')})"


_DECODE_FIT = re.compile(r"^fit: a decode step ([\d.]+) ms \+ ([\d.]+) us a sequence$", re.M)
_DECODE_TASK = re.compile(r"partial round at least [\d.]+ s \(budget (\d+)\); ([\d.]+) of sync$", re.M)


def decode_cost(text: str) -> str:
    """``bench/decode_cost.py``: a decoding step's cost per step and per sequence, and the least
    share of sync's generation a partial round takes on the long-tail task."""
    fit, task = _DECODE_FIT.search(text), _DECODE_TASK.search(text)
    if not fit or not task:
        raise ValueError("bench/decode_cost.py printed no fit or no task line")
    return (f"decode step {fit.group(1)} ms + {fit.group(2)} us a sequence; a partial round (budget "
            f"{task.group(1)}) >= {task.group(2)} of sync's generation")
