"""Reward-model training: the second stage of the RLHF pipeline (SFT -> RM -> PPO).

A scalar-head model (the ``policy`` role with ``model_type: reward``, initialised from the
SFT model) learns ``s(prompt, response)`` such that preferred responses score higher:
Bradley-Terry loss ``-log sigmoid(s_c - s_r - m)`` on pairwise records
``{"prompt", "chosen", "rejected"}`` and on ranked records ``{"query", "response": [...],
"score": [...]}`` expanded to all ordered pairs (:mod:`.rm_pairs`).

One step = score every distinct sequence (no grad), BT loss and its gradient per score on
the controller, then one optimizer step with the linearised loss (:mod:`.rm_loss` explains
why this is exact whatever the micro-batching). Evaluation: pairwise accuracy on held-out
pairs. The runner's final ``save_hf`` writes a sequence-classification checkpoint
(``score.weight`` head) that the ``reward`` role (``model_type: reward``) and a PPO critic
(``model_type: value``, head initialised from it) load.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from rlweave.data.batch import Batch
from rlweave.interfaces.algorithm import Algorithm
from rlweave_algo_sft.data import encode_query_response
from rlweave_algo_sft.rm_config import RMConfig
from rlweave_algo_sft.rm_loss import ScoreGradLoss, bt_loss_and_grads, with_score_slot
from rlweave_algo_sft.rm_pairs import Pair, records_to_pairs

log = logging.getLogger(__name__)


def _policy_model_type(cfg: Any) -> str | None:
    try:
        role = cfg.roles["policy"]
        model = role.model if role.model is not None else cfg.model
        return model.model_type
    except (AttributeError, KeyError, TypeError):
        return None


class PairBatch:
    """Pairs encoded as unique sequences: ``batch`` (one sample per distinct prompt+response),
    ``chosen``/``rejected`` sample indices per pair, ``margins``."""

    def __init__(self, batch: Batch, chosen: torch.Tensor, rejected: torch.Tensor, margins: torch.Tensor,
                 seqs: list[list[int]]):
        self.batch, self.chosen, self.rejected, self.margins, self.seqs = batch, chosen, rejected, margins, seqs

    def __len__(self) -> int:
        return int(self.chosen.numel())


class RewardModelTraining(Algorithm):
    """Bradley-Terry reward-model training; see the module docstring."""

    def __init__(self, config: Any, ctx):
        if not isinstance(config, RMConfig):
            config = RMConfig.model_validate(dict(config))
        super().__init__(config, ctx)
        kind = _policy_model_type(ctx.config)
        if kind is not None and kind != "reward":
            raise ValueError(
                f"rm: the policy role must be a reward model; set roles.policy.model.model_type: reward (got {kind!r})"
            )
        self.steps_done = 0
        self.pairs_seen = 0
        self._extra = None
        self._extra_state: dict[str, Any] | None = None

    def setup(self) -> None:
        """Open ``extra_data`` (restoring its position after a resume)."""
        if self.config.extra_data:
            from rlweave.data.records import JsonlDataset
            from rlweave.runner.data import DataIterator

            ds = JsonlDataset(self.config.extra_data)
            self._extra = DataIterator(ds, self.config.extra_batch_size, seed=int(self.ctx.seed) + 29, shuffle=True)
            if self._extra_state:
                self._extra.load_state_dict(self._extra_state)

    # ------------------------------------------------------------------ data
    def encode_pairs(self, pairs: list[Pair]) -> PairBatch:
        """Unique sequences (a response shared by several ranked pairs is scored once)."""
        c = self.config
        index: dict[tuple[str, str], int] = {}
        seqs: list[list[int]] = []
        plens: list[int] = []
        ch, rj, mg = [], [], []
        for p in pairs:
            enc = {}
            for resp in (p.chosen, p.rejected):
                if (p.prompt, resp) not in index:
                    enc[resp] = encode_query_response(self.ctx.tokenizer, p.prompt, resp, c.append_eos)
            if any(len(ids) > c.max_length for ids, _ in enc.values()):
                log.warning("rm: pair from record %s longer than max_length %d; skipped", p.source, c.max_length)
                continue
            for resp, (ids, mask) in enc.items():
                index[(p.prompt, resp)] = len(seqs)
                seqs.append(ids)
                plens.append(max(1, len(mask) - sum(mask)))
            ch.append(index[(p.prompt, p.chosen)])
            rj.append(index[(p.prompt, p.rejected)])
            mg.append(p.margin * c.margin_scale if c.margin != "none" else 0.0)
        if not ch:
            raise ValueError("rm: no usable preference pair in this batch (all too long or empty)")
        ids = [f"rm:{i}" for i in range(len(seqs))]
        batch = Batch.from_sequences(seqs, ids=ids, prompt_lens=plens)
        return PairBatch(batch, torch.tensor(ch), torch.tensor(rj), torch.tensor(mg, dtype=torch.float32), seqs)

    def _pairs(self, records: list[dict[str, Any]]) -> list[Pair]:
        return records_to_pairs(records, margin_from_scores=self.config.margin == "scores")

    # ------------------------------------------------------------------ step
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        policy = self.ctx.roles["policy"]
        t0 = time.perf_counter()
        if self._extra is not None:
            records = list(records) + self._extra.next_batch()
        pb = self.encode_pairs(self._pairs(records))
        scores = policy.scores(pb.batch).result().float()
        t_score = time.perf_counter() - t0
        loss, grads, acc = bt_loss_and_grads(scores, pb.chosen, pb.rejected, pb.margins)
        slot = getattr(self.ctx.tokenizer, "eos_token_id", None) or 0
        tb = Batch.from_sequences(with_score_slot(pb.seqs, slot), ids=pb.batch.ids)
        tb.add_sample("score_grad", grads)
        tb.add_sample("score_weight", torch.full((len(tb),), 1.0 / len(tb)))
        t1 = time.perf_counter()
        out = policy.train(tb, ScoreGradLoss()).result()
        self.steps_done += 1
        self.pairs_seen += len(pb)
        diff = scores[pb.chosen] - scores[pb.rejected]
        return {
            "loss": loss,
            "accuracy": acc,
            "reward_margin": float(diff.mean()),
            "reward/chosen": float(scores[pb.chosen].mean()),
            "reward/rejected": float(scores[pb.rejected].mean()),
            "grad_norm": float(out.get("grad_norm", 0.0)),
            "lr": float(out.get("lr", 0.0)),
            "pairs": float(len(pb)),
            "sequences": float(len(tb)),
            "time/score": t_score,
            "time/train": time.perf_counter() - t1,
        }

    # ------------------------------------------------------------ evaluation
    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Pairwise accuracy (share of held-out pairs with ``s_chosen > s_rejected``), the BT
        loss and the mean score margin. Never trains."""
        t0 = time.perf_counter()
        pairs = self._pairs(records)
        if self.config.eval_max_pairs is not None:
            pairs = pairs[: self.config.eval_max_pairs]
        if not pairs:
            return {}
        pb = self.encode_pairs(pairs)
        scores = self.ctx.roles["policy"].scores(pb.batch).result().float()
        loss, _, acc = bt_loss_and_grads(scores, pb.chosen, pb.rejected, pb.margins)
        diff = scores[pb.chosen] - scores[pb.rejected]
        return {"accuracy": acc, "loss": loss, "reward_margin": float(diff.mean()), "n": float(len(pb)),
                "time_s": time.perf_counter() - t0}

    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done, "pairs_seen": self.pairs_seen,
                "extra": self._extra.state_dict() if self._extra is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.pairs_seen = int(state.get("pairs_seen", 0))
        self._extra_state = state.get("extra")
        if self._extra is not None and self._extra_state:
            self._extra.load_state_dict(self._extra_state)
