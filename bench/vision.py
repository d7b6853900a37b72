"""GRPO step time on a vision-language model: rlweave vs TRL's GRPOTrainer, side by side.

The model is the vision example's tiny Qwen2-VL (``examples/vision/build_model.py``: random
weights; text hidden 128, 4 layers; vision tower 2 blocks of width 64; a 32x32 image is 16 tokens),
the prompts are ``--prompts`` quadrant records of ``examples/vision/make_data.py`` (one image each),
``--samples`` samples per prompt, exactly ``--new-tokens`` new tokens per sample (EOS ignored on
both sides: equal work), KL beta 0, one optimizer update per batch, temperature 1, fp32, and one
cheap rule reward. Each side runs in its own subprocess (one invocation runs both); the first
``--warmup`` steps are warm-up, the next ``--steps`` are timed.

* ``rlweave/<scheduler>``: ``rlweave train`` of a GRPO config (an FSDP policy, the transformers
  (``hf``) rollout engine, images through ``Batch.mm``), on Ray (``ray``) or with every role in the
  runner's process (``in_process``, ``--schedulers``); a step is the time between two metrics rows.
* ``trl``: ``trl.GRPOTrainer`` with ``use_cpu=True`` (transformers ``generate``), given the same
  images in chat records, with a processor that expands each image's tokens as Qwen2-VL's does
  (:class:`NoVideoProcessor`: transformers' own Qwen2-VL processor also builds a video processor,
  which needs torchvision).

Prints the step time of each side and rlweave's speed-up.

    python bench/vision.py                       # the recorded comparison
    python bench/vision.py --steps 1 --warmup 1  # quick check that both sides run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "examples" / "vision"))
sys.path.insert(0, str(HERE))


def reward(prompt=None, response: str = "", completions=None, **_):
    """The same cheap rule for both sides (rlweave calls it per sample; TRL with a list)."""
    if completions is not None:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(len(t) % 5) / 5.0 for t in texts]
    return float(len(response) % 5) / 5.0


# ---------------------------------------------------------------------------- set-up
def build(root: Path, n_prompts: int) -> tuple[str, list[dict]]:
    """The example's model and ``n_prompts`` quadrant records (image paths absolute)."""
    import build_model
    import make_data

    model = str(build_model.build(root / "model"))
    make_data.write(root / "data", counts={"sft": 1, "rl": n_prompts, "test": 1})
    records = []
    for line in (root / "data" / "quadrant_rl.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["images"] = [str(root / "data" / p) for p in rec["images"]]
        records.append(rec)
    return model, records


# ----------------------------------------------------------------------------- rlweave
def run_rlweave(a) -> dict:
    """``rlweave train`` of a GRPO config over the records (data loading, rendering, rollouts,
    rewards, training and weight sync as a user's run has them); a step's time is the time between
    its metrics row and the previous one."""
    root = Path(a.tmp)
    root.mkdir(parents=True, exist_ok=True)
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in json.loads(a.records)))
    cfg = {"run": {"name": "bench", "output_dir": str(root), "seed": 0, "total_steps": a.steps + a.warmup,
                   "save_every": 0, "log_every": 1, "scheduler": a.scheduler},
           "model": {"path": a.model, "dtype": "float32"},
           "resources": {"pools": {"default": {"devices_per_node": 2}}},
           "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 1e-6}},
                     "rollout": {"engine": "hf", "devices": 1}},
           "algorithm": {"name": "grpo", "n_samples": a.samples, "max_new_tokens": a.new_tokens, "ignore_eos": True,
                         "kl": {"beta": 0.0}, "temperature": 1.0},
           "rewards": [{"name": "vision:reward"}],
           "reward_runtime": {"timeout_s": 60, "workers": 1},
           "data": {"train": str(data), "batch_size": len(json.loads(a.records))}}
    path = root / "grpo.yaml"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, "-m", "rlweave.cli", "train", str(path)], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"rlweave train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (root / "bench" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "response_len/mean" in r]
    stamps = [r["time"] for r in rows]
    steps = [b - a_ for a_, b in zip(stamps, stamps[1:])][a.warmup - 1:] if a.warmup else stamps
    last = rows[-1]
    return {"step_s": sum(steps) / len(steps), "gen_tokens": last["response_len/mean"] * last["samples"]}


