"""``rlweave eval CONFIG_OR_MODEL [--data FILE] [--rewards NAME ...] [--n N --k K ...]``.

Contract: the greedy metrics are the held-out evaluation a run makes mid-run and at its end
(:func:`rlweave.algo_helpers.evaluate.exact_match`: one greedy answer per record, scored by
the rewards): ``exact_match`` (share of records whose reward is ``>= --threshold``),
``reward_mean`` and ``response_len``; on the same model, data and settings they equal the
run's ``eval/accuracy``, ``eval/reward_mean`` and ``eval/response_len``. With ``--n N > 1``,
``N`` samples per record at ``--temperature`` also give ``pass@k`` for each ``--k`` (default
1 and N; the unbiased estimator of :func:`pass_at_k`) and ``sampled_reward_mean``.

Defaults from a run (a run config or run directory): ``--data`` is ``data.eval`` (its first
``data.eval_size`` records), ``--rewards`` the run's ``rewards`` (with its ``reward_runtime``),
``--max-tokens`` and ``--threshold`` the algorithm's ``eval_max_new_tokens`` and
``eval_threshold``. Given on the command line they replace those. Rewards run as in a run:
in sandboxed worker processes (:class:`rlweave.rewards.RewardSet`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import typer

from rlweave.commands import plugins
from rlweave.commands.errors import CommandError, user_errors

EVAL_MAX_NEW_TOKENS = 32  # exact_match's default, when no run says otherwise


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n``
    samples, ``c`` of them correct, is correct: ``1 - C(n-c, k) / C(n, k)`` (unbiased)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reward_entries(specs: list[str]) -> list[dict[str, Any]]:
    """``NAME`` or ``NAME=WEIGHT`` (a plugin name, ``module:function`` or ``file.py:function``)."""
    out = []
    for spec in specs:
        name, sep, weight = spec.rpartition("=")
        if sep:
            try:
                out.append({"name": name, "weight": float(weight)})
                continue
            except ValueError:
                raise CommandError(f"--rewards {spec}: the weight after '=' must be a number") from None
        out.append({"name": spec})
    return out


def reward_set(entries: list[dict[str, Any]], runtime: Any, pm: Any) -> Any:
    """A :class:`~rlweave.rewards.RewardSet`; unknown names and unimportable functions are a
    :class:`CommandError` naming the installed rewards (before any model is loaded)."""
    from rlweave.plugins.errors import PluginError
    from rlweave.rewards import RewardSet

    records = {}
    for e in entries:
        if ":" not in e["name"]:
            try:
                records[e["name"]] = pm.get("reward", e["name"], where="--rewards")
            except PluginError as exc:
                raise CommandError(str(exc)) from None
    try:
        return RewardSet(entries, runtime, plugin_manager=records)
    except (ValueError, ImportError, TypeError) as exc:
        raise CommandError(f"--rewards: {exc}") from None


def _algo_setting(src: Any, key: str, default: Any) -> Any:
    algo = src.resolved.algorithm_config if src.resolved is not None else None
    value = getattr(algo, key, None) if algo is not None else None
    return default if value is None else value


def sampled_metrics(eng: Any, tokenizer: Any, records: list[dict[str, Any]], rewards: Any, n: int, ks: list[int],
                    temperature: float, top_p: float, max_tokens: int, threshold: float, seed: int,
                    vision: Any = None) -> dict[str, float]:
    """``pass@k`` for each ``k`` and ``sampled_reward_mean`` over ``n`` samples per record
    (``vision``: the model's vision processor, for records with images)."""
    from rlweave.algo_helpers.evaluate import reward_fields
    from rlweave.algo_helpers.rollout import encode_records
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.rewards.failures import RewardFailureError

    prompts, meta = encode_records(tokenizer, records, vision)
    texts = [m["prompt"] for m in meta]
    eos = getattr(tokenizer, "eos_token_id", None)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens,
                            stop_token_ids=[eos] if eos is not None else [], seed=seed)
    gens = eng.generate(prompts, params)
    samples = [{"prompt": t, "response": tokenizer.decode(g.token_ids, skip_special_tokens=True), **reward_fields(r)}
               for t, r, group in zip(texts, records, gens) for g in group]
    try:
        scores = list(rewards.score(samples)[0])
    except RewardFailureError as exc:
        raise RewardFailureError(f"sampled evaluation on {len(samples)} samples: {exc}", exc.reward, exc.failed,
                                 exc.total, exc.first) from exc
    correct = [sum(1 for s in scores[i * n:(i + 1) * n] if s >= threshold - 1e-9) for i in range(len(records))]
    out = {f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct) / len(records) for k in ks}
    out["sampled_reward_mean"] = sum(scores) / len(scores)
    return out


