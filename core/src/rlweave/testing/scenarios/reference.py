"""Single-process transformers references for the scenario batches: what a backend's
per-sample outputs and gradients must equal, whatever its ranks and sharding. (The engine
suites' references, one prompt and response at a time, are :mod:`rlweave.testing.reference`.)"""

from __future__ import annotations

from typing import Any

from rlweave.testing.scenarios.batches import fixed_batch


def reference_logprobs(model_dir: str, device: str = "cpu") -> dict[int, Any]:
    """Each sample of :func:`fixed_batch` alone through the HF model at ``model_dir`` (fp32):
    ``{sample index: log p of its tokens}`` (0 at the first token), on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    return {i: sample_logprobs(m, s, device) for i, s in enumerate(fixed_batch().sequences("input_ids"))}


def sample_logprobs(m, s, device: str):
    """Log-probs of the tokens of the 1-D sequence ``s`` under the HF model ``m`` (0 at the
    first token), on CPU."""
    import torch

    with torch.no_grad():
        logits = m(s.view(1, -1).to(device)).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, s[1:].view(-1, 1).to(device)).squeeze(-1)
    return torch.cat([lp.new_zeros(1), lp]).cpu()


def reference_grad_norm(model_dir: str) -> tuple[float, float]:
    """Loss and grad norm of :func:`fixed_batch`'s token-weighted NLL on one unsharded model."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    b = fixed_batch()
    loss = 0.0
    for s, w in zip(b.sequences("input_ids"), b.sequences("token_weight")):
        logits = m(s.view(1, -1)).logits[0]
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, s[1:].view(-1, 1)).squeeze(-1)
        loss = loss - (w[1:] * lp).sum()
    loss.backward()
    norm = torch.sqrt(sum((p.grad**2).sum() for p in m.parameters() if p.grad is not None))
    return float(loss.detach()), float(norm)
