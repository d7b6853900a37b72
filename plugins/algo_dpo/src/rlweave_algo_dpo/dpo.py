"""DPO: Direct Preference Optimization (Rafailov et al., 2023) on offline preference pairs.

DPO trains the policy so that its implicit reward ``beta * log(pi/pi_ref)`` ranks the chosen
answer above the rejected one, with no reward model and no sampling. Each step: encode the
step's records into adjacent (chosen, rejected) samples, attach the reference model's
sequence log-probs, and take ``mini_batches`` optimizer steps with :class:`DPOLoss`.

Reference log-probs, ``reference_mode``:

* ``precompute`` (default): before the first update the policy itself - still equal to the
  reference (the SFT model) - scores every pair of the training file once; the values are
  cached per pair (keyed by its token ids) in ``<run_dir>/dpo_reference_logps.json``, which
  a resumed run reloads instead of recomputing with trained weights. No reference role.
* ``live``: a ``reference`` role scores each step's batch.

Evaluation generates greedy answers to the held-out prompts and scores them with the run's
rewards: in-process from an HF save of the policy (``eval_with: local``) or with a
``rollout`` role after a weight sync (``eval_with: rollout``).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from rlweave.interfaces.algorithm import Algorithm, RunContext
from rlweave.residency import EVAL_PHASES, Residency
from rlweave_algo_dpo.config import DPOConfig
from rlweave_algo_dpo.evaluation import evaluate_records, local_generator
from rlweave_algo_dpo.pairs import build_pair_batch
from rlweave_algo_dpo.prefs import encode_preferences
from rlweave_algo_dpo.update import make_loss, preference_update, role_seq_logps

CACHE_FILE = "dpo_reference_logps.json"


def pair_key(prompt: list[int], chosen: list[int], rejected: list[int]) -> str:
    """Cache key of a pair: a hash of its token ids (what the log-probs depend on)."""
    return hashlib.sha1(json.dumps([prompt, chosen, rejected]).encode()).hexdigest()


def read_jsonl(path: str) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n + 1}: not valid JSON ({exc.msg})") from exc
    return out


class DPO(Algorithm):
    """Offline DPO (see module docstring)."""

    @classmethod
    def optimizer_steps_per_step(cls, config: Any, role: str) -> int:
        """The policy's ``epochs x mini_batches`` optimizer steps per run step."""
        return int(config.epochs) * int(config.mini_batches)

    def __init__(self, config: Any, ctx: RunContext):
        cfg = config if isinstance(config, DPOConfig) else DPOConfig.model_validate(
            config if isinstance(config, dict) else config.model_dump())
        super().__init__(cfg, ctx)
        self.loss_fn = make_loss(cfg)
        self.ref_cache: dict[str, tuple[float, float]] | None = None
        self.steps = 0
        self.residency = Residency.for_run(ctx, ("policy", "reference", "rollout"), EVAL_PHASES)

    def setup(self) -> None:
        """A rollout role used only for evaluation sleeps while the policy trains (when they
        share devices)."""
        self.residency.enter("rest")

    # ------------------------------------------------------------------ helpers
    @property
    def policy(self) -> Any:
        return self.ctx.roles["policy"]

    def _encode(self, records: list[dict[str, Any]]) -> Any:
        c = self.config
        prompts, chosen, rejected = encode_preferences(records, self.ctx.tokenizer, c.max_prompt_tokens,
                                                       c.max_response_tokens)
        ids = [str(r.get("id", i)) for i, r in enumerate(records)]
        batch = build_pair_batch(prompts, chosen, rejected, ids)
        keys = [pair_key(p, ch, rj) for p, ch, rj in zip(prompts, chosen, rejected)]
        return batch, keys

    def _cache_path(self) -> Path:
        return Path(self.ctx.run_dir) / CACHE_FILE

    def _precompute(self, chunk_pairs: int = 128) -> None:
        """Score every training pair with the (not yet updated) policy; write the cache."""
        train = getattr(getattr(self.ctx.config, "data", None), "train", None)
        if not train:
            raise ValueError("algorithm.reference_mode 'precompute' needs data.train (the preference jsonl)")
        records = read_jsonl(train)
        cache: dict[str, tuple[float, float]] = {}
        for s in range(0, len(records), chunk_pairs):
            batch, keys = self._encode(records[s:s + chunk_pairs])
            seq = role_seq_logps(self.policy, batch, self.config.average_logprobs).view(-1, 2)
            for k, (c, r) in zip(keys, seq.tolist()):
                cache[k] = (c, r)
        path = self._cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(path)
        self.ref_cache = cache

    def _reference(self, batch: Any, keys: list[str]) -> torch.Tensor:
        if self.config.reference_mode == "live":
            return role_seq_logps(self.ctx.roles["reference"], batch, self.config.average_logprobs)
        if self.ref_cache is None:
            self._precompute()
        missing = [batch.ids[2 * i] for i, k in enumerate(keys) if k not in self.ref_cache]
        if missing:
            raise ValueError(f"DPO precomputed reference log-probs miss {len(missing)} pair(s) (e.g. {missing[0]!r}): "
                             f"records not in data.train ({self.ctx.config.data.train}); use reference_mode: live")
        return torch.tensor([v for k in keys for v in self.ref_cache[k]], dtype=torch.float32)

    # ---------------------------------------------------------------- contract
    def step(self, records: list[dict[str, Any]]) -> dict[str, float]:
        t0 = time.perf_counter()
        batch, keys = self._encode(records)
        batch.add_sample("ref_logp", self._reference(batch, keys))
        t_ref = time.perf_counter() - t0
        metrics = preference_update(self.config, self.loss_fn, self.policy, batch, self.ctx.config)
        self.steps += 1
        resp = (batch.seqlens - batch.sample["prompt_len"]).float()
        metrics.update({"pairs": float(len(records)), "time/reference": t_ref,
                        "response_len/chosen": float(resp[0::2].mean()),
                        "response_len/rejected": float(resp[1::2].mean())})
        return metrics

    def evaluate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        if self.config.eval_with == "rollout":
            self.residency.enter("sync")
            self.ctx.weight_sync.sync("policy", "rollout")
            return self.residency.during("eval", evaluate_records, self.ctx, self.config, records,
                                         self.ctx.roles["rollout"])
        else:
            cfg = self.ctx.config
            policy_model = cfg.roles["policy"].model or cfg.model  # the policy's own model section wins
            gen = local_generator(self.policy, self.ctx.run_dir, policy_model.dtype)
        return evaluate_records(self.ctx, self.config, records, gen)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps,
                "ref_cache": str(self._cache_path()) if self.ref_cache is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
        path = state.get("ref_cache")
        if self.config.reference_mode == "precompute" and self.steps > 0:
            if not path or not Path(path).exists():
                raise FileNotFoundError(
                    f"DPO resume: the precomputed reference log-probs ({path or CACHE_FILE}) are missing; they cannot "
                    "be recomputed from a trained policy")
            self.ref_cache = {k: tuple(v) for k, v in json.loads(Path(path).read_text()).items()}
