"""The environment contract of multi-turn rollouts (plugin kind ``environment``).

An :class:`Environment` is one episode: the rollout builds one per trajectory with
``cls(args)`` (``args``: the record's validated ``config_model`` instance, or ``{}``), calls
:meth:`Environment.reset` once with the data record, then alternates a model turn and
:meth:`Environment.step` with the text of that turn, until a step says ``done`` or a limit of the
rollout ends the episode (:meth:`Environment.close` is called in both cases).

Messages are chat messages (``{"role": ..., "content": ...}``); the rollout renders them with the
tokenizer's chat template and appends their token ids after the model's own tokens, which are
never re-tokenised. ``step`` may block (a tool call); it runs in a worker thread, never on the
engine. Light: no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EnvStep:
    """What one :meth:`Environment.step` returns.

    Attributes:
        messages: observation messages to append (tool results, a judge's reply...); empty when
            ``done``.
        reward: a reward for this turn (summed into the episode reward), or None.
        done: the episode is over (the model gave its final answer, or the environment ended it).
        info: counters the rollout sums into its metrics (``tool_calls``, ``tool_errors``,
            ``tool_time_s``, or any other number).
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """One episode of a multi-turn rollout (see the module docstring)."""

    def __init__(self, args: Any = None):
        self.args = args

    @abstractmethod
    def reset(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The opening messages of the episode for data record ``record`` (a system message
        describing the tools, then the user's prompt, typically)."""

    @abstractmethod
    def step(self, action: str) -> EnvStep:
        """React to the model's turn ``action`` (its decoded text, special tokens skipped)."""

    def close(self) -> None:
        """Release what the episode holds (called once, after the last step or a limit)."""

    @classmethod
    def shutdown(cls) -> None:
        """Release what all episodes of this class share (worker processes...); called once when
        the rollout that used the class closes."""
