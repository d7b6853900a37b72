"""The repository speaks of the project as it is, not of how it was developed.

README.md, bench/RESULTS.md, the benchmark scripts, docs/ and the plugin READMEs state what the code
does and, for measurements, the date and the machine. Phrases that narrate the project's own history
("round 4", "this session", "used to", "(now)" against "(before)" in a table, "the old default")
fail this test, which names the file, the line and the phrase. The patterns are narrow on purpose:
ordinary words such as "rounding", "round trip", "an earlier run" or "is used to sign" pass.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (pattern, why it narrates); matched case-insensitively, line by line
NARRATING: list[tuple[str, str]] = [
    (r"\brounds?[ -]\d+", "numbered rounds of development"),
    (r"\bthis round\b", "a round of development"),
    (r"\b(?:this|that|the previous|the next) session\b|\bsession[ -]\d+\b", "a working session"),
    (r"\bpreviously\b", "how the code behaved before"),
    (r"(?<!\bis )(?<!\bare )(?<!\bwas )(?<!\bwere )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused to\b",
     "how the code behaved before (the passive 'is used to' passes)"),
    (r"\bwe (?:added|changed|fixed|removed|replaced|now)\b", "the developers' own story"),
    (r"\b(?:before|after) (?:this|the) (?:change|fix|commit)\b|\bthe review commit\b", "a change in history"),
    (r"\bno longer\b(?! than)", "a change in history"),
    (r"\bwhat changed\b|\bsince round\b|\bfinal code\b|\bnew default\b", "a change in history"),
    (r"\bthe old (?:default|protocol|code|behaviou?r|path|layout|format|way)\b", "a former version of the code"),
    (r"(?<!\w)\((?:now|before|after|new)\)|(?<!\w)\(new[;:]|\bnew (?:\w+ )?(?:option|flag|default)\b",
     "a table or note comparing code versions"),
    (r"\bissue #?\d+\b", "the issue tracker's history"),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), why) for p, why in NARRATING]


def scanned_files() -> list[Path]:
    """The user-facing prose of the repository (benchmark scripts whole: docstrings, comments, prints)."""
    files = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md"]
    files += sorted((ROOT / "bench").glob("*.py"))
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "plugins").glob("*/README.md"))
    return [f for f in files if f.is_file()]


def narrating_phrases(text: str) -> list[tuple[int, str, str]]:
    """``(line number, matched phrase, why)`` for every narrating phrase in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, why in _COMPILED:
            for match in pattern.finditer(line):
                found.append((number, match.group(0), why))
    return found


def test_the_scan_covers_the_documents():
    names = {f.relative_to(ROOT).as_posix() for f in scanned_files()}
    assert {"README.md", "bench/RESULTS.md"} <= names
    assert any(n.startswith("bench/") and n.endswith(".py") for n in names)
    assert any(n.startswith("docs/") for n in names)
    assert any(n.startswith("plugins/") and n.endswith("/README.md") for n in names)


@pytest.mark.parametrize("text", [
    "Measured in round 7 on the AMX machine.",
    "the AMD machine of rounds 1-3",
    "Both rows are 1.73x the round-1 numbers.",
    "Tried and dropped this round: a fused kernel.",
    "numbers from this session",
    "The engine previously reserved one core.",
    "The planner used to sort by length.",
    "What changed since round 5:",
    "Old protocol, final code, right after.",
    "| fwd bf16, bwd fp32 (now) | 12.0 |",
    "`cpu_kernels` (new FSDP option; auto: on)",
    "`bench/cpu_matmul.py` (new; allocator settings as rlweave sets them)",
    "1.35x over the old default",
    "After the review commit (one helper): 2.04x.",
    "The yardstick of issue 6.",
    "The worker no longer pops the key.",
])
def test_narrating_phrases_are_found(text):
    assert narrating_phrases(text), text


@pytest.mark.parametrize("text", [
    "rounding differs between CPUs, so the same seeds give other numbers",
    "the controller and 3 Ray round trips",
    "round-robin over the replicas",
    "k = max(1, round(n_samples / n_micro))",
    "timed rounds per process, after one warm-up",
    "an earlier run is moved aside, never deleted",
    "the dev split was used to choose the schedule",
    "the key is used to sign each bucket",
    "no longer than 128 tokens",
    "reference and old log-probs while the rewards are scored",
    "128 new tokens with EOS ignored",
    "measured 2026-11-23 on a 2-core Intel Xeon with AMX",
    "merged = combine(before) + combine(after)",
    "rows.append((new, old))",
])
def test_ordinary_usage_passes(text):
    assert not narrating_phrases(text), narrating_phrases(text)


def test_documents_do_not_narrate_the_projects_history():
    problems = []
    for path in scanned_files():
        for number, phrase, why in narrating_phrases(path.read_text(encoding="utf-8")):
            problems.append(f"{path.relative_to(ROOT).as_posix()}:{number}: {phrase!r} ({why})")
    assert not problems, ("state what is, and date measurements with their machine instead of narrating "
                          "history:\n" + "\n".join(problems))
