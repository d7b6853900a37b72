"""Supervised fine-tuning: maximise the likelihood of reference responses.

One step = one optimizer step of the policy on the step's records (the backend splits the
batch into micro-batches by token budget and accumulates). Only response tokens carry loss
(token-weight convention, see ``rlweave.algo_helpers.weights``).

Evaluation is held-out exact match: greedy answers from a ``rollout`` role when the config
asks for one (``eval_rollout: true``; the policy's weights are synced to it first), else
from a copy of the policy saved in Hugging Face format and decoded in this process.
A sample is scored with the run's rewards when configured, otherwise by comparing the
answer with the record's ``response`` (or ``answer``) text.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from typing import Any

import torch

from rlweave.algo_helpers.evaluate import exact_match
from rlweave.algo_helpers.weights import token_weights
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm
from rlweave.residency import EVAL_PHASES, Residency
from rlweave_algo_sft.config import SFTConfig
from rlweave_algo_sft.data import encode_record, expand_images
from rlweave_algo_sft.loss import SFTLoss

log = logging.getLogger(__name__)


def _reference_match(prompt: str, response: str, **fields: Any) -> float:
    """1.0 when the answer equals the record's reference text (whitespace-trimmed)."""
    ref = fields.get("answer", fields.get("reference"))
    return 1.0 if ref is not None and response.strip() == str(ref).strip() else 0.0


class SFT(Algorithm):
    def __init__(self, config: Any, ctx):
        if not isinstance(config, SFTConfig):
            config = SFTConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        self.steps_done = 0
        self.tokens_seen = 0
        self.loss_agg = resolve("loss_agg", self.config.loss_agg)  # the aggregation's weights, every step
        self.residency = Residency.for_run(ctx, ("policy", "rollout"), EVAL_PHASES)

    def setup(self) -> None:
        """A rollout role used only for evaluation sleeps while the policy trains (when they
        share devices)."""
        self.residency.enter("rest")

    def build_batch(self, records: list[dict[str, Any]]) -> Batch:
        """Encode records into a packed batch with ``loss_mask`` and ``token_weight``."""
        c = self.config
        seqs, masks, ids, meta, mms = [], [], [], [], []
        vision = getattr(self.ctx, "vision", None)
        for i, r in enumerate(records):
            s, m = encode_record(self.ctx.tokenizer, r, c.append_eos)
            mm = None
            if r.get("images"):
                s, m, mm = expand_images(vision, r, s, m)
            if len(s) > c.max_length:
                log.warning("sft: record %s has %d tokens > max_length %d; skipped",
                            r.get("id", i), len(s), c.max_length)
                continue
            if len(s) < 2:
                continue
            seqs.append(s)
            masks.append(m)
            ids.append(str(r.get("id", i)))
            meta.append({})
            mms.append(mm)
        if not seqs:
            raise ValueError("sft: no usable record in this batch (all too long or empty)")
        batch = Batch.from_sequences(seqs, ids=ids, meta=meta)
        batch.set_mm(mms)
        mask = torch.tensor([x for m in masks for x in m], dtype=torch.float32)
        if c.train_on_prompt:
            mask = torch.ones_like(mask)
        mask[batch.cu_seqlens[:-1]] = 0.0  # the first token of a sample is never predicted
        batch.token["loss_mask"] = mask
        batch.add_token("token_weight", token_weights(batch, self.loss_agg))
        return batch

    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = self.build_batch(records)
        out = self.ctx.roles["policy"].train(batch, SFTLoss()).result()
        self.steps_done += 1
        trained = int(batch.token["loss_mask"].sum())
        self.tokens_seen += trained
        metrics = {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}
        metrics.update({"response_tokens": float(trained), "samples": float(len(batch)),
                        "time/train": time.perf_counter() - t0})
        return metrics

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        c = self.config
        reward = self.ctx.rewards if self.ctx.rewards is not None else _reference_match
        recs = [r if "answer" in r or "response" not in r else {**r, "answer": r["response"]} for r in records]
        if "rollout" in self.ctx.roles:
            self.residency.enter("sync")
            self.ctx.weight_sync.sync("policy", "rollout")
            return self.residency.during("eval", exact_match, self.ctx.roles["rollout"], self.ctx.tokenizer, recs,
                                         reward, c.eval_max_new_tokens, c.eval_threshold,
                                         vision=getattr(self.ctx, "vision", None))
        from rlweave.algo_helpers.local_generate import LocalHFGenerator

        tmp = tempfile.mkdtemp(prefix="eval_hf_", dir=str(self.ctx.run_dir))
        try:
            self.ctx.roles["policy"].save_hf(tmp).result()
            gen = LocalHFGenerator(tmp)
            return exact_match(gen, self.ctx.tokenizer, recs, reward, c.eval_max_new_tokens, c.eval_threshold,
                               vision=getattr(self.ctx, "vision", None))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.tokens_seen = int(state.get("tokens_seen", 0))
