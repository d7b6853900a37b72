"""Scenario of ``test_multi_turn_training.py`` (run in a spawned rank, see
:func:`rlweave.testing.ranks.run_ranks`): multi-turn episodes sampled by the real HF engine, then
scored and trained by a real FSDP worker; and the environments the multi-turn tests run."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from rlweave.interfaces.environment import Environment, EnvStep


class Countdown(Environment):
    """Answers each model turn with 'left <k>' until three turns were taken, then ends. Each turn
    earns a tenth of its length in characters, so sampled episodes of a group differ in reward."""

    def reset(self, record):
        self.left = 3
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        self.left -= 1
        reward = len(action) / 10
        if self.left == 0:
            return EnvStep(done=True, reward=reward)
        return EnvStep(messages=[{"role": "tool", "content": f"left {self.left}"}], reward=reward,
                       info={"tool_calls": 1})


class Staggered(Countdown):
    """:class:`Countdown` whose episodes of records with an even first digit end after one turn (so
    their groups finish while the others still run)."""

    def reset(self, record):
        messages = super().reset(record)
        self.left = 1 if record["prompt"][0] in "02468" else 3
        return messages


class Marked(Countdown):
    """:class:`Countdown` that appends a line to the file ``$MT_MARKS`` at every step and takes
    0.2 s doing it (so a test can stop a run while its episodes are under way)."""

    def step(self, action):
        time.sleep(0.2)
        with open(os.environ["MT_MARKS"], "a") as f:
            f.write("step\n")
        return super().step(action)


class Failing(Countdown):
    """:class:`Countdown` whose second step raises (a bug in an environment)."""

    def step(self, action):
        if self.left < 3:
            raise ValueError(f"no move after {action!r}")
        return super().step(action)


class Hooked:
    """A loss function that records d loss / d log-prob of every token it sees."""

    def __init__(self, inner):
        self.inner, self.grads = inner, []
        self.temperature, self.needs_entropy = inner.temperature, inner.needs_entropy

    def __call__(self, outputs, mb):
        outputs.logprobs.register_hook(lambda g: self.grads.append((mb.ids, g.detach().clone())))
        return self.inner(outputs, mb)


def scenario(ctx_kw: dict, model_dir: str, engine_name: str) -> dict[str, Any]:
    """Episodes sampled by ``engine_name`` (``hf``: in this process; ``vllm``: its engine core in a
    subprocess, so this rank's process group stays the trainer's), then log-probs and one train
    step of an FSDP worker on them."""
    from rlweave.algo_helpers.multi_turn import MultiTurnRollout, episodes_to_batch
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
    from rlweave.algo_helpers.weights import token_weights
    from rlweave.algo_parts.objective import PolicyObjective
    from rlweave.algo_parts.spec import resolve
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing import scenarios as sc
    from rlweave_infer_hf.engine import HFEngine
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = {"path": model_dir, "dtype": "float32"}
    if engine_name == "vllm":
        from rlweave_infer_vllm.engine import VLLMEngine

        engine = VLLMEngine(WorkerContext(role="rollout", model=model, seed=1, options={
            "max_model_len": 128, "kv_cache_gib": 0.25, "engine_core": "subprocess"}))
    else:
        engine = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 128}, model=model, seed=1))
    engine.init_engine()
    calls: list = []

    def generate(prompts, params):
        gens = engine.generate(prompts, params)
        calls.append(([list(p) for p in prompts], gens))
        return gens

    cfg = MultiTurnConfig.model_validate({"env": {"name": "tools", "args": {"tools": [
        {"name": "c", "target": "rlweave.environments.calculator:calculate"}]}}, "max_turns": 3})
    rollout = MultiTurnRollout(cfg, Countdown, None, tok)
    records = [{"prompt": "12+3=", "id": "a"}, {"prompt": "40-7=", "id": "b"}]
    sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=5, stop_token_ids=[tok.eos_token_id], seed=5)
    try:
        groups = rollout.episodes(records, 2, sampling, generate)
    finally:
        rollout.close()
        engine.shutdown()
    batch = episodes_to_batch(groups, ["a", "b"], [{}, {}])
    w = sc.train_worker("fsdp", ctx_kw, {"path": model_dir, "dtype": "float32"}, {"lr": 1e-3},
                        max_tokens_per_micro_batch=256)
    logprobs = w.compute_logprobs(batch)["logprobs"]
    adv, _ = resolve("advantage", "grpo").load()(
        scores=torch.tensor([1.0, 0.0, 0.5, 0.2]), groups=batch.sample["group"], mask=batch.token["loss_mask"],
        cu_seqlens=batch.cu_seqlens, token_rewards=None, values=None, baseline=None)
    batch.add_token("advantages", adv.float() * batch.token["loss_mask"])
    batch.add_token("token_weight", token_weights(batch, resolve("loss_agg", "token_mean"), max_len=5))
    loss = Hooked(PolicyObjective(policy_loss=resolve("policy_loss", "ppo_clip"), temperature=1.0,
                                  needs_entropy=False))
    metrics = w.train_step(batch, loss)
    w.shutdown()
    return {"batch": batch, "groups": [[(t.prompt_ids, t.ids, t.mask, t.logprobs, t.ended_by, t.stats) for t in g]
                                       for g in groups],
            "calls": calls, "logprobs": logprobs, "grads": loss.grads, "metrics": metrics}
