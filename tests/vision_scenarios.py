"""Vision-language scenarios (see :func:`rlweave.testing.ranks.run_ranks`): the real FSDP worker and
the real HF engine on a tiny random Qwen2-VL, prompts with zero, one and two images."""

from __future__ import annotations

import numpy as np
import torch

from rlweave.testing import scenarios as sc

OPTIM = {"lr": 1e-2, "grad_clip": 1.0}
#: the responses of the sequence-parallel scenario
SP_RESPONSES = [[5, 6, 7], [8, 9], [10, 11, 12]]
#: (prompt text with placeholders, image sizes (height, width))
PROMPTS = (
    ("look <|vision_start|><|image_pad|><|vision_end|> color:", [(32, 24)]),
    ("no image here:", []),
    ("two <|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|image_pad|><|vision_end|>?",
     [(20, 30), (40, 40)]),
)


def build_model(path: str) -> str:
    from rlweave.testing.tiny_vlm import build_tiny_qwen2_vl, vision_tokenizer

    return str(build_tiny_qwen2_vl(path, vision_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 ?:."])))


def image(h: int, w: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8"))


def prompts(path: str, seed: int = 0, changed: int | None = None) -> list:
    """The :data:`PROMPTS` as engine prompts (images drawn from ``seed``; prompt ``changed`` gets
    other images)."""
    from rlweave.data.vision import VisionProcessor
    from rlweave.interfaces.engine import VisionPrompt

    vp = VisionProcessor(path)
    out = []
    for i, (text, sizes) in enumerate(PROMPTS):
        imgs = [image(h, w, seed * 100 + i * 10 + k + (50 if i == changed else 0)) for k, (h, w) in enumerate(sizes)]
        ids, mm = vp.encode(text, imgs)
        out.append(VisionPrompt(ids, mm) if mm is not None else ids)
    return out


def batch_of(ps: list, responses: list[list[int]]):
    """A training batch of prompt + response per prompt, the loss on the responses."""
    from rlweave.data.batch import Batch
    from rlweave.interfaces.engine import prompt_images

    b = Batch.from_sequences([list(p) + r for p, r in zip(ps, responses)], prompt_lens=[len(p) for p in ps])
    b.set_mm([prompt_images(p) for p in ps])
    b.add_token("token_weight", b.token["loss_mask"] / b.token["loss_mask"].sum())
    return b


def reference(path: str, b) -> torch.Tensor:
    """transformers' log-probs of every token of ``b``, one sample per forward (no packing)."""
    from transformers import AutoModelForImageTextToText

    m = AutoModelForImageTextToText.from_pretrained(path).eval()
    out = []
    for i, s in enumerate(b.sequences()):
        mm = b.mm[i] if b.mm else None
        kw = {} if mm is None else {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"],
                                    "mm_token_type_ids": (s[None] == m.config.image_token_id).int()}
        with torch.no_grad():
            logits = m(input_ids=s[None], **kw).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, s[1:, None])[:, 0]
        out.append(torch.cat([torch.zeros(1), lp]))
    return torch.cat(out)


def engine_and_trainer(ctx_kw: dict, path: str) -> dict:
    """The HF engine samples from the image prompts; the FSDP worker's log-probs of what it sampled,
    packed and one sample at a time, beside transformers' and the engine's; then with prompt 2's
    images changed."""
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_hf.engine import HFEngine

    engine = HFEngine(WorkerContext(role="rollout", rank=0, world_size=1, options={}, model={"path": path}, seed=0,
                                    device=ctx_kw.get("device", "cpu")))
    engine.init_engine()
    ps = prompts(path)
    gens = [g[0] for g in engine.generate(ps, SamplingParams(n=1, temperature=1.0, max_new_tokens=6, seed=3))]
    b = batch_of(ps, [g.token_ids for g in gens])
    w = sc.train_worker("fsdp", ctx_kw, {"path": path}, OPTIM)
    packed = w.compute_logprobs(b)["logprobs"]
    alone = torch.cat([w.compute_logprobs(b.select([i]))["logprobs"] for i in range(len(b))])
    other = batch_of(prompts(path, changed=2), [g.token_ids for g in gens])
    engine_lp = torch.zeros(b.num_tokens)
    for i, g in enumerate(gens):
        end = int(b.cu_seqlens[i + 1])
        engine_lp[end - len(g.logprobs):end] = torch.tensor(g.logprobs)
    return {"packed": packed, "alone": alone, "reference": reference(path, b), "engine": engine_lp,
            "mask": b.token["loss_mask"], "cu": b.cu_seqlens, "changed": w.compute_logprobs(other)["logprobs"],
            "sampled": [g.token_ids for g in gens], "trained": [s[len(p):].tolist() for s, p in zip(b.sequences(), ps)]}


def two_ranks_frozen(ctx_kw: dict, path: str, backend: str = "fsdp", options: dict | None = None) -> dict:
    """Two ranks of ``backend``, the vision tower frozen: rank 0 trains the image samples, rank 1
    only the text-only one (its micro-batch has no image). What the step changed, what the
    optimizer holds, what the weight sync would send."""
    w = sc.train_worker(backend, ctx_kw, {"path": path}, OPTIM, freeze_vision_tower=True, **(options or {}))
    ps = prompts(path)
    b = batch_of(ps, [[5, 6, 7], [8, 9], [10, 11, 12]])
    full = dict(_full_params(w))
    metrics = w.train_step(b.select([0, 2] if ctx_kw["rank"] == 0 else [1]), sc.nll_loss)
    after = dict(_full_params(w))
    # the FSDP optimizer holds the parameters themselves (DeepSpeed's holds flat partitions)
    in_optim = {id(p) for g in w.optimizer.param_groups for p in g["params"]} if backend == "fsdp" else None
    synced = [n for n, _ in w.named_weights()]
    if ctx_kw["rank"] != 0:
        return {}
    tower = sorted(n for n in full if ".visual." in f".{n}")
    return {"loss": metrics["loss"], "tower": tower,
            "tower_same": all(torch.equal(full[n], after[n]) for n in tower),
            "text_changed": any(not torch.equal(full[n], after[n]) for n in full if n not in tower),
            "tower_in_optim": in_optim is not None and any(id(p) in in_optim for n, p in w.model.named_parameters()
                                                           if n in tower),
            "text_in_optim": in_optim is None or all(id(p) in in_optim for n, p in w.model.named_parameters()
                                                     if n not in tower),
            "synced_tower": [n for n in synced if ".visual." in f".{n}"], "synced": len(synced)}


def _full_params(w):
    from torch.distributed.tensor import DTensor

    if w.backend == "deepspeed":
        yield from ((n, t.clone()) for n, t in w._stream())  # every parameter, gathered (rank 0 yields)
        return
    for n, p in w.model.named_parameters():
        yield n, (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()


def sp_logprobs(ctx_kw: dict, path: str) -> dict:
    """Log-probs of the image prompts with fixed responses, and one train step's loss, on the ranks'
    sequence-parallel group (``world_size`` ranks, ``parallel.sp`` = ``world_size``); the row of the
    first sample alone has its image cut by the middle of the row."""
    world = ctx_kw["world_size"]
    w = sc.train_worker("fsdp", ctx_kw, {"path": path}, OPTIM, {"sp": world} if world > 1 else None)
    b = batch_of(prompts(path), SP_RESPONSES)
    two = b.select([0])
    ids = two.token["input_ids"]
    image = (ids == w._base_model().config.image_token_id).nonzero().view(-1).tolist()
    lp = {"all": w.compute_logprobs(b)["logprobs"], "two": w.compute_logprobs(two)["logprobs"]}
    metrics = w.train_step(b, sc.nll_loss)
    return {**lp, "middle": len(ids) // 2, "image_tokens": image, "loss": metrics["loss"]}


def lora_step(ctx_kw: dict, path: str) -> dict:
    """One LoRA (``all-linear``) train step of the FSDP worker on the image prompts: which modules got
    adapters, whether the step trained, whether the base weights stayed."""
    lora = {"r": 4, "alpha": 8, "target_modules": "all-linear"}
    w = sc.train_worker("fsdp", {**ctx_kw, "lora": lora}, {"path": path}, OPTIM)
    b = batch_of(prompts(path), [[5, 6, 7], [8, 9], [10, 11, 12]])
    before = w.compute_logprobs(b)["logprobs"]
    metrics = w.train_step(b, sc.nll_loss)
    adapted = sorted({n.split(".lora_A")[0] for n, _ in w.model.named_parameters() if ".lora_A" in n})
    after = w.compute_logprobs(b)["logprobs"]
    return {"loss": metrics["loss"], "adapted": adapted, "moved": not torch.equal(before, after),
            "base": w.compute_logprobs(b, adapters=False)["logprobs"], "before": before}
