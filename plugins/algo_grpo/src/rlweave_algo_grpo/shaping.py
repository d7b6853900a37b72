"""Reward shaping applied before advantages.

Soft overlong punishment (DAPO): responses that run into the last ``buffer`` tokens before
``max_len`` lose reward linearly, up to ``penalty`` at ``max_len``:
``0`` if ``L <= max_len - buffer``, else ``-penalty * (L - (max_len - buffer)) / buffer``.
"""

from __future__ import annotations

import torch


def overlong_penalty(response_len: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """Non-positive per-sample reward adjustment ``(n,)``; zeros when ``buffer`` is 0."""
    length = response_len.float()
    if buffer <= 0:
        return torch.zeros_like(length)
    over = (length - (max_len - buffer)).clamp(min=0.0, max=float(buffer))
    return -penalty * over / buffer