def evaluate(
    source: Path = typer.Argument(..., metavar="CONFIG_OR_MODEL",
                                  help="Hugging Face model directory, run directory, or run config YAML."),
    data: Optional[Path] = typer.Option(None, "--data", help="Records to evaluate (jsonl, parquet or a saved datasets "
                                                             "directory) with a prompt and the fields the rewards "
                                                             "read, e.g. 'answer'; default: the run's data.eval."),
    rewards: Optional[List[str]] = typer.Option(None, "--rewards", help="Reward NAME[=WEIGHT] (a reward plugin, "
                                                                        "module:function or file.py:function); "
                                                                        "repeat for several. Default: the run's."),
    n: int = typer.Option(1, "--n", min=1, help="Samples per record for pass@k (1: greedy metrics only)."),
    k: Optional[List[int]] = typer.Option(None, "--k", help="k of pass@k, 1 <= k <= --n; repeat for several "
                                                            "(default: 1 and --n)."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature of the --n samples."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling of the --n samples (1.0: off)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Most new tokens per answer (default: "
                                                                               "the run's eval_max_new_tokens, else "
                                                                               f"{EVAL_MAX_NEW_TOKENS})."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="An answer is correct when its reward is >= "
                                                                        "this (default: the run's eval_threshold, "
                                                                        "else 1.0)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Evaluate the first N records only (default: "
                                                                     "all; the run's data.eval_size for its data)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Inference engine plugin (hf, vllm, ...); default: "
                                                                "the run's rollout engine, else hf."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Weights dtype: float32, bfloat16 or float16 "
                                                              "(default: the run's model.dtype, else float32)."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
) -> None:
    """Evaluate a model: exact match and mean reward (greedy), pass@k (sampled)."""
    with user_errors():
        _evaluate(source, data, rewards or [], n, k or [], temperature, top_p, max_tokens, threshold, limit, engine,
                  seed, dtype, as_json)


@dataclass
class EvalPlan:
    """What to evaluate on, with what: the command line, else the run's settings."""

    data: Path
    limit: int | None
    rewards: list[dict[str, Any]]
    runtime: Any
    max_tokens: int
    threshold: float


def plan(src: Any, data: Path | None, rewards: list[str], limit: int | None, max_tokens: int | None,
         threshold: float | None) -> EvalPlan:
    """The :class:`EvalPlan` of the options and the run of ``src`` (see the module docstring)."""
    cfg = src.cfg
    if data is None:
        if cfg is None or not cfg.data.eval:
            raise CommandError("--data is required" + (" (the run config has no data.eval)" if cfg is not None else ""))
        data, limit = Path(cfg.data.eval), limit or cfg.data.eval_size
    entries = reward_entries(rewards) if rewards else [e.model_dump() for e in cfg.rewards] if cfg is not None else []
    if not entries:
        raise CommandError("--rewards is required" + (" (the run config has no rewards)" if cfg is not None else ""))
    return EvalPlan(data, limit, entries, cfg.reward_runtime if cfg is not None else None,
                    max_tokens or _algo_setting(src, "eval_max_new_tokens", EVAL_MAX_NEW_TOKENS),
                    threshold if threshold is not None else _algo_setting(src, "eval_threshold", 1.0))


def _evaluate(source, data, rewards, n, ks, temperature, top_p, max_tokens, threshold, limit, engine, seed, dtype,
              as_json) -> None:
    from rlweave.algo_helpers.evaluate import exact_match
    from rlweave.commands.engine import engine_choice, local_engine
    from rlweave.commands.generate import DTYPES
    from rlweave.commands.records import encode_records, load_records, prompt_texts, vision_processor
    from rlweave.commands.source import chat_template, load_tokenizer, model_dir, model_dtype, read_source

    if dtype is not None and dtype not in DTYPES:
        raise CommandError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    ks = sorted(set(ks or ([1, n] if n > 1 else [])))
    if any(not 1 <= x <= n for x in ks) or (ks and n == 1):
        raise CommandError(f"--k {', '.join(map(str, ks))}: pass@k needs --n samples with 1 <= k <= --n (--n is {n})")
    pm = plugins.plugin_manager()
    src = read_source(source, pm)
    p = plan(src, data, rewards, limit, max_tokens, threshold)
    records = load_records(p.data)[: p.limit]
    record, options = engine_choice(engine, src, pm)
    scorer = reward_set(p.rewards, p.runtime, pm)
    t0 = time.perf_counter()
    try:
        with model_dir(src, pm, lambda s: typer.echo(s, err=True)) as path:
            tokenizer = load_tokenizer(path, src)
            records = load_records(p.data, tokenizer, chat_template(src))[: p.limit]  # chat records rendered
            vision = vision_processor(path, tokenizer, src)
            encode_records(tokenizer, prompt_texts(records, tokenizer), records, p.data, vision)  # errors first
            with local_engine(record, options, path, src, model_dtype(src, dtype), seed) as eng:
                greedy = exact_match(eng, tokenizer, records, scorer, max_new_tokens=p.max_tokens,
                                     threshold=p.threshold, greedy=True, seed=seed, vision=vision)
                sampled = (sampled_metrics(eng, tokenizer, records, scorer, n, ks, temperature, top_p, p.max_tokens,
                                           p.threshold, seed, vision) if n > 1 else {})
    finally:
        scorer.close()
    metrics = {"model": src.describe(), "engine": record.name, "data": str(p.data), "records": len(records),
               "rewards": [e["name"] + (f"={e['weight']:g}" if e.get("weight", 1.0) != 1.0 else "") for e in p.rewards],
               "threshold": p.threshold, "max_tokens": p.max_tokens, "exact_match": greedy["accuracy"],
               "reward_mean": greedy["reward_mean"], "response_len": greedy["response_len"]}
    if sampled:
        metrics.update({"n": n, "temperature": temperature, **sampled})
    metrics["time_s"] = round(time.perf_counter() - t0, 2)
    typer.echo(json.dumps(metrics) if as_json else _table(metrics))


def _table(metrics: dict[str, Any]) -> str:
    lines = []
    for key, value in metrics.items():
        exact = isinstance(value, float) and key not in ("time_s", "temperature", "threshold")
        shown = f"{value:.4f}" if exact else value
        lines.append(f"{key:<20} {', '.join(shown) if isinstance(shown, list) else shown}")
    return "\n".join(lines)
