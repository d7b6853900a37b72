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
    failure's message (one line).

    Built by :func:`failure_stop`, it also knows the entry's config key (``key``:
    ``rewards.0.name``), the first failure's sample (``index`` in the scoring) and record
    (``record_id``, once the caller that knows the records' ids set it with :meth:`on_records`),
    the first failure in full (``details``: the worker's traceback, which the runner writes to the
    run's error log, setting ``log_file``) and what was being scored (``context``); its message is
    composed from them."""

    def __init__(self, message: str, reward: str = "", failed: int = 0, total: int = 0, first: str = "", *,
                 key: str = "", index: int | None = None, record_id: Any = None, details: str = "",
                 log_file: str | None = None, context: str = "", how: str = "", tail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reward, self.failed, self.total, self.first = reward, failed, total, first
        self.key, self.index, self.record_id, self.details, self.log_file = key, index, record_id, details, log_file
        self.context = context
        self.how = how  # failed calls by outcome (``3 error, 1 timeout``); set: the message is composed
        self.tail = tail  # what follows the first failure (the hint, the option)

    def __str__(self) -> str:
        if self.how:  # composed (failure_stop): the fields say it
            where = f" ({self.key})" if self.key else ""
            on = f", on record {str(self.record_id)!r}" if self.record_id is not None else ""
            text = (f"{self.context}reward '{self.reward}'{where}: {self.failed} of {self.total} calls failed "
                    f"({self.how}; first{on}: {self.first}){self.tail}")
        else:
            text = self.message
        return text + (f"; full traceback in {self.log_file}" if self.log_file else "")

    def _fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("key", "index", "record_id", "details", "log_file", "context", "how",
                                              "tail")}

    def __reduce__(self) -> Any:  # keeps its fields across processes (Ray, multiprocessing)
        return (_rebuild, (type(self), self.message, self.reward, self.failed, self.total, self.first, self._fields()))

    def on_records(self, ids: Any) -> RewardFailureError:
        """The same failure naming the first failure's record: ``ids[index]`` (``ids``: the scored
        samples' record ids, in order); itself when the index is unknown or out of range."""
        if self.index is not None and 0 <= self.index < len(ids):
            self.record_id = ids[self.index]
        return self

    def within(self, context: str) -> RewardFailureError:
        """The same failure, its message led by ``context`` (``held-out evaluation on 16 records: ``)."""
        if self.how:
            self.context = context + self.context
        else:
            self.message = context + self.message
        return self


def _rebuild(cls: type, message: str, reward: str, failed: int, total: int, first: str,
             fields: dict[str, Any]) -> RewardFailureError:
    return cls(message, reward, failed, total, first, **fields)


def first_line(text: Any) -> str:
    """The first non-empty line of a failure message."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def failure_stop(
    name: str, kinds: Counter[str], total: int, first: str, max_share: float, fields: list[str], *,
    key: str = "", index: int | None = None, record_id: Any = None,
) -> RewardFailureError | None:
    """The error to raise when reward ``name`` failed too often, else ``None``.

    ``kinds``: failed calls by outcome (``error``, ``timeout``, ``crash``); ``total``: the
    reward's calls in this scoring; ``first``: the first failure's message (its first line is
    quoted, the whole kept as ``details``); ``fields``: the keys of the samples the reward was
    called with (named when the failures are errors); ``key``: the reward's config key;
    ``index`` / ``record_id``: the first failure's sample in the scoring and its record."""
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
    return RewardFailureError("", reward=name, failed=failed, total=total, first=first_line(first), key=key,
                              index=index, record_id=record_id, details=str(first), how=how,
                              tail=f"{hint}. {OPTION} is {max_share:g} (1.0: never stop)")
