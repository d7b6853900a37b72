"""A small, robust normaliser for final answers (math-style, LaTeX-ish).

Contract: :func:`normalize_answer` maps an answer string to a canonical string;
:func:`answers_equal` compares two answers, first as canonical strings, then numerically
(integers, decimals, ``a/b`` and ``\\frac{a}{b}``, thousands separators). It never raises on
odd input: anything it cannot parse is compared as text.
"""

from __future__ import annotations

import re
from fractions import Fraction

_TEXT_CMDS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12 -> \frac{1}{2}
_SQRT_SHORT = re.compile(r"\\sqrt\s*(\d+)")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)$")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=\s*(?=\S)")


def _replace_fracs(s: str) -> str:
    """Rewrite every ``\\frac{a}{b}`` (balanced braces) as ``(a)/(b)``, innermost first."""
    for _ in range(20):  # nested fractions; bounded so odd input cannot loop forever
        idx = s.find("\\frac{")
        if idx < 0:
            return s
        num, after_num = _braced(s, idx + len("\\frac"))
        if num is None or after_num >= len(s) or s[after_num] != "{":
            return s
        den, after_den = _braced(s, after_num)
        if den is None:
            return s
        num, den = _replace_fracs(num), _replace_fracs(den)
        s = f"{s[:idx]}({num})/({den}){s[after_den:]}"
    return s


def _braced(s: str, start: int) -> tuple[str | None, int]:
    """Content of the brace group opening at ``s[start] == '{'`` and the index after it."""
    if start >= len(s) or s[start] != "{":
        return None, start
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return s[start + 1 : i], i + 1
    return None, start


def _strip_parens(s: str) -> str:
    """``(12)`` -> ``12`` for simple atoms, so ``(1)/(2)`` reads as ``1/2``."""
    return re.sub(r"\(([-+]?[\d.]+)\)", r"\1", s)


def normalize_answer(text: object) -> str:
    """Canonical form of an answer: no spaces, ``$``, ``\\left``/``\\right``, ``\\text{}``
    wrappers, trailing ``.``, thousands commas; ``\\dfrac``/``\\tfrac``/``\\frac{a}{b}`` -> ``a/b``;
    a leading ``x =`` dropped."""
    s = str(text).strip()
    s = s.replace("$", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = _SPACING.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    for _ in range(3):
        s = _TEXT_CMDS.sub(r"\1", s)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.strip()
    s = _ASSIGN.sub("", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    s = _replace_fracs(s)
    s = _strip_parens(s)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    if s.startswith("+"):
        s = s[1:]
    return s


def to_number(s: str) -> Fraction | None:
    """Exact value of a normalised number: an int, a decimal, or a quotient of them with
    parentheses and signs (``-(1/2)/2``), else ``None``. No other operators are evaluated."""
    tokens = re.findall(r"\d+(?:\.\d*)?|\.\d+|[-+/()]|\S", s)
    if not tokens or len(tokens) > 64:
        return None
    pos = 0

    def atom() -> Fraction:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("end")
        tok = tokens[pos]
        pos += 1
        if tok in "+-":
            value = atom()
            return -value if tok == "-" else value
        if tok == "(":
            value = quotient()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise ValueError("paren")
            pos += 1
            return value
        if _NUMBER.match(tok):
            return Fraction(tok)
        raise ValueError(tok)

    def quotient() -> Fraction:
        nonlocal pos
        value = atom()
        while pos < len(tokens) and tokens[pos] == "/":
            pos += 1
            value = value / atom()
        return value

    try:
        value = quotient()
    except (ValueError, ZeroDivisionError, RecursionError):
        return None
    return value if pos == len(tokens) else None


def answers_equal(predicted: object, reference: object) -> bool:
    """True when both answers normalise to the same text or to the same number."""
    a, b = normalize_answer(predicted), normalize_answer(reference)
    if not a:
        return False
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    return x is not None and y is not None and x == y


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, else ``None``.

    ``\\boxed 5`` (no braces) gives ``"5"``.
    """
    best: str | None = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*", text):
        end = m.end()
        if end < len(text) and text[end] == "{":
            content, _ = _braced(text, end)
            if content is not None:
                best = content
        else:
            tok = re.match(r"[^\s$]+", text[end:])
            if tok:
                best = tok.group(0)
    return best
