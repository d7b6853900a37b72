"""rlweave-algo-grpo: Group Relative Policy Optimization and its common variants.

Light on import: ``plugin`` and ``config`` import no torch; ``algorithm``, ``loss`` and
``advantages`` do and are loaded only when a run selects ``algorithm.name: grpo``.
"""

__version__ = "0.1.0"
