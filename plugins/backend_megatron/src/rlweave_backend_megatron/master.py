"""fp32 master weights of a model trained in bf16 or fp16 (``options.master_weights``).

The model's parameters stay in their low precision for forward and backward; the optimizer
updates an fp32 copy of each (its *master*) with fp32 state, and the parameter takes the
master's value, rounded, after every step. Updates smaller than the parameter's rounding step
(a bf16 weight of 0.1 moves in steps of about 4e-4) so accumulate in the master instead of being
lost, as megatron-core's ``Float16OptimizerWithFloat16Params`` and mixed-precision FSDP do.

Gradients reach the master in fp32: a hook runs after each accumulation into a parameter's
``grad`` (every micro-batch's backward), adds it to the master's ``grad`` in fp32 and frees the
low-precision one, so micro-batches sum in fp32 and no low-precision gradient outlives a backward.

Contract: :meth:`MasterWeights.main` maps a model parameter to the tensor the optimizer, the
gradient reduction, clipping and checkpoints work on (its master); :meth:`copy_to_model` after
each optimizer step; :meth:`to` moves the masters with the model (offload).
"""

from __future__ import annotations

import torch


class MasterWeights:
    """fp32 masters of ``model``'s trainable parameters (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        self._main: dict[int, torch.nn.Parameter] = {}
        self._pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        for p in model.parameters():
            if not p.requires_grad or p.dtype == torch.float32:  # frozen, or fp32 already (a norm, say)
                continue
            m = torch.nn.Parameter(p.detach().to(torch.float32).clone())
            self._main[id(p)] = m
            self._pairs.append((p, m))
            p.register_post_accumulate_grad_hook(self._into(m))

    @staticmethod
    def _into(m: torch.nn.Parameter):
        def hook(p: torch.Tensor) -> None:
            g = p.grad.detach().to(torch.float32)
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

        return hook

    def main(self, p: torch.nn.Parameter) -> torch.nn.Parameter:
        """The fp32 master of ``p`` (``p`` itself when it has none: frozen or fp32)."""
        return self._main.get(id(p), p)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Each parameter takes its master's value, rounded to the parameter's dtype."""
        for p, m in self._pairs:
            p.copy_(m)

    def to(self, device) -> None:
        """Move every master (and its gradient, if any) to ``device``."""
        for _, m in self._pairs:
            m.data = m.data.to(device)
            if m.grad is not None:
                m.grad = m.grad.to(device)

    def nbytes(self) -> int:
        """Bytes of the masters."""
        return sum(m.numel() * m.element_size() for _, m in self._pairs)
