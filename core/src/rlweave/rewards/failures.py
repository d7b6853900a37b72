"""The failing-reward stop: a scoring in which one reward mostly fails ends the run.

A reward that fails on every sample (most often because the data records lack a field it
needs, such as ``answer``) is scored ``failure_reward`` everywhere, so a run would train
step after step on a constant reward and a zero loss. :func:`failure_stop` turns that into
:class:`RewardFailureError` as soon as more than ``reward_runtime.max_failed_share`` of one
reward's calls in one :meth:`~rlweave.rewards.RewardSet.score` fail (error, timeout or
crash). The runner does not catch it, so the run stops and ``rlweave train`` exits non-zero.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

OPTION = "reward_runtime.max_failed_share"


class RewardFailureError(RuntimeError):
    """More than ``reward_runtime.max_failed_share`` of one reward's calls failed in one
    scoring. ``reward``: its name; ``failed`` of ``total`` calls; ``first``: the first
    failure's message (one line)."""

    def __init__(self, message: str, reward: str = "", failed: int = 0, total: int = 0, first: str = "") -> None:
        super().__init__(message)
        self.reward, self.failed, self.total, self.first = reward, failed, total, first

    def __reduce__(self) -> Any:  # keeps its fields across processes (Ray, multiprocessing)
        return (type(self), (str(self), self.reward, self.failed, self.total, self.first))


def first_line(text: Any) -> str:
    """The first non-empty line of a failure message."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def failure_stop(
    name: str, kinds: Counter[str], total: int, first: str, max_share: float, fields: list[str]
) -> RewardFailureError | None:
    """The error to raise when reward ``name`` failed too often, else ``None``.

    ``kinds``: failed calls by outcome (``error``, ``timeout``, ``crash``); ``total``: the
    reward's calls in this scoring; ``first``: the first failure's message; ``fields``: the
    keys of the samples the reward was called with (named when the failures are errors)."""
    failed = sum(kinds.values())
    if total <= 0 or failed <= max_share * total:
        return None
    how = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    hint = ""
    if kinds.get("error"):
        hint = (f"; the samples have fields {sorted(fields)}: the data records may lack a field the reward needs, "
                "or rewards[].args may not match its parameters")
    elif kinds.get("timeout"):
        hint = "; the calls ran past reward_runtime.timeout_s"
    msg = (f"reward '{name}': {failed} of {total} calls failed ({how}; first: {first_line(first)}){hint}. "
           f"{OPTION} is {max_share:g} (1.0: never stop)")
    return RewardFailureError(msg, reward=name, failed=failed, total=total, first=first_line(first))
