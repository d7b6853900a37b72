"""Held-out exact-match evaluation: greedy generation, then a reward decides what is correct.

Works with anything that generates: a rollout :class:`~rlweave.scheduler.RoleHandle`
(``generate`` returns a future) or a local generator whose ``generate`` returns the list
directly (:class:`rlweave.algo_helpers.local_generate.LocalHFGenerator`). Never trains.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from rlweave.algo_helpers.rollout import encode_records
from rlweave.interfaces.engine import SamplingParams
from rlweave.interfaces.rollout import Rollout
from rlweave.rewards.failures import RewardFailureError
from rlweave.rewards.fields import reward_fields  # noqa: F401 - re-exported: algorithms import it from here


def _result(x: Any) -> Any:
    return x.result() if hasattr(x, "result") else x


def exact_match(
    rollout: Any,
    tokenizer: Any,
    records: Sequence[dict[str, Any]],
    reward_fn: Any,
    max_new_tokens: int = 32,
    threshold: float = 1.0,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    trajectories: Rollout | None = None,
    vision: Any = None,
) -> dict[str, float]:
    """Generate one answer per record and score it (``vision``: the run's vision processor, for
    records with images).

    ``trajectories``: the algorithm's :class:`~rlweave.interfaces.rollout.Rollout`, when it is not
    the plain single-turn one: each record is one trajectory (``max_new_tokens`` per model turn)
    whose last model turn is the answer scored; for episodes ``tool_used_frac`` is added (episodes
    with a tool call).

    ``reward_fn`` is either a reward set (has ``score(samples) -> (totals, breakdown)``,
    e.g. :class:`rlweave.rewards.RewardSet`) or a rule ``fn(prompt, response, **fields)``.
    A sample is correct when its reward is ``>= threshold``. Returns ``accuracy`` (fraction
    correct), ``reward_mean``, ``response_len`` (mean tokens), ``n`` and ``time_s``.

    When the reward set stops on failing rewards (:class:`~rlweave.rewards.RewardFailureError`,
    e.g. the held-out records lack a field the reward needs), the error is raised again with
    ``held-out evaluation`` in front: an accuracy over failed reward calls is no measurement.
    """
    t0 = time.perf_counter()
    if not records:
        return {"accuracy": 0.0, "reward_mean": 0.0, "response_len": 0.0, "n": 0.0, "time_s": 0.0}
    eos = getattr(tokenizer, "eos_token_id", None)
    params = SamplingParams(
        n=1,
        temperature=0.0 if greedy else temperature,
        max_new_tokens=max_new_tokens,
        stop_token_ids=[eos] if eos is not None else [],
        seed=seed,
    )
    extra: dict[str, float] = {}
    if trajectories is not None:
        batch = trajectories.run(records, 1, params, lambda p, s: _result(rollout.generate(p, s)))
        texts = [m["prompt"] for m in batch.meta]
        answers = [m["response_ids"] for m in batch.meta]
        lengths = [int(x) for x in batch.sample["response_len"]]
        eps = [m["episode"] for m in batch.meta if "episode" in m]
        if eps:
            extra["tool_used_frac"] = sum(float(e.get("tool_calls", 0.0)) > 0 for e in eps) / len(eps)
    else:
        prompts, meta = encode_records(tokenizer, records, vision)
        texts = [m["prompt"] for m in meta]
        gens = _result(rollout.generate(prompts, params))
        answers = [g[0].token_ids for g in gens]
        lengths = [len(a) for a in answers]
    responses = [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    samples = [{"prompt": t, "response": resp, **reward_fields(r)} for t, resp, r in zip(texts, responses, records)]
    if hasattr(reward_fn, "score"):
        try:
            scores = list(reward_fn.score(samples)[0])
        except RewardFailureError as exc:
            raise exc.within(f"held-out evaluation on {len(samples)} records: ").on_records(
                [r.get("id", i) for i, r in enumerate(records)])
    else:
        scores = [float(reward_fn(**s)) for s in samples]
    n = len(samples)
    return {
        "accuracy": sum(1.0 for s in scores if s >= threshold - 1e-9) / n,
        "reward_mean": sum(scores) / n,
        "response_len": sum(lengths) / n,
        "n": float(n),
        "time_s": time.perf_counter() - t0,
        **extra,
    }
