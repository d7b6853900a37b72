"""KL coefficient controllers of ``algorithm.kl`` (GRPO and PPO): the coefficient of the per-token
KL to the reference, fixed or adaptive.

* :class:`FixedKLController` keeps ``beta`` constant.
* :class:`AdaptiveKLController` (Ziegler et al. 2019, "Fine-Tuning Language Models from
  Human Preferences", section 2.2) steers the measured KL toward ``target``::

      e_t    = clip(KL_t / target - 1, -0.2, 0.2)
      beta  <- beta * (1 + K_beta * e_t),   K_beta = n_steps / horizon

  where ``KL_t`` is the current batch's mean per-sequence KL (summed over response tokens)
  and ``n_steps`` the number of sequences in that batch.

Both are JSON-checkpointable through ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

from typing import Any


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, init_kl_coef: float):
        self.value = float(init_kl_coef)

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Proportional controller of the KL coefficient toward ``target``."""

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if target <= 0:
            raise ValueError(f"adaptive KL controller: target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"adaptive KL controller: horizon must be > 0, got {horizon}")
        super().__init__(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon
        return self.value


def make_kl_controller(init_kl_coef: float, target: float | None = None, horizon: float = 10000.0) -> FixedKLController:
    """Adaptive when ``target`` is set, fixed otherwise."""
    if target is None:
        return FixedKLController(init_kl_coef)
    return AdaptiveKLController(init_kl_coef, target, horizon)
