"""Helpers for testing grouped experts implementations against each other (used by the kernel
package's tests on CPU and GPU, and by ``bench/moe_experts.py``, which load this file with
:func:`rlweave.testing.helper_modules.import_helper`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Problem:
    """One experts call: inputs that require grad, and the routing."""

    hidden: torch.Tensor         # (T, H)
    top_k_index: torch.Tensor    # (T, k) int64, distinct experts per token
    top_k_weights: torch.Tensor  # (T, k)
    gate_up: torch.Tensor        # (E, 2I, H)
    down: torch.Tensor           # (E, H, I)

    def leaves(self) -> tuple[torch.Tensor, ...]:
        """The tensors gradients are compared on."""
        return self.hidden, self.top_k_weights, self.gate_up, self.down


def make_problem(tokens: int, hidden: int, intermediate: int, experts: int, top_k: int, *,
                 active: int | None = None, uneven: bool = False, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", seed: int = 0) -> Problem:
    """A random experts call. Only the first ``active`` experts (default: all) receive tokens,
    so the others get none; ``uneven`` skews the routing so that expert counts differ a lot.
    Routing weights are a softmax over each token's choices; weights scale with 1/sqrt(fan-in)."""
    active = experts if active is None else active
    if not top_k <= active <= experts:
        raise ValueError(f"need top_k <= active <= experts, got {top_k}, {active}, {experts}")
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, active, generator=g)
    if uneven:  # expert j preferred with weight ~ 1/(j+1)^2
        scores = scores * (1.0 / torch.arange(1, active + 1, dtype=torch.float32) ** 2)
    top_k_index = scores.topk(top_k, dim=1).indices
    logits = torch.randn(tokens, top_k, generator=g)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype).requires_grad_()

    return Problem(
        hidden=leaf(torch.randn(tokens, hidden, generator=g)),
        top_k_index=top_k_index.to(device),
        top_k_weights=leaf(logits.softmax(dim=-1)),
        gate_up=leaf(torch.randn(experts, 2 * intermediate, hidden, generator=g) / hidden ** 0.5),
        down=leaf(torch.randn(experts, hidden, intermediate, generator=g) / intermediate ** 0.5),
    )


def forward_backward(fn: Callable[[Problem], torch.Tensor], problem: Problem, grad: str = "random",
                     seed: int = 1) -> list[torch.Tensor]:
    """``[output, d hidden, d routing weights, d gate_up, d down]`` of ``fn(problem)`` for an
    incoming gradient that is ``"random"`` or all ones from ``y.sum().backward()`` (``"sum"``,
    which hands the backward a zero-stride gradient)."""
    for t in problem.leaves():
        t.grad = None
    y = fn(problem)
    if grad == "sum":
        y.sum().backward()
    else:
        g = torch.Generator().manual_seed(seed)
        y.backward(torch.randn(y.shape, generator=g).to(device=y.device, dtype=y.dtype))
    grads = [t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t) for t in problem.leaves()]
    return [y.detach().clone(), *grads]


NAMES = ("output", "d hidden", "d routing weights", "d gate_up", "d down")


def max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> dict[str, float]:
    """Largest absolute difference per tensor, relative to the largest entry of ``want`` when
    that exceeds 1 (so the bound reads as absolute for values of order one)."""
    out = {}
    for name, a, b in zip(NAMES, got, want):
        scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
        out[name] = (a.float() - b.float()).abs().max().item() / scale if a.numel() else 0.0
    return out
