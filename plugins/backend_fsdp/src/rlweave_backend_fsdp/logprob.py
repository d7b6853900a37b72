"""Log-probabilities and entropy straight from a model's logits, chunked over rows.

``selected_logprobs(logits, rows, targets, temperature)`` returns, for each token ``t``,
``log softmax(logits[rows[t]] / temperature)[targets[t]]`` and the entropy of that row's
distribution, both float32, with gradients to ``logits``. Several tokens may read the same
row (a shared prompt's last position predicts the first response token of every sample).

Unlike ``log_softmax`` on the whole ``(T, V)`` matrix, it never materialises fp32 logits,
log-probs or their gradient: rows are processed in chunks of about ``chunk_elements``
values (cache-sized on CPU), the forward keeps only each row's log-sum-exp, and the
backward recomputes the softmax chunk by chunk, writing the gradient in the logits' dtype.
Same values as the unchunked fp32 computation up to float rounding.
"""

from __future__ import annotations

import torch

#: values per chunk: ~1 MiB of fp32 on CPU (fits a core's L2), 64 MiB on GPU (few launches)
CPU_CHUNK = 1 << 18
GPU_CHUNK = 1 << 24


def _bounds(n_rows: int, vocab: int, chunk_elements: int) -> list[tuple[int, int]]:
    step = max(1, chunk_elements // max(vocab, 1))
    return [(s, min(s + step, n_rows)) for s in range(0, n_rows, step)]


def _scaled(chunk: torch.Tensor, inv_temp: float) -> torch.Tensor:
    """fp32 ``chunk * inv_temp`` (never writes into ``chunk``: ``float()`` of fp32 is no copy)."""
    z = chunk.float()
    return z * inv_temp if inv_temp != 1.0 else z


class _SelectedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, rows, targets, inv_temp: float, with_entropy: bool, chunk_elements: int):
        ctx.set_materialize_grads(False)
        n_rows, vocab = logits.shape
        lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        ent = torch.empty(n_rows, dtype=torch.float32, device=logits.device) if with_entropy else None
        for s, e in _bounds(n_rows, vocab, chunk_elements):
            z = _scaled(logits[s:e], inv_temp)
            m = torch.logsumexp(z, dim=-1)
            lse[s:e] = m
            if ent is not None:  # H = lse - sum_v p_v z_v
                p = (z - m[:, None]).exp_()
                ent[s:e] = m - (p * z).sum(-1)
        picked = logits[rows, targets].float()
        if inv_temp != 1.0:
            picked = picked * inv_temp
        lp = picked - lse[rows]
        ctx.save_for_backward(logits, rows, targets, lse, ent if ent is not None else lse)
        ctx.inv_temp, ctx.chunk_elements, ctx.with_entropy = inv_temp, chunk_elements, with_entropy
        return lp, (ent[rows] if ent is not None else None)

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, rows, targets, lse, ent = ctx.saved_tensors
        if g_lp is None and g_ent is None:
            return None, None, None, None, None, None
        n_rows, vocab = logits.shape
        inv_temp = ctx.inv_temp
        # per row: the summed upstream gradients of the tokens reading it
        g_row = torch.zeros(n_rows, dtype=torch.float32, device=logits.device)
        if g_lp is not None:
            g_row.index_add_(0, rows, g_lp.float())
        ge_row = None
        if g_ent is not None and ctx.with_entropy:
            ge_row = torch.zeros(n_rows, dtype=torch.float32, device=logits.device)
            ge_row.index_add_(0, rows, g_ent.float())
        # tokens sorted by row, so each chunk finds its one-hot terms by a slice
        order = torch.argsort(rows, stable=True)
        bounds = _bounds(n_rows, vocab, ctx.chunk_elements)
        # where each chunk's tokens start in ``order``: one search (one host sync on GPU) for all chunks
        edges = torch.tensor([s for s, _ in bounds] + [n_rows], device=rows.device)
        cuts = torch.searchsorted(rows[order], edges).tolist()
        grad = torch.empty_like(logits)
        for k, (s, e) in enumerate(bounds):
            z = _scaled(logits[s:e], inv_temp)
            p = (z - lse[s:e, None]).exp_()
            # d lp / dz = onehot(target) - p ;  d H / dz = -p * (z - sum_v p_v z_v) = -p * (z - lse + H)
            coef = -g_row[s:e, None]
            if ge_row is not None:
                coef = coef - ge_row[s:e, None] * (z - lse[s:e, None] + ent[s:e, None])
            gz = p.mul_(coef)
            if g_lp is not None:
                lo, hi = cuts[k], cuts[k + 1]
                if hi > lo:
                    idx = order[lo:hi]
                    gz.index_put_((rows[idx] - s, targets[idx]), g_lp[idx].float(), accumulate=True)
            if inv_temp != 1.0:
                gz.mul_(inv_temp)
            grad[s:e] = gz
        return grad, None, None, None, None, None


def selected_logprobs(
    logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
    with_entropy: bool = False, chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``(R, V)`` any float dtype; ``rows``, ``targets`` ``(T,)`` long. Returns
    ``(logprobs (T,), entropy (T,) or None)`` float32 (see module docstring)."""
    if logits.dim() != 2:
        raise ValueError(f"selected_logprobs: logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"selected_logprobs: temperature must be > 0, got {temperature}")
    if chunk_elements is None:
        chunk_elements = GPU_CHUNK if logits.is_cuda else CPU_CHUNK
    return _SelectedLogprobs.apply(logits, rows, targets, 1.0 / float(temperature), bool(with_entropy),
                                   int(chunk_elements))
