"""rlweave-algo-sft: supervised fine-tuning (``sft``) and reward-model training (``rm``),
the first two stages of the RLHF pipeline.

Light on import: ``plugin``/``rm_plugin`` and the config modules import no torch.
"""

__version__ = "0.1.0"
