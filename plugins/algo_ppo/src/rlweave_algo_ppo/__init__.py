"""rlweave-algo-ppo: PPO for RLHF (policy, rollout, reference, critic, reward roles).

Modules: ``plugin`` (light hook), ``config`` (PPOConfig), ``gae``, ``kl_controller``,
``normalize``, ``loss`` (pure torch math), ``algorithm`` (the step's dataflow).
"""

__version__ = "0.1.0"
