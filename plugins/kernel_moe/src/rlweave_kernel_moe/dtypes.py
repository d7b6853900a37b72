"""Which dtype the experts' matmuls run in."""

from __future__ import annotations

import torch


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype of the experts' matmuls: autocast's dtype when autocast is on for the device
    (what ``F.linear`` in the Hugging Face eager loop would use), else the weights' dtype
    (hidden states are cast to it, as transformers' own ``grouped_mm`` path does). The output
    always has the hidden states' dtype."""
    device_type = hidden.device.type
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError):  # older torch, or a device type autocast does not know
        pass
    return weight.dtype
