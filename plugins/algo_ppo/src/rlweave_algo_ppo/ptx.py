"""PPO's pre-training (ptx) mix (InstructGPT's PPO-ptx): supervised records added to every policy
mini-batch, their loss weighted by ``ptx_coef`` beside the RL loss."""

from __future__ import annotations

from typing import Any

import torch

from rlweave.algo_helpers.rollout import encode_prompts
from rlweave.data.batch import Batch
from rlweave_algo_ppo.sequences import conform, supervised_batch


class PtxMix:
    """The ptx records of a run (``config``: PPO's; ``seed``: the run's); checkpointed with the
    algorithm (:meth:`state_dict`: the data position)."""

    def __init__(self, config: Any, tokenizer: Any, seed: int, state: dict[str, Any] | None = None):
        from rlweave.data.records import JsonlDataset
        from rlweave.runner.data import DataIterator

        self.tok = tokenizer
        ds = JsonlDataset(config.ptx_data, required=("response",))
        self.records = DataIterator(ds, config.ptx_batch_size, seed=int(seed) + 17, shuffle=True)
        if state:
            self.records.load_state_dict(state)

    def add_to(self, mb: Batch) -> Batch:
        """``mb`` followed by ptx samples: ``ptx_weight`` sums to 1 over the ptx tokens and is 0
        on ``mb``; the ptx samples carry zero ``token_weight``/``advantages`` (no RL term)."""
        rl = Batch(cu_seqlens=mb.cu_seqlens, token={**mb.token, "ptx_weight": torch.zeros(mb.num_tokens)},
                   sample=dict(mb.sample), ids=list(mb.ids), meta=list(mb.meta), mm=list(mb.mm))
        ptx = supervised_batch(self.tok, self.records.next_batch(), encode_prompts)
        m = ptx.token["loss_mask"]
        ptx.add_token("ptx_weight", m / m.sum().clamp(min=1.0))
        return Batch.concat([rl, conform(ptx, rl)])

    def state_dict(self) -> dict[str, Any]:
        return self.records.state_dict()
