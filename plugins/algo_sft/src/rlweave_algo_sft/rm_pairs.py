"""Preference data for reward-model training: records -> (prompt, chosen, rejected) pairs.

Two record shapes are accepted:

* pairwise ``{"prompt", "chosen", "rejected"}`` (``"query"`` may stand for ``"prompt"``;
  an optional numeric ``"margin"`` is kept);
* ranked ``{"query", "response": [r1, r2, ...], "score": [s1, s2, ...]}``: every ordered pair
  ``(r_i, r_j)`` with ``s_i > s_j`` becomes one pair with ``r_i`` chosen (ties are skipped,
  as they carry no preference). With ``margin_from_scores`` the pair's margin is
  ``s_i - s_j``.

Errors name the record id and the offending key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    margin: float = 0.0
    source: str = ""  # id of the record it came from


def ranked_pairs(scores: Sequence[float]) -> list[tuple[int, int]]:
    """All ``(i, j)`` with ``scores[i] > scores[j]``, ordered by ``i`` then ``j`` (ties
    skipped)."""
    s = [float(x) for x in scores]
    return [(i, j) for i in range(len(s)) for j in range(len(s)) if s[i] > s[j]]


def record_pairs(record: dict[str, Any], margin_from_scores: bool = False) -> list[Pair]:
    """The preference pairs of one record (see module docstring)."""
    rid = str(record.get("id", "?"))
    prompt = record.get("prompt", record.get("query"))
    if prompt is None:
        raise ValueError(f"preference record {rid}: needs 'prompt' (or 'query')")
    if "chosen" in record or "rejected" in record:
        for k in ("chosen", "rejected"):
            if not isinstance(record.get(k), str):
                raise ValueError(f"preference record {rid}: '{k}' must be a string")
        return [Pair(str(prompt), record["chosen"], record["rejected"], float(record.get("margin", 0.0)), rid)]
    resp, score = record.get("response"), record.get("score")
    if not isinstance(resp, list) or not isinstance(score, list):
        raise ValueError(
            f"preference record {rid}: needs 'chosen'/'rejected' strings or ranked lists 'response' and 'score'"
        )
    if len(resp) != len(score):
        raise ValueError(f"preference record {rid}: {len(resp)} responses but {len(score)} scores")
    return [
        Pair(str(prompt), str(resp[i]), str(resp[j]),
             float(score[i]) - float(score[j]) if margin_from_scores else 0.0, rid)
        for i, j in ranked_pairs(score)
    ]


def records_to_pairs(records: Sequence[dict[str, Any]], margin_from_scores: bool = False) -> list[Pair]:
    return [p for r in records for p in record_pairs(r, margin_from_scores)]
