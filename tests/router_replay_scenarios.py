"""Router replay scenarios (one rank, see :func:`rlweave.testing.ranks.run_ranks`): the real FSDP
worker on a tiny Qwen3-MoE, the real HF engine recording its routing."""

from __future__ import annotations

import torch

from rlweave.backend_helpers.router_replay import CHANGED
from rlweave.testing import scenarios as sc

OPTIM = {"lr": 1e-3, "grad_clip": 1.0, "eps": 1e-5}
ROUTERS = ("model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight")


def _worker(ctx_kw, path, **cfg):
    cfg.setdefault("max_tokens_per_micro_batch", 30)  # several micro-batches of the batches below
    return sc.train_worker("fsdp", ctx_kw, {"path": path, "dtype": "float32", "model_type": "causal_lm"}, OPTIM,
                           None, **cfg)


def _foreign(own: torch.Tensor, experts: int) -> torch.Tensor:
    """Routing that differs from ``own`` on every token (each index shifted by one expert)."""
    return ((own.long() + 1) % experts).to(own.dtype)


def replay_scenario(ctx_kw: dict, path: str, experts: int) -> dict:
    """Per layout (packed, padded, shared prompts; activation checkpointing on): the experts the
    passes chose when given a foreign routing, and the gradients of a train step under it."""
    out = {}
    for name, cfg in {"packed": {}, "padded": {"use_packing": False},
                      "shared": {"share_prompts": True, "activation_checkpointing": True}}.items():
        w = _worker(ctx_kw, path, **cfg)
        batch = sc.group_batch()
        own = w.compute_logprobs(batch, with_routing=True)
        given = _foreign(own["routing"], experts)
        b = batch.shallow_copy()
        b.add_token("routing", given)
        rep = w.compute_logprobs(b, with_routing=True)
        again = w.compute_logprobs(batch)  # no field: the router chooses again
        wlp = sc.TemperedLogprobSum(1.0)
        train_lp = float((b.token["token_weight"] * rep["logprobs"]).sum())
        metrics = w.train_step(b, wlp)  # the training forward, on the weights of the passes above
        _, grads = sc.train_step_with_grads(w, b, sc.nll_loss)
        unreplayed = w.train_step(batch, wlp)  # no routing field: the routers choose
        out[name] = {"changed": metrics.get(CHANGED, "absent"), "changed_unreplayed": unreplayed.get(CHANGED, "absent"),
                     "own": own["routing"], "given": given, "chosen": rep["routing"], "lp_own": own["logprobs"],
                     "lp_replay": rep["logprobs"], "lp_again": again["logprobs"],
                     "router_grads": [float(grads[r].abs().sum()) for r in ROUTERS],
                     "wlp_pass": train_lp, "wlp_train": metrics["wlp"]}
        w.router.remove()
    return out


def r3_scenario(ctx_kw: dict, path: str, prompts: list, new_tokens: int) -> dict:
    """The HF engine in bfloat16 samples with routing recorded; the fp32 trainer's log-probs of those
    samples without and with the engine's routing replayed, and the experts it chose."""
    from rlweave.algo_helpers.rollout import generations_to_batch
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_hf.engine import HFEngine

    engine = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 128},
                                    model={"path": path, "dtype": "bfloat16"}, seed=1))
    engine.init_engine()
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=new_tokens, seed=7, return_routing=True)
    gens = engine.generate(prompts, params)
    batch = generations_to_batch(prompts, gens, [str(i) for i in range(len(prompts))], [{} for _ in prompts])
    w = _worker(ctx_kw, path)
    plain = batch.shallow_copy()
    plain.token.pop("routing")
    free = w.compute_logprobs(plain, with_routing=True)
    replayed = w.compute_logprobs(batch, with_routing=True)
    return {"engine": batch.token["routing"], "free": free["routing"], "chosen": replayed["routing"],
            "lp_free": free["logprobs"], "lp_replay": replayed["logprobs"],
            "rollout": batch.token["rollout_logprobs"], "mask": batch.token["loss_mask"],
            "cu": batch.cu_seqlens}
