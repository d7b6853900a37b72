"""Which fields of a data record a reward function receives.

A reward is called as ``fn(prompt=..., response=..., **fields, **args)`` where ``fields`` are
the record's keys other than :data:`NOT_FIELDS` (the id, the prompt/response carriers and the
prompt's images), e.g. ``answer``. The run, the evaluation and the validation dry-run all use
this one rule.
"""

from __future__ import annotations

from typing import Any

#: record keys that are never handed to a reward as fields
NOT_FIELDS = ("id", "prompt", "query", "response", "messages", "images")


def reward_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The extra fields of a record handed to reward functions (e.g. ``answer``)."""
    return {k: v for k, v in record.items() if k not in NOT_FIELDS}
