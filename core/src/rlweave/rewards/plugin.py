"""Built-in rewards, registered through the same ``rlweave_rewards`` hook as third-party
reward plugins (entry point ``builtin-rewards`` in core's pyproject.toml). Light: no imports
beyond the record types and the args models; the functions are imported by ``record.load()``."""

from __future__ import annotations

from rlweave.plugins import RewardRecord, hookimpl
from rlweave.rewards.args import ArithExactArgs, FormatArgs


@hookimpl
def rlweave_rewards() -> list[RewardRecord]:
    return [
        RewardRecord(
            name="arith_exact",
            summary="1 if the first number of the response equals the record's 'answer'",
            target="rlweave.rewards.rules:arith_exact",
            config_model=ArithExactArgs,
        ),
        RewardRecord(
            name="arith_last",
            summary="1 if the last number of the response (a chat reply's final answer) equals 'answer'",
            target="rlweave.rewards.rules:arith_last",
        ),
        RewardRecord(
            name="math_boxed",
            summary="1 if the last \\boxed{} equals 'answer' after a LaTeX/number normaliser",
            target="rlweave.rewards.rules:math_boxed",
        ),
        RewardRecord(
            name="format",
            summary="1 if the response matches a regex (default: a final answer line)",
            target="rlweave.rewards.rules:format_reward",
            config_model=FormatArgs,
        ),
    ]
