"""``rlweave generate CONFIG_OR_MODEL --data PROMPTS --out OUT.jsonl [sampling options]``.

Offline batch generation with any installed inference engine plugin (``--engine``; default:
the run's rollout engine, else ``hf``), driven in this process (:mod:`rlweave.commands.engine`).
The model is what :mod:`rlweave.commands.source` resolves (a Hugging Face directory, or a run's
``hf/`` export or newest complete checkpoint).

Input: records with a prompt (``prompt``, ``query`` or chat ``messages``) and an optional
``id`` (default ``<file stem>:<line number>``), in any format the project's data loader reads
(jsonl, parquet, a saved ``datasets`` directory; :mod:`rlweave.commands.records`).

Output contract: ``--out`` is a jsonl file, one line per prompt, written in batches of
``--batch-size`` prompts (each batch appended and flushed at once)::

    {"id", "prompt", "responses": [n texts], "finish_reasons": [n], "num_tokens": [n],
     "logprobs": [n lists of per-token log-probs]  (with --logprobs),
     "errors": [n messages or null]  (only when a sample ended with finish_reason "error")}

Resumable: ids already in ``--out`` are skipped, so a rerun after an interruption generates
only the rest. A last line cut off by the interruption (no newline at its end) is removed
first, with a message. A line that is not a JSON object with an ``id`` is an error (exit 2).
``--seed`` seeds each batch with ``seed + index of its first prompt``: the same data, batch
size, engine and seed give the same output when nothing was skipped.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from rlweave.commands import plugins
from rlweave.commands.errors import CommandError, user_errors

DTYPES = ("float32", "bfloat16", "float16")


def done_ids(out: Path, say) -> set[str]:
    """Ids already in ``out`` (empty when it does not exist); cuts off an unfinished last line."""
    if not out.exists():
        return set()
    if not out.is_file():
        raise CommandError(f"--out {out} is not a file")
    data = out.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(out, "r+b") as f:
            f.truncate(keep)
        say(f"{out}: removed an unfinished last line ({len(data) - keep} bytes) left by an interrupted run")
        data = data[:keep]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CommandError(f"--out {out} is not a UTF-8 text file (not an output of rlweave generate); choose "
                           "another --out") from None
    ids: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{out}:{lineno}: not JSON ({exc.msg}); it is not an output of rlweave generate, "
                               "or it was edited: fix or remove that line, or choose another --out") from None
        if not isinstance(row, dict) or "id" not in row:
            raise CommandError(f"{out}:{lineno}: expected a JSON object with an 'id'; fix or remove that line, or "
                               "choose another --out")
        ids.add(str(row["id"]))
    return ids


def output_row(record: dict[str, Any], prompt: str, gens: list[Any], tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    """The output line of one prompt (see the module docstring)."""
    row: dict[str, Any] = {
        "id": record["id"],
        "prompt": prompt,
        "responses": [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in gens],
        "finish_reasons": [g.finish_reason for g in gens],
        "num_tokens": [len(g.token_ids) for g in gens],
    }
    if logprobs:
        row["logprobs"] = [[float(x) for x in g.logprobs] for g in gens]
    if any(g.finish_reason == "error" for g in gens):
        row["errors"] = [g.error for g in gens]
    return row


def generate(
    source: Path = typer.Argument(..., metavar="CONFIG_OR_MODEL",
                                  help="Hugging Face model directory, run directory, or run config YAML."),
    data: Path = typer.Option(..., "--data", help="Prompts (jsonl, parquet or a saved datasets directory) with "
                                                  "'prompt' (or 'query', or chat 'messages') and an optional 'id' "
                                                  "(default <file stem>:<line number>)."),
    out: Path = typer.Option(..., "--out", help="Output jsonl, one line per prompt; ids already there are skipped."),
    n: int = typer.Option(1, "--n", min=1, help="Samples per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature; 0 is greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling: keep the smallest set of tokens with this "
                                                     "much probability (1.0: off)."),
    top_k: int = typer.Option(-1, "--top-k", help="Keep the k most likely tokens (-1: off)."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="Most new tokens per sample."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Inference engine plugin (hf, vllm, ...); default: "
                                                                "the run's rollout engine, else hf."),
    logprobs: bool = typer.Option(False, "--logprobs", help="Also write each sampled token's log-prob."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (each batch: seed + index of its first prompt)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Prompts per engine call; the output is appended "
                                                                   "and flushed after each."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Weights dtype: float32, bfloat16 or float16 "
                                                              "(default: the run's model.dtype, else float32)."),
) -> None:
    """Generate responses for a jsonl file of prompts (offline, resumable)."""
    with user_errors():
        _generate(source, data, out, n, temperature, top_p, top_k, max_tokens, engine, logprobs, seed, batch_size,
                  dtype)


def _generate(source, data, out, n, temperature, top_p, top_k, max_tokens, engine, logprobs, seed, batch_size,
              dtype) -> None:
    from rlweave.commands.engine import engine_choice, local_engine
    from rlweave.commands.records import encode_records, load_records, prompt_texts, vision_processor
    from rlweave.commands.source import chat_template, load_tokenizer, model_dir, model_dtype, read_source
    from rlweave.engine_helpers.requests import validate_params
    from rlweave.interfaces.engine import SamplingParams

    if dtype is not None and dtype not in DTYPES:
        raise CommandError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_tokens,
                            seed=seed)
    try:
        validate_params(params)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    records = load_records(data)
    if not out.parent.is_dir():
        raise CommandError(f"--out {out}: folder {out.parent} does not exist")
    done = done_ids(out, typer.echo)
    todo = [(i, r) for i, r in enumerate(records) if r["id"] not in done]
    if done:
        typer.echo(f"resuming: {len(records) - len(todo)} of {len(records)} prompts are already in {out}")
    if not todo:
        typer.echo(f"nothing to do: every prompt of {data} is in {out}")
        return
    pm = plugins.plugin_manager()
    src = read_source(source, pm)
    record, options = engine_choice(engine, src, pm)
    t0 = time.perf_counter()
    with model_dir(src, pm, typer.echo) as path:
        tokenizer = load_tokenizer(path, src)
        eos = getattr(tokenizer, "eos_token_id", None)
        params.stop_token_ids = [eos] if eos is not None else []
        rendered = load_records(data, tokenizer, chat_template(src))  # chat records through the template
        todo = [(i, rendered[i]) for i, _ in todo]
        texts = prompt_texts([r for _, r in todo], tokenizer)
        prompts = encode_records(tokenizer, texts, [r for _, r in todo], data, vision_processor(path, tokenizer, src))
        typer.echo(f"model: {src.describe()}, engine: {record.name}")
        with local_engine(record, options, path, src, model_dtype(src, dtype), seed) as eng:
            _run_batches(eng, tokenizer, todo, texts, prompts, params, out, batch_size, logprobs)
    typer.echo(f"wrote {len(todo)} prompts x {n} samples to {out} ({time.perf_counter() - t0:.1f} s)")


def _run_batches(eng, tokenizer, todo, texts, prompts, params, out: Path, batch_size: int, logprobs: bool) -> None:
    from tqdm import tqdm

    written = 0
    with open(out, "a", encoding="utf-8") as f, tqdm(total=len(todo), unit="prompt", desc="generate",
                                                      disable=None) as bar:
        try:
            for start in range(0, len(todo), batch_size):
                done = _batch(eng, tokenizer, todo, texts, prompts, params, f, start, batch_size, logprobs)
                written += done
                bar.update(done)
        except KeyboardInterrupt:
            typer.echo(f"interrupted: {written} of {len(todo)} prompts written to {out}; run the same command again "
                       "to generate the rest", err=True)
            raise typer.Exit(130) from None


def _batch(eng, tokenizer, todo, texts, prompts, params, f, start: int, batch_size: int, logprobs: bool) -> int:
    """Generate prompts ``start .. start + batch_size`` of ``todo`` and append their lines at once."""
    chunk = todo[start : start + batch_size]
    gens = eng.generate(prompts[start : start + batch_size], replace(params, seed=params.seed + chunk[0][0]))
    lines = [json.dumps(output_row(r, t, g, tokenizer, logprobs)) + "\n"
             for (_, r), t, g in zip(chunk, texts[start : start + batch_size], gens)]
    f.write("".join(lines))
    f.flush()
    os.fsync(f.fileno())
    return len(chunk)