# --------------------------------------------------------------------------------- TRL
def no_video_processor(path: str):
    """:class:`NoVideoProcessor` of the model directory ``path``."""
    import warnings

    from transformers import AutoImageProcessor, AutoTokenizer, ProcessorMixin
    from transformers.feature_extraction_utils import BatchFeature

    class NoVideoProcessor(ProcessorMixin):
        """Qwen2-VL's processor for images only: each ``<|image_pad|>`` of a text becomes its
        image's ``t * h * w / merge**2`` tokens; returns ``input_ids``, ``attention_mask``,
        ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids``."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template)
            self.image_token = "<|image_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)

        def __call__(self, images=None, text=None, **kwargs):
            texts = [text] if isinstance(text, str) else list(text)
            flat = [im for group in (images or []) for im in (group if isinstance(group, list) else [group])]
            out = {}
            if flat:
                pix = self.image_processor(images=flat, return_tensors="pt")
                out = {"pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"]}
                merge = self.image_processor.merge_size ** 2
                counts = iter(int(g.prod()) // merge for g in pix["image_grid_thw"])
                texts = ["".join(p + (self.image_token * next(counts) if i < t.count(self.image_token) else "")
                                 for i, p in enumerate(t.split(self.image_token))) for t in texts]
            keep = {k: kwargs[k] for k in ("padding", "padding_side", "add_special_tokens") if k in kwargs}
            enc = self.tokenizer(texts, return_tensors="pt", **keep)
            out.update(enc)
            out["mm_token_type_ids"] = (enc["input_ids"] == self.image_token_id).int()
            return BatchFeature(out, tensor_type="pt")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image_processor = AutoImageProcessor.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    return NoVideoProcessor(image_processor, tok, chat_template=tok.chat_template)


def run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText
    from trl import GRPOConfig, GRPOTrainer

    from grpo_vs_trl import step_timer

    torch.set_num_threads(os.cpu_count() or 1)
    records = json.loads(a.records)
    question = records[0]["prompt"].split("<|vision_end|>")[-1]
    # TRL's form: a conversational prompt and an "image" column, placed before the user's text
    rows = [{"prompt": [{"role": "user", "content": question}], "image": Image.open(r["images"][0]).convert("RGB")}
            for r in records]
    cfg = GRPOConfig(
        output_dir=a.tmp, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
        per_device_train_batch_size=a.samples * len(rows), gradient_accumulation_steps=1,
        num_generations=a.samples, max_completion_length=a.new_tokens, beta=0.0, num_iterations=1,
        learning_rate=1e-6, temperature=1.0, max_steps=a.steps + a.warmup, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, generation_kwargs={"min_new_tokens": a.new_tokens},
    )
    model = AutoModelForImageTextToText.from_pretrained(a.model, dtype=torch.float32)
    ds = Dataset.from_list(rows * (a.steps + a.warmup + 1))
    times: list[float] = []
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                          processing_class=no_video_processor(a.model), callbacks=[step_timer(times)])
    trainer.train()
    timed = times[a.warmup:] or times
    lens = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    per_step = (lens[-1] if lens else a.new_tokens) * cfg.per_device_train_batch_size
    return {"step_s": sum(timed) / len(timed), "gen_tokens": per_step}


# ------------------------------------------------------------------------------ driver
def side(args) -> None:
    out = run_trl(args) if args.side == "trl" else run_rlweave(args)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--schedulers", default="ray,in_process",
                    help="comma-separated rlweave schedulers (ray, in_process): one rlweave side each")
    ap.add_argument("--side", choices=("rlweave", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--scheduler", default="ray", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--records", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        side(a)
        return
    with tempfile.TemporaryDirectory(prefix="bench_vision_") as tmp:
        model, records = build(Path(tmp), a.prompts)
        results = {}
        sides = [(f"rlweave/{s.strip()}", "rlweave", s.strip()) for s in a.schedulers.split(",") if s.strip()]
        for name, kind, scheduler in sides + [("trl", "trl", "")]:
            cmd = [sys.executable, __file__, "--side", kind, "--scheduler", scheduler or "ray", "--model", model,
                   "--records", json.dumps(records), "--tmp", str(Path(tmp) / name.replace("/", "_")),
                   "--samples", str(a.samples), "--new-tokens", str(a.new_tokens), "--steps", str(a.steps),
                   "--warmup", str(a.warmup)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                print(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
                sys.exit(1)
            results[name] = json.loads(line[len("RESULT "):])
        print(f"GRPO step, {a.prompts} image prompts x {a.samples} samples x {a.new_tokens} new tokens, "
              f"{a.steps} timed steps after {a.warmup} warm-up")
        print(f"| side | step (s) | generated tokens/s |\n|---|---|---|")
        for name, r in results.items():
            print(f"| {name} | {r['step_s']:.2f} | {r['gen_tokens'] / r['step_s']:.0f} |")
        for name in results:
            if name != "trl":
                print(f"{name} speed-up over TRL: {results['trl']['step_s'] / results[name]['step_s']:.2f}x")


if __name__ == "__main__":
    main()
