"""One continuation per sample of ``hint + prompt``; each run appends a line to
$RLW_HINT_ROLLOUT_LOG when set (records, samples, the hint and the first prompt it sent)."""
import dataclasses
import json
import os

import torch

from rlweave.algo_helpers.rollout import encode_records, generations_to_batch
from rlweave.interfaces.rollout import Rollout


class HintedRollout(Rollout):
    def __init__(self, tokenizer, hint):
        self.tok, self.hint = tokenizer, hint

    @classmethod
    def create(cls, ctx):
        return cls(ctx.tokenizer, ctx.args.hint)

    def run(self, records, n, sampling, generate, version=0):
        hinted = [{**r, "prompt": self.hint + r["prompt"]} for r in records]
        prompt_ids, meta = encode_records(self.tok, hinted)
        gens = generate(prompt_ids, dataclasses.replace(sampling, n=n))
        batch = generations_to_batch(prompt_ids, gens, [str(r.get("id", i)) for i, r in enumerate(records)], meta)
        batch.add_sample("env_reward", torch.zeros(len(batch), dtype=torch.float32))
        log = os.environ.get("RLW_HINT_ROLLOUT_LOG")
        if log:
            with open(log, "a") as f:
                f.write(json.dumps({"records": len(records), "samples": len(batch), "hint": self.hint,
                                    "first_prompt": meta[0]["prompt"]}) + "\n")
        return batch
