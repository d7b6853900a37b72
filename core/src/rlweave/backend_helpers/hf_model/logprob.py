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

With ``compiled`` (the backend's ``compile`` option, CPU), the entropy forward and the
backward are inductor kernels over all rows instead of eager chunk loops; they too read the
logits once per pass and never hold fp32 ``(R, V)`` tensors (faster than the eager chunks on
CPU: bench/RESULTS.md).
"""

from __future__ import annotations

import torch

from rlweave.backend_helpers.hf_model import inductor

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


def _stats_math(logits: torch.Tensor, inv_temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: log-sum-exp and entropy of ``softmax(logits * inv_temp)``, fp32."""
    z = logits.float() * inv_temp
    m = z.amax(-1, keepdim=True)
    e = torch.exp(z - m)
    total = e.sum(-1, keepdim=True)
    lse = (m + torch.log(total)).squeeze(-1)
    return lse, lse - (e * z).sum(-1) / total.squeeze(-1)


def _grad_math(logits, lse, ent, g_row, ge_row, hot_col, hot_grad, inv_temp: float, entropy: bool):
    """Gradient to ``logits`` (their dtype): ``-g_row * p`` per row, the entropy term when
    ``entropy``, plus ``hot_grad[r]`` at column ``hot_col[r]`` (-1: none) of each row."""
    z = logits.float() * inv_temp
    p = torch.exp(z - lse[:, None])
    coef = -g_row[:, None]
    if entropy:
        coef = coef - ge_row[:, None] * (z - lse[:, None] + ent[:, None])
    cols = torch.arange(z.shape[1], device=z.device)
    gz = p * coef + torch.where(cols[None, :] == hot_col[:, None], hot_grad[:, None], 0.0)
    return (gz * inv_temp).to(logits.dtype)


def _row_sum(rows: torch.Tensor, g: torch.Tensor | None, n_rows: int) -> torch.Tensor:
    """Per row, the summed upstream gradients ``g`` of the tokens reading it (zeros: no ``g``)."""
    out = torch.zeros(n_rows, dtype=torch.float32, device=rows.device)
    if g is not None:
        out.index_add_(0, rows, g.float())
    return out


class _SelectedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, rows, targets, inv_temp: float, with_entropy: bool, chunk_elements: int,
                compiled: bool = False):
        ctx.set_materialize_grads(False)
        ctx.compiled = compiled
        n_rows, vocab = logits.shape
        if compiled and with_entropy:  # lse alone: the eager chunks are as fast as inductor's kernel
            lse, ent = inductor.compiled(_stats_math)(logits, inv_temp)
        else:
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
            return None, None, None, None, None, None, None
        if ctx.compiled:
            return (_compiled_backward(ctx, logits, rows, targets, lse, ent, g_lp, g_ent),
                    None, None, None, None, None, None)
        n_rows, vocab = logits.shape
        inv_temp = ctx.inv_temp
        g_row = _row_sum(rows, g_lp, n_rows)
        ge_row = _row_sum(rows, g_ent, n_rows) if g_ent is not None and ctx.with_entropy else None
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
        return grad, None, None, None, None, None, None


def _compiled_backward(ctx, logits, rows, targets, lse, ent, g_lp, g_ent) -> torch.Tensor:
    """The backward as one inductor kernel: each row's first reading token adds its one-hot
    term inside the kernel (fp32, one rounding); further tokens reading the same row (a
    shared prompt's last position) are added afterwards."""
    n_rows = logits.shape[0]
    dev = logits.device
    g_row = _row_sum(rows, g_lp, n_rows)
    hot_col = torch.full((n_rows,), -1, dtype=torch.long, device=dev)
    hot_grad = torch.zeros(n_rows, dtype=torch.float32, device=dev)
    extra = None
    if g_lp is not None:
        g = g_lp.float()
        order = torch.argsort(rows, stable=True)
        srt = rows[order]
        first = torch.ones_like(srt, dtype=torch.bool)
        first[1:] = srt[1:] != srt[:-1]
        lead = order[first]
        hot_col[rows[lead]] = targets[lead]
        hot_grad[rows[lead]] = g[lead]
        extra = order[~first]
    entropy = g_ent is not None and ctx.with_entropy
    ge_row = _row_sum(rows, g_ent if entropy else None, n_rows)
    grad = inductor.compiled(_grad_math)(logits, lse, ent, g_row, ge_row, hot_col, hot_grad, ctx.inv_temp, entropy)
    if extra is not None and extra.numel():
        grad.index_put_((rows[extra], targets[extra]), (g_lp[extra].float() * ctx.inv_temp).to(grad.dtype),
                        accumulate=True)
    return grad


def selected_logprobs(
    logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
    with_entropy: bool = False, chunk_elements: int | None = None, compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``(R, V)`` any float dtype; ``rows``, ``targets`` ``(T,)`` long. Returns
    ``(logprobs (T,), entropy (T,) or None)`` float32 (see module docstring; ``compiled``:
    inductor kernels for the entropy forward and the backward)."""
    if logits.dim() != 2:
        raise ValueError(f"selected_logprobs: logits must be (rows, vocab), got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"selected_logprobs: temperature must be > 0, got {temperature}")
    if chunk_elements is None:
        chunk_elements = GPU_CHUNK if logits.is_cuda else CPU_CHUNK
    return _SelectedLogprobs.apply(logits, rows, targets, 1.0 / float(temperature), bool(with_entropy),
                                   int(chunk_elements), bool(compiled))
