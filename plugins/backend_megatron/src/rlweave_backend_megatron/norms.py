"""The RMS norm of the megatron backend's local layer specs.

megatron-core's local specs build their norms with ``WrappedTorchNorm``, which refuses
sequence parallelism and, on CPU, creates its weight in fp32 whatever ``params_dtype``.
:class:`RMSNorm` is ``torch.rms_norm`` with a weight in the model's dtype that carries
megatron's ``sequence_parallel`` attribute: with sequence parallelism each tensor-parallel rank
normalises its own slice of the sequence, so the weight's gradient is summed over the ranks (the
worker's gradient reduction does it for every parameter marked so). Parameter names are those of
``torch.nn.RMSNorm`` (``weight``).
"""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.Module):
    """``torch.rms_norm`` over the last dimension, megatron's norm-module signature."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
