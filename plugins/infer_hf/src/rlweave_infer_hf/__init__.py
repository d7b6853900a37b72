"""rlweave-infer-hf: a light rollout engine on transformers ``generate``.

Selected with ``roles.rollout.engine: hf``. The heavy code (:mod:`rlweave_infer_hf.engine`)
is imported only when a run selects it.
"""

__version__ = "0.1.0"
