"""Reference computations on plain transformers, for contract and consistency tests.

Everything here is the slow obvious way on purpose: engines are checked against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def load_reference_model(model_dir: str | Path, state: Mapping[str, Any] | None = None, dtype: str = "float32"):
    """``AutoModelForCausalLM`` from ``model_dir`` in eval mode on CPU, with ``state``
    (HF names -> tensors) copied over the loaded weights when given."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig()
    if state is not None:
        missing, unexpected = model.load_state_dict(dict(state), strict=False)
        if unexpected:
            raise ValueError(f"reference model: unexpected tensors {unexpected}")
    return model


def reference_greedy(model, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by transformers ``generate`` (no EOS stop: exactly
    ``max_new_tokens`` tokens)."""
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                          eos_token_id=None, pad_token_id=0, num_beams=1)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([list(prompt)]), generation_config=gc)
    return out[0, len(prompt):].tolist()


def reference_logprobs(model, prompt: Sequence[int], response: Sequence[int], temperature: float = 1.0):
    """``(len(response),)`` float32 tensor: ``log_softmax(logits / T)`` of each response token
    given everything before it, one full forward pass (``T = 0`` means 1)."""
    import torch

    ids = torch.tensor([list(prompt) + list(response)])
    t = temperature if temperature > 0 else 1.0
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    pred = logits[len(prompt) - 1 : ids.shape[1] - 1] / t
    return torch.log_softmax(pred, dim=-1).gather(-1, torch.tensor(list(response))[:, None]).squeeze(-1)
