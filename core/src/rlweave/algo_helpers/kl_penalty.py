"""``algorithm.kl`` at work, for GRPO and PPO alike: the KL to the reference model as a
per-token reward penalty or as a loss term, with a fixed or adaptive coefficient.

In the reward (``kl.in_reward``), each trained token pays ``-coef * KL_t`` with ``KL_t`` the
named estimator of the old (pre-update) policy against the reference, clamped; the step reports
``kl_reward`` (the mean summed KL of a sample) and ``kl_coef``, and an adaptive coefficient
(``kl.target``) moves after each step towards the target. In the loss, the policy objective gets
the estimator, coefficient and clamp (:meth:`KLPenalty.loss_terms`).
"""

from __future__ import annotations

from typing import Any

import torch

from rlweave.algo_parts.kl import kl_value
from rlweave.algo_parts.kl_controller import make_kl_controller
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch


class KLPenalty:
    """The KL of one run (``section``: its validated ``algorithm.kl``)."""

    def __init__(self, section: Any):
        self.section = section
        self.part = resolve("kl", section.estimator)
        self.controller = make_kl_controller(section.beta, section.target, section.horizon)

    @property
    def coef(self) -> float:
        """The coefficient now (the adaptive one moves after each step)."""
        return self.controller.value

    @property
    def in_reward(self) -> bool:
        return bool(self.section.in_reward) and self.section.enabled

    def reward(self, batch: Batch, metrics: dict[str, float], old: str = "old_logprobs") -> torch.Tensor | None:
        """Per-token rewards ``-coef * KL_t`` on the trained tokens of ``batch`` (token fields
        ``old``: the policy's log-probs before the update, ``ref_logprobs``, ``loss_mask``) when the
        KL is in the reward, else None; adds ``kl_reward`` and ``kl_coef`` to ``metrics`` and keeps
        the step's KL for :meth:`update`. ``old``: ``rollout_logprobs`` when the engine's log-probs
        stand in for the old ones (``off_policy.mode: bypass``)."""
        if not self.in_reward:
            return None
        mask = batch.token["loss_mask"]
        kl_tok = kl_value(self.part.load(), batch.token[old], batch.token["ref_logprobs"],
                          self.section.clamp) * mask
        seq_kl = torch.zeros(len(batch)).index_add_(0, batch.sample_index(), kl_tok)
        self._measured = (float(seq_kl.mean()), len(batch))
        metrics["kl_reward"] = self._measured[0]
        metrics["kl_coef"] = self.coef
        return -self.coef * kl_tok

    def loss_terms(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~rlweave.algo_parts.objective.PolicyObjective` for the KL
        in the loss (a zero coefficient when it is in the reward or off)."""
        beta = self.coef if self.section.enabled and not self.section.in_reward else 0.0
        return {"kl": self.part, "kl_beta": beta, "kl_clamp": self.section.clamp}

    def update(self) -> None:
        """After a step: the adaptive coefficient moves with the KL :meth:`reward` measured."""
        measured = getattr(self, "_measured", None)
        if measured is not None:
            self.controller.update(*measured)
            self._measured = None

    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state)
