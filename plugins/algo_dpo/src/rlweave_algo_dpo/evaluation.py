"""Held-out exact-match for DPO: greedy answers scored by the run's rewards
(``rlweave.algo_helpers.evaluate.exact_match``), generated either by a rollout role or, without
one, by the policy saved in Hugging Face format and decoded locally (OnlineDPO evaluates through
the step toolkit)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from rlweave.algo_helpers.evaluate import exact_match

log = logging.getLogger("rlweave.algo_dpo")


def evaluate_records(ctx: Any, cfg: Any, records: list[dict[str, Any]], generator: Any,
                     greedy: bool = True, temperature: float = 1.0) -> dict[str, float]:
    """Held-out exact-match of ``generator``'s greedy (or sampled) answers."""
    if not records:
        return {}
    if ctx.rewards is None:
        log.warning("no rewards configured: held-out exact-match is skipped (add rewards: [{name: ...}])")
        return {}
    m = exact_match(generator, ctx.tokenizer, records, ctx.rewards, max_new_tokens=cfg.eval_max_new_tokens,
                    threshold=cfg.eval_threshold, greedy=greedy, temperature=temperature, seed=ctx.seed)
    return {k: float(v) for k, v in m.items()}


def local_generator(policy: Any, run_dir: Path, dtype: str = "float32") -> Any:
    """Save the policy in HF format under ``run_dir/eval_hf`` and load it for local decoding."""
    from rlweave.algo_helpers.local_generate import LocalHFGenerator

    path = Path(run_dir) / "eval_hf"
    if path.exists():
        shutil.rmtree(path)
    res = policy.save_hf(str(path))
    if hasattr(res, "result"):
        res.result()
    return LocalHFGenerator(str(path), dtype=dtype)
