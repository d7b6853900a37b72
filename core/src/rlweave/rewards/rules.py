"""Built-in rule rewards: plain functions ``fn(prompt, response, **fields) -> float``.

They are registered through the ``rlweave_rewards`` hook (see :mod:`rlweave.rewards.plugin`),
exactly as a third-party reward plugin would be. ``fields`` are the extra keys of the data
record (``answer`` here) and the entry's ``args`` from YAML; unknown keys are ignored.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlweave.rewards.normalize import answers_equal, last_boxed

_FIRST_NUMBER = re.compile(r"[-+]?\s*\d+(?:\.\d+)?")
_ANSWER_MARKER = re.compile(r"answer\s*[:=]", re.IGNORECASE)
# a number as prose writes it: a minus sign only when attached and not after a word or ")"
# ("56-14" is two numbers, "is -3" one), thousands separators ("1,234"), decimals
_PROSE_NUMBER = re.compile(r"(?:(?<![\w)])-)?\d+(?:,\d{3})*(?:\.\d+)?")


def extract_number(response: str) -> str | None:
    """The first number of ``response``, read after an optional ``Answer:`` marker or a
    leading ``=``; spaces inside the number (``- 5``) are dropped. ``None`` when there is none."""
    text = response.strip()
    marker = _ANSWER_MARKER.search(text)
    if marker:
        text = text[marker.end() :]
    text = text.lstrip().lstrip("=")
    m = _FIRST_NUMBER.search(text)
    return m.group(0).replace(" ", "") if m else None


def last_number(response: str) -> str | None:
    """The last number of ``response`` as prose writes it (the final answer of a chat reply:
    ``"5 + 3 = 8 apples."`` -> ``"8"``); thousands separators dropped (``"1,234"`` -> ``"1234"``);
    a minus sign counts only when attached and not after a word or ``)`` (``"9-4"`` -> ``"4"``).
    ``None`` when there is none."""
    found = _PROSE_NUMBER.findall(response)
    return found[-1].replace(",", "") if found else None


def arith_exact(prompt: str, response: str, answer: object = None, mode: str = "first", **_: object) -> float:
    """1.0 when the response's number equals ``answer`` exactly, else 0.0.

    The task (``examples/arith``) prompts ``"12+7="`` and expects ``"19"``. ``mode="first"``
    reads the first number (after an optional ``Answer:``/``=``); ``mode="full"`` needs the whole
    stripped response to be that number; ``mode="last"`` (what :func:`arith_last` uses) reads the
    last number (:func:`last_number`). Values compare exactly (``19`` == ``19.0``, ``19`` != ``1``).
    """
    if answer is None:
        raise ValueError("arith_exact needs an 'answer' field in the data record")
    if mode not in ("first", "full", "last"):
        raise ValueError(f"arith_exact: mode must be 'first', 'full' or 'last', got {mode!r}")
    got = last_number(response) if mode == "last" else extract_number(response)
    if got is None:
        return 0.0
    if mode == "full" and response.strip().replace(" ", "").lstrip("=") != got:
        return 0.0
    try:
        return 1.0 if Fraction(got) == Fraction(str(answer).strip()) else 0.0
    except (ValueError, ZeroDivisionError):
        return 1.0 if got == str(answer).strip() else 0.0


def arith_last(prompt: str, response: str, answer: object = None, **_: object) -> float:
    """1.0 when the last number of the response (:func:`last_number`) equals ``answer`` exactly,
    else 0.0: the final answer of a chat reply that works the problem out first
    (``"20 - 8 = 12, so Anna has 12 books."``; ``examples/real``)."""
    if answer is None:
        raise ValueError("arith_last needs an 'answer' field in the data record")
    return arith_exact(prompt, response, answer=answer, mode="last")


def math_boxed(prompt: str, response: str, answer: object = None, **_: object) -> float:
    """1.0 when the last ``\\boxed{...}`` of the response equals ``answer`` after normalising
    (see :func:`rlweave.rewards.normalize.answers_equal`), else 0.0 (also when nothing is boxed).
    An ``answer`` that itself contains ``\\boxed{}`` is unwrapped first."""
    if answer is None:
        raise ValueError("math_boxed needs an 'answer' field in the data record")
    got = last_boxed(response)
    if got is None:
        return 0.0
    ref = str(answer)
    ref = last_boxed(ref) or ref
    return 1.0 if answers_equal(got, ref) else 0.0


#: default of :func:`format_reward`: the last non-empty line is a final answer — a number,
#: optionally after ``Answer:``, or a line holding ``\boxed{...}``.
DEFAULT_FORMAT = r"(?:(?:final\s+)?answer\s*[:=]\s*)?[-+]?\d+(?:\.\d+)?|.*\\boxed\{.+\}.*"

_FLAGS = {"i": re.IGNORECASE, "s": re.DOTALL, "m": re.MULTILINE, "x": re.VERBOSE}


def format_reward(
    prompt: str,
    response: str,
    pattern: str = DEFAULT_FORMAT,
    where: str = "last_line",
    match: str = "full",
    flags: str = "i",
    **_: object,
) -> float:
    """1.0 when the response has the required format, else 0.0.

    Args (YAML ``rewards[].args``):
        pattern: a Python regular expression (default :data:`DEFAULT_FORMAT`).
        where: ``"last_line"`` (the last non-empty line) or ``"response"`` (all of it, stripped).
        match: ``"full"`` (the whole text must match) or ``"search"`` (anywhere).
        flags: letters of ``i`` ``s`` ``m`` ``x`` (re flags).
    """
    if where not in ("last_line", "response"):
        raise ValueError(f"format: where must be 'last_line' or 'response', got {where!r}")
    if match not in ("full", "search"):
        raise ValueError(f"format: match must be 'full' or 'search', got {match!r}")
    re_flags = 0
    for letter in flags:
        if letter not in _FLAGS:
            raise ValueError(f"format: unknown regex flag {letter!r} (use some of {''.join(_FLAGS)})")
        re_flags |= _FLAGS[letter]
    text = response.strip()
    if where == "last_line":
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    rx = re.compile(pattern, re_flags)
    found = rx.fullmatch(text) if match == "full" else rx.search(text)
    return 1.0 if found else 0.0


format = format_reward  # noqa: A001 - the reward's YAML name is "format"

__all__ = ["arith_exact", "arith_last", "math_boxed", "format_reward", "format", "extract_number", "last_number",
           "DEFAULT_FORMAT"]
