"""The base of an algorithm built on the step toolkit (:class:`~rlweave.algo_helpers.experience.
ExperienceKit`): what such an algorithm does the same as every other one, written once.

A subclass builds ``self.kit`` in its ``__init__`` (after :meth:`KitAlgorithm.require_roles`),
writes ``step``, and names its own checkpoint keys in :meth:`own_state` /
:meth:`load_own_state`; setup, evaluation, drain, close, ``steps_done`` and the checkpoint's
layout (:mod:`rlweave.algo_helpers.kit_state`) come from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlweave.algo_helpers.experience import ExperienceKit
from rlweave.interfaces.algorithm import Algorithm


class KitAlgorithm(Algorithm):
    """An :class:`~rlweave.interfaces.algorithm.Algorithm` whose step runs on ``self.kit``."""

    kit: ExperienceKit

    def require_roles(self, roles: Iterable[str], name: str) -> None:
        """Raise naming the ``roles`` the run context lacks (``name``: the algorithm's); a run that
        replays a dump (``rollout.replay``) has no rollout role."""
        replay = getattr(getattr(getattr(self.ctx, "config", None), "rollout", None), "replay", None)
        missing = [r for r in roles if r not in self.ctx.roles and not (replay and r == "rollout")]
        if missing:
            raise ValueError(f"{name}: roles {missing} are not built (configure them under 'roles')")

    def use_policy_parts(self) -> None:
        """``self.advantage``, ``self.policy_loss``, ``self.loss_agg`` (resolved named parts) and
        ``self.kl`` (:class:`~rlweave.algo_helpers.kl_penalty.KLPenalty`) from the config's
        ``advantage``, ``policy_loss``, ``loss_agg`` and ``kl``."""
        from rlweave.algo_helpers.kl_penalty import KLPenalty
        from rlweave.algo_parts.spec import choose_loss_agg, resolve

        c = self.config
        self.advantage = resolve("advantage", c.advantage)
        self.policy_loss = resolve("policy_loss", c.policy_loss)
        self.loss_agg = choose_loss_agg(c.loss_agg, self.policy_loss, self.advantage)
        self.kl = KLPenalty(c.kl)

    @property
    def steps_done(self) -> int:
        return self.kit.steps_done

    def setup(self) -> None:
        """The first weight sync (the policy may come from a checkpoint)."""
        self.kit.setup()

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        return self.kit.evaluate(records)

    def drain(self, abort: bool = False) -> None:
        self.kit.drain(abort=abort)

    def close(self) -> None:
        self.kit.close()

    def own_state(self) -> dict[str, Any]:
        """The algorithm's own checkpoint keys beside the toolkit's (default: none)."""
        return {}

    def load_own_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`own_state` from the whole (migrated) state."""

    def state_dict(self) -> dict[str, Any]:
        return {**self.kit.state_dict(), **self.own_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_own_state(self.kit.load_state_dict(state))
