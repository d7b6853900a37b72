"""rlweave-algo-ppo: PPO for RLHF (policy, rollout, reference, critic, reward roles).

Modules: ``plugin`` (light hook), ``config`` (PPOConfig), ``normalize``,
``loss`` (the critic's loss), ``sequences`` (ptx batches), ``algorithm`` (the step's dataflow).
GAE, the policy loss and the KL estimators are named parts of :mod:`rlweave.algo_parts`.
"""

__version__ = "0.1.0"
