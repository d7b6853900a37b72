"""rlweave-algo-grpo: Group Relative Policy Optimization and the critic-free family around it
(Dr.GRPO, RLOO, REINFORCE++, ReMax, GSPO, CISPO, DAPO's options), its math taken from the named
parts of :mod:`rlweave.algo_parts`.

Light on import: ``plugin`` and ``config`` import no torch; ``algorithm`` and ``shaping`` do and
are loaded only when a run selects ``algorithm.name: grpo``.
"""

__version__ = "0.1.0"
