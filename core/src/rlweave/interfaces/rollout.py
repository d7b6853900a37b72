"""The rollout contract: records in, trajectories out, as one packed training batch.

Every RL algorithm (GRPO and its named estimators, PPO, OnlineDPO) samples through a
:class:`Rollout`. Rollouts are a plugin kind (:class:`rlweave.plugins.RolloutRecord`, chosen by
``rollout.name``): ``single_turn`` (one continuation per prompt,
:class:`rlweave.algo_helpers.rollout.SingleTurnRollout`) is the default, ``multi_turn`` (episodes
through an environment, :class:`rlweave.algo_helpers.multi_turn.MultiTurnRollout`, configured by
``algorithm.multi_turn``) is chosen when that section is set, and third parties add their own.
A run builds its rollout once with :meth:`Rollout.create`.

What :meth:`Rollout.run` returns, one sample per trajectory, record-major (the ``n`` samples of
record 0 first), sample ids ``f"{record id}/{k}"``:

* token fields ``input_ids`` (prompt, then everything after it: the model's tokens exactly as
  sampled, never re-tokenised, and any observation tokens between its turns), ``loss_mask``
  (1 on the model's tokens, 0 on the prompt and on observations: what trainers train),
  ``rollout_logprobs`` (the engine's log-prob of each model token, 0 elsewhere);
* sample fields ``prompt_len``, ``response_len`` (tokens after the prompt), ``group`` (the
  record's index) and ``env_reward`` (what an environment paid; 0 without one);
* ``meta``: the record's reward fields plus ``prompt`` (the prompt text), ``response_ids`` (the
  last model turn: what rule rewards score), ``finish_reason`` and, for episodes, ``episode``
  (how it ended and its counters).

**Finished groups** (optional): a rollout whose class sets :attr:`Rollout.reports_groups` accepts
``on_group`` in :meth:`Rollout.run` and calls ``on_group(g, batch)`` once per record ``g`` as soon as
all its trajectories are final, while the others may still generate: ``batch`` holds that record's
samples packed exactly as they will be in run's result (the same ids, meta and tokens; ``group`` 0).
It is called from the thread that runs :meth:`Rollout.run`, must not block, and a record whose
samples cannot be packed yet is not reported (run's result is the authority). Reward sources use it
to score a group while the others still run (:mod:`rlweave.algo_helpers.reward_overlap`).

Light: no torch at import time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlweave.data.batch import Batch
    from rlweave.interfaces.engine import Generation, SamplingParams

#: ``generate(prompt_ids, sampling) -> one list of generations per prompt`` (blocking engine call)
GenerateFn = Callable[[list[list[int]], "SamplingParams"], list[list["Generation"]]]
#: ``on_group(record index, batch of that record's samples)`` (see the module docstring)
GroupFn = Callable[[int, "Batch"], None]


@dataclass
class RolloutContext:
    """What a rollout is built from: the run's ``tokenizer``, its validated settings ``args``
    (the record's ``config_model`` instance for ``rollout.args``, ``algorithm.multi_turn`` for the
    multi-turn rollout, ``{}`` without settings) and the algorithm's validated config
    ``algorithm`` (``n_samples``, ``max_new_tokens``...; may be None in tests); ``vision``: the
    run's :class:`~rlweave.data.vision.VisionProcessor` for a vision-language model (records with
    ``images``), None for a text model."""

    tokenizer: Any
    args: Any = None
    algorithm: Any = None
    vision: Any = None


class Rollout(ABC):
    """Turns data records into trajectories (see the module docstring)."""

    #: True: :meth:`run` accepts ``on_group`` and reports each finished record (module docstring)
    reports_groups: bool = False

    @classmethod
    def create(cls, ctx: RolloutContext) -> "Rollout":
        """The rollout of a run (called once, on the controller). Default: ``cls(ctx)``."""
        return cls(ctx)  # type: ignore[call-arg]

    @abstractmethod
    def run(self, records: Sequence[dict[str, Any]], n: int, sampling: SamplingParams, generate: GenerateFn,
            version: int = 0) -> Batch:
        """``n`` trajectories per record sampled with ``sampling`` through ``generate``;
        ``version``: the weight version the engine holds (stamped on tokens whose generation
        carries none)."""

    def close(self) -> None:
        """Stop what the rollout runs besides the engine (environment threads and workers)."""
