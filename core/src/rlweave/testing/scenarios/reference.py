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


def reference_outputs(model_dir: str, batch=None, state: dict | None = None) -> tuple[dict, dict]:
    """``({sample: log-probs}, {sample: entropies})`` of each sample of ``batch`` (default
    :func:`fixed_batch`) alone through the HF model at ``model_dir`` (fp32, with the HF-named
    tensors ``state`` loaded over its weights when given); both 0 at the first token, on CPU."""
    import torch

    from rlweave.testing.reference import load_reference_model

    m = load_reference_model(model_dir, state)
    lps, ents = {}, {}
    with torch.no_grad():
        for i, s in enumerate((fixed_batch() if batch is None else batch).sequences("input_ids")):
            logp = torch.log_softmax(m(s.view(1, -1)).logits[0, :-1].float(), -1)
            lps[i] = torch.cat([logp.new_zeros(1), logp.gather(-1, s[1:].view(-1, 1)).squeeze(-1)])
            ents[i] = torch.cat([logp.new_zeros(1), -(logp.exp() * logp).sum(-1)])
    return lps, ents


def reference_train_step(model_dir: str, optim: dict, batch=None) -> dict[str, Any]:
    """One optimizer step of plain transformers and ``torch.optim.AdamW`` on the token-weighted
    NLL of the whole ``batch`` (default :func:`fixed_batch`) in one process: what a backend's
    ``train_step`` over all its ranks must give. ``optim`` is a ``roles.<role>.optim`` mapping
    (:class:`~rlweave.interfaces.optim.OptimSection`): the learning rate of its schedule's first
    step, gradients clipped to ``grad_clip`` by ``clip_grad_norm_`` (0: not clipped). Returns
    ``loss``, ``grad_norm`` (before clipping), ``lr`` and ``weights`` after the step (the
    model's ``state_dict``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlweave.backend_helpers.schedule import WarmupSchedule
    from rlweave.interfaces.optim import OptimSection

    o = OptimSection(**optim)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    b = fixed_batch() if batch is None else batch
    loss = torch.zeros(())
    for s, w in zip(b.sequences("input_ids"), b.sequences("token_weight")):
        lp = torch.log_softmax(m(s.view(1, -1)).logits[0, :-1], -1).gather(-1, s[1:].view(-1, 1)).squeeze(-1)
        loss = loss - (w[1:] * lp).sum()
    loss.backward()
    params = [p for p in m.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip if o.grad_clip > 0 else float("inf"))
    lr = o.lr * WarmupSchedule(o.warmup_steps, o.schedule, o.total_steps, o.min_lr_ratio)(0)
    torch.optim.AdamW(params, lr=lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay).step()
    return {"loss": float(loss.detach()), "grad_norm": float(norm), "lr": lr,
            "weights": {k: v.detach().clone() for k, v in m.state_dict().items()}}


def reference_heads(heads_dir: str, batch=None) -> tuple[dict, dict]:
    """``({sample: values}, {sample: score})`` of each sample of ``batch`` (default
    :func:`fixed_batch`) alone through transformers' token- and sequence-classification models
    of ``heads_dir`` (one label, ``score.weight`` the head), under the backends' conventions:
    ``values[t]`` is the head at position ``t - 1`` (0 at the first token), the score is the
    head at the last token."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    tok = AutoModelForTokenClassification.from_pretrained(heads_dir, num_labels=1, dtype=torch.float32).eval()
    seq = AutoModelForSequenceClassification.from_pretrained(heads_dir, num_labels=1, dtype=torch.float32).eval()
    values, scores = {}, {}
    with torch.no_grad():
        for i, s in enumerate((fixed_batch() if batch is None else batch).sequences("input_ids")):
            head = tok(s.view(1, -1)).logits[0, :, 0]
            values[i] = torch.cat([head.new_zeros(1), head[:-1]])
            scores[i] = seq(s.view(1, -1)).logits[0, 0]
    return values, scores
