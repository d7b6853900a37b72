"""rlweave-algo-dpo: DPO and OnlineDPO for rlweave.

Light package module: the heavy pieces (``loss``, ``dpo``, ``online_dpo``) import torch and
are only loaded when a run selects ``algorithm.name: dpo`` or ``online_dpo``.
"""

__version__ = "0.1.0"
