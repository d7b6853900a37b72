"""The batch that moves between roles: padding-free, packed, with stable sample ids.

Layout (``n`` samples, ``T`` tokens in all):

* ``cu_seqlens``: int64 ``(n + 1,)``, offsets of each sample in the packed token axis.
* ``token[key]``: tensors of shape ``(T, ...)``, one value per token, samples concatenated.
  ``token["input_ids"]`` is always present. Per-token quantities follow the *prediction
  convention*: ``x[t]`` belongs to predicting ``input_ids[t]`` from the tokens before it,
  so the first token of every sample has no prediction (its log-prob is 0 and it is never
  in ``loss_mask``). ``loss_mask`` (float, 1 on trained tokens, usually the response) is the
  mask algorithms and backends use.
* ``sample[key]``: tensors of shape ``(n, ...)``, one value per sample (rewards, scores).
* ``ids``: a stable string id per sample, so nothing is lost or counted twice across
  retries and resumes. ``meta``: a JSON-able dict per sample (prompt text, answer...).
* ``mm``: the vision inputs of each sample (vision-language models), empty when no sample has
  any: then one entry per sample, None or a dict of tensors
  (:data:`rlweave.data.vision.MM_KEYS`: ``pixel_values`` and ``image_grid_thw`` of its images,
  in the order of their tokens). Selecting, splitting and concatenating keep each sample's
  entry with it, so a packed micro-batch's images are its samples' entries in sample order.

Every operation returns a new Batch and preserves sample order unless it says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch


@dataclass
class Batch:
    cu_seqlens: torch.Tensor
    token: dict[str, torch.Tensor] = field(default_factory=dict)
    sample: dict[str, torch.Tensor] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)
    mm: list[dict[str, torch.Tensor] | None] = field(default_factory=list)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_sequences(
        cls,
        sequences: Sequence[Sequence[int]],
        ids: Sequence[str] | None = None,
        meta: Sequence[dict[str, Any]] | None = None,
        prompt_lens: Sequence[int] | None = None,
    ) -> "Batch":
        """Pack token-id sequences. With ``prompt_lens``, ``loss_mask`` is 1 on the
        response tokens (positions ``>= prompt_len``) and the per-sample ``prompt_len``
        is stored; without it, ``loss_mask`` covers every token but the first."""
        lens = [len(s) for s in sequences]
        if any(n == 0 for n in lens):
            raise ValueError("Batch.from_sequences: empty sequence")
        cu = torch.zeros(len(lens) + 1, dtype=torch.long)
        cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.long), 0)
        flat = [t for s in sequences for t in s]
        input_ids = torch.tensor(flat, dtype=torch.long)
        mask = torch.ones(len(flat), dtype=torch.float32)
        mask[cu[:-1]] = 0.0
        b = cls(
            cu_seqlens=cu,
            token={"input_ids": input_ids},
            ids=list(ids) if ids is not None else [str(i) for i in range(len(lens))],
            meta=[dict(m) for m in meta] if meta is not None else [{} for _ in lens],
        )
        if prompt_lens is not None:
            pl = torch.tensor(list(prompt_lens), dtype=torch.long)
            if (pl < 1).any() or (pl > torch.tensor(lens)).any():
                raise ValueError("Batch.from_sequences: prompt_len must be in [1, len(seq)]")
            b.sample["prompt_len"] = pl
            # a token is a prompt token when its position inside its sample is below prompt_len
            b_lens = torch.tensor(lens, dtype=torch.long)
            pos = torch.arange(len(flat)) - torch.repeat_interleave(cu[:-1], b_lens)
            mask[pos < torch.repeat_interleave(pl, b_lens)] = 0.0
        b.token["loss_mask"] = mask
        if len(b.ids) != len(lens) or len(b.meta) != len(lens):
            raise ValueError("Batch.from_sequences: ids/meta length differs from sequences")
        return b

    # ---------------------------------------------------------------- shapes
    def __len__(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def seqlens(self) -> torch.Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    def sequences(self, key: str = "input_ids") -> list[torch.Tensor]:
        """Per-sample views of a token field."""
        t = self.token[key]
        return [t[s:e] for s, e in zip(self.cu_seqlens[:-1].tolist(), self.cu_seqlens[1:].tolist())]

    def add_token(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != self.num_tokens:
            raise ValueError(f"token field {key!r} has {value.shape[0]} rows, batch has {self.num_tokens} tokens")
        self.token[key] = value

    def set_mm(self, mm: Sequence[dict[str, torch.Tensor] | None]) -> None:
        """Set the per-sample vision inputs (one entry per sample; all None clears them)."""
        if len(mm) != len(self):
            raise ValueError(f"{len(mm)} vision entries for a batch of {len(self)} samples")
        self.mm = list(mm) if any(m is not None for m in mm) else []

    @property
    def has_images(self) -> bool:
        return any(m is not None for m in self.mm)

    def add_sample(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != len(self):
            raise ValueError(f"sample field {key!r} has {value.shape[0]} rows, batch has {len(self)} samples")
        self.sample[key] = value

    def sample_index(self) -> torch.Tensor:
        """int64 ``(T,)``: the sample each token belongs to."""
        return torch.repeat_interleave(torch.arange(len(self)), self.seqlens)

    def position_ids(self) -> torch.Tensor:
        """int64 ``(T,)``: position of each token inside its own sample (restarts at 0)."""
        starts = torch.repeat_interleave(self.cu_seqlens[:-1], self.seqlens)
        return torch.arange(self.num_tokens) - starts

    # --------------------------------------------------------------- reshape
    def select(self, indices: Sequence[int] | torch.Tensor) -> "Batch":
        """A new batch with the given samples, in the given order."""
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        lens = self.seqlens[idx]
        cu = torch.zeros(idx.numel() + 1, dtype=torch.long)
        cu[1:] = torch.cumsum(lens, 0)
        # token t of the new batch comes from old position t + (old start - new start) of its sample
        shift = torch.repeat_interleave(self.cu_seqlens[:-1][idx] - cu[:-1], lens)
        tok_idx = torch.arange(int(cu[-1])) + shift
        il = idx.tolist()
        return Batch(
            cu_seqlens=cu,
            token={k: v[tok_idx] for k, v in self.token.items()},
            sample={k: v[idx] for k, v in self.sample.items()},
            ids=[self.ids[i] for i in il],
            meta=[self.meta[i] for i in il],
            mm=[self.mm[i] for i in il] if self.mm else [],
        )

    def shallow_copy(self) -> "Batch":
        """The same samples and tensors in new containers: fields added to or removed from the
        copy do not touch this batch (the tensors themselves are shared, not copied)."""
        return Batch(cu_seqlens=self.cu_seqlens, token=dict(self.token), sample=dict(self.sample),
                     ids=list(self.ids), meta=list(self.meta), mm=list(self.mm))

    def split(self, parts: int) -> list["Batch"]:
        """Split into ``parts`` contiguous chunks of near-equal sample count."""
        n = len(self)
        bounds = [round(i * n / parts) for i in range(parts + 1)]
        return [self.select(range(bounds[i], bounds[i + 1])) for i in range(parts)]

    def balanced_partition(self, parts: int, equal_count: bool = True) -> list[list[int]]:
        """Sample indices for ``parts`` groups with near-equal token totals (greedy,
        longest first). With ``equal_count`` every group gets ``len//parts`` or one more
        samples (data-parallel ranks then run the same number of samples).

        Samples with the same ``group`` sample field (a GRPO prompt's responses, a DPO pair)
        are kept in one part whenever the counts allow, so a backend can pack their shared
        prompt once and a pair's loss stays on one rank; a group that fits in no part whole
        is split over the parts with room left."""
        n = len(self)
        if parts == 1:
            return [list(range(n))]
        lens = self.seqlens.tolist()
        cap = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
        groups: list[list[int]] = [[] for _ in range(parts)]
        load = [0] * parts

        def place(unit: list[int]) -> bool:
            cands = [g for g in range(parts) if not equal_count or len(groups[g]) + len(unit) <= cap[g]]
            if not cands:
                return False
            g = min(cands, key=lambda j: (load[j], j))
            groups[g].extend(unit)
            load[g] += sum(lens[i] for i in unit)
            return True

        for unit in self._partition_units(lens):
            if len(unit) == 1 or not place(unit):
                for i in sorted(unit, key=lambda i: -lens[i]):
                    place([i])
        return [sorted(g) for g in groups]

    def _partition_units(self, lens: list[int]) -> list[list[int]]:
        """Samples grouped by the ``group`` field (each sample alone without one), longest
        total first (ties: first appearance)."""
        if "group" in self.sample:
            by: dict[Any, list[int]] = {}
            for i, g in enumerate(self.sample["group"].reshape(len(self), -1)[:, 0].tolist()):
                by.setdefault(g, []).append(i)
            units = list(by.values())
        else:
            units = [[i] for i in range(len(lens))]
        return sorted(units, key=lambda u: -sum(lens[i] for i in u))

    @staticmethod
    def concat(batches: Iterable["Batch"]) -> "Batch":
        """Concatenate batches with the same fields, in order."""
        bs = list(batches)
        if not bs:
            raise ValueError("Batch.concat of nothing")
        lens = torch.cat([b.seqlens for b in bs])
        cu = torch.zeros(lens.numel() + 1, dtype=torch.long)
        cu[1:] = torch.cumsum(lens, 0)
        keys_t, keys_s = set(bs[0].token), set(bs[0].sample)
        for b in bs[1:]:
            if set(b.token) != keys_t or set(b.sample) != keys_s:
                raise ValueError("Batch.concat: batches have different fields")
        return Batch(
            cu_seqlens=cu,
            token={k: torch.cat([b.token[k] for b in bs]) for k in keys_t},
            sample={k: torch.cat([b.sample[k] for b in bs]) for k in keys_s},
            ids=[i for b in bs for i in b.ids],
            meta=[m for b in bs for m in b.meta],
            mm=[m for b in bs for m in (b.mm or [None] * len(b))] if any(b.mm for b in bs) else [],
        )
