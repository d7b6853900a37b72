"""rlweave-infer-vllm: the rollout engine on vLLM.

Selected with ``roles.rollout.engine: vllm``. ``import rlweave_infer_vllm`` is light; vLLM
is imported only by :mod:`rlweave_infer_vllm.engine` when a run selects the engine.
"""

__version__ = "0.1.0"
