"""A minimal in-process generator on transformers, for evaluating a model when a run has no
rollout role (SFT, DPO): the policy is saved in Hugging Face format and decoded here.

It follows the ``generate(prompts, params) -> list[list[Generation]]`` shape of a rollout
engine, but returns the list directly (no future). Prompts of equal length are decoded
together with a KV cache (no padding, so results equal one-at-a-time decoding). A
vision-language model decodes :class:`~rlweave.interfaces.engine.VisionPrompt` prompts with their
images.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rlweave.interfaces.engine import Generation, SamplingParams


class LocalHFGenerator:
    """Greedy or sampled decoding with a transformers causal LM loaded from ``path``."""

    def __init__(self, path: str, dtype: str = "float32", max_batch: int = 128):
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from rlweave.data.vision import is_vision_model

        auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
        self.model = auto.from_pretrained(path, dtype=getattr(torch, dtype))
        self.model.eval()
        self.max_batch = max_batch

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        import torch

        gen = torch.Generator().manual_seed(params.seed or 0)
        by_len: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(prompts):
            by_len[len(p)].extend([i] * params.n)
        out: list[list[Generation]] = [[] for _ in prompts]
        with torch.no_grad():
            for _, idx in sorted(by_len.items()):
                for s in range(0, len(idx), self.max_batch):
                    chunk = idx[s : s + self.max_batch]
                    for i, g in zip(chunk, self._batch([prompts[i] for i in chunk], params, gen)):
                        out[i].append(g)
        return out

    def _batch(self, prompts: list[list[int]], params: SamplingParams, gen: Any) -> list[Generation]:
        import torch

        from rlweave.engine_helpers.vision import image_inputs
        from rlweave.interfaces.engine import prompt_images

        stops = torch.tensor(sorted(set(params.stop_token_ids)) or [-1])
        n = len(prompts)
        inp = torch.tensor([list(p) for p in prompts])
        past = None
        extra = image_inputs(self.model, [prompt_images(p) for p in prompts], inp, "in-process evaluation")
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        done = torch.zeros(n, dtype=torch.bool)
        for _ in range(params.max_new_tokens):
            o = self.model(input_ids=inp, past_key_values=past, use_cache=True, **extra)
            past, extra = o.past_key_values, {}
            logits = o.logits[:, -1].float()
            if params.temperature <= 0:
                logp = torch.log_softmax(logits, -1)
                nxt = logp.argmax(-1)
            else:
                logp = torch.log_softmax(logits / params.temperature, -1)
                nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
            for r in range(n):
                if not done[r]:
                    toks[r].append(int(nxt[r]))
                    lps[r].append(float(lp[r]))
            if not params.ignore_eos:
                done |= torch.isin(nxt, stops)
                if bool(done.all()):
                    break
            inp = nxt[:, None]
        return [
            Generation(token_ids=t, logprobs=lp, finish_reason="stop" if t and t[-1] in params.stop_token_ids
                       and not params.ignore_eos else "length")
            for t, lp in zip(toks, lps)
        ]
