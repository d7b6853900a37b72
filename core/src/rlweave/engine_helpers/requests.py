"""Per-sample request planning shared by every inference engine.

Each engine turns ``generate(prompts, params)`` into one request per sample (``params.n``
per prompt) and applies the same rules, so engines agree with each other:

* **Long prompts.** A prompt that leaves no room for one new token
  (``len(prompt) >= max_model_len``) is *too long*. Policy ``"error"``: its samples come back
  with ``finish_reason="error"`` and a message naming the limit; the other prompts of the
  call are generated normally and the engine keeps running. Policy ``"truncate"``: the prompt
  keeps its last ``max_model_len - min(max_new_tokens, max_model_len // 2)`` tokens (left
  truncation) and its samples carry ``truncated=True``. An empty prompt is always an error.
* **Response limit.** A sample gets ``min(max_new_tokens, token_budget, max_model_len -
  len(prompt))`` new tokens at most in one call (``token_budget`` when set). Reaching it is
  ``finish_reason="length"``, unless the limit was the ``token_budget`` (smaller than both
  ``max_new_tokens`` and the room left): then the sample is unfinished, ``"aborted"``, and a
  later call continues it with prompt + its tokens as prompt (:func:`finish_generation`).
* **Abort.** :class:`CallRegistry` keeps one stop flag per ``generate`` call in progress;
  ``RolloutEngine.abort()`` sets them, the engine checks its flag at each decoding step, and
  every sample it stops before it finished comes back ``"aborted"`` with its tokens so far.
* **Versions.** Every generated token is stamped with the engine's ``weight_version``
  (``Generation.versions``); error samples have none.
* **Stops.** Generation stops after any of ``stop_token_ids`` or the model's EOS ids (the
  latter unless ``ignore_eos``); the stop token is the last token of the response
  (``finish_reason="stop"``).
* **Seeds.** With ``params.seed`` set, sample ``k`` of prompt ``i`` uses its own seed
  :func:`sample_seed` so its tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.interfaces.engine import Generation, SamplingParams

LONG_PROMPT_POLICIES = ("error", "truncate")


@dataclass
class SampleRequest:
    """One sample to generate: ``prompt_ids`` after the long-prompt policy, ``max_new_tokens``
    (the most new tokens this call generates for it), its seed, and ``error`` when it must not
    be generated at all. ``budget_limited``: that limit is the call's ``token_budget``, so a
    sample reaching it is unfinished (``"aborted"``), not ``"length"``."""

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None
    truncated: bool = False
    error: str | None = None
    budget_limited: bool = False
    #: the prompt's vision inputs (:class:`rlweave.interfaces.engine.VisionPrompt`), None without images
    mm: Any = None


def validate_params(params: "SamplingParams") -> None:
    """Raise ``ValueError`` naming the field when sampling settings are out of range."""
    problems = []
    if params.n < 1:
        problems.append(f"n={params.n} (must be >= 1)")
    if params.temperature < 0:
        problems.append(f"temperature={params.temperature} (must be >= 0)")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p={params.top_p} (must be in (0, 1])")
    if params.top_k != -1 and params.top_k < 1:
        problems.append(f"top_k={params.top_k} (must be -1 or >= 1)")
    if params.max_new_tokens < 1:
        problems.append(f"max_new_tokens={params.max_new_tokens} (must be >= 1)")
    budget = getattr(params, "token_budget", None)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        problems.append(f"token_budget={budget!r} (must be None or an integer >= 1)")
    if problems:
        raise ValueError("invalid SamplingParams: " + "; ".join(problems))


def sample_seed(seed: int | None, prompt_index: int, sample_index: int, n: int) -> int | None:
    """Seed of sample ``sample_index`` of prompt ``prompt_index`` for a call seeded ``seed``."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + prompt_index * n + sample_index) % (2**31 - 1)


def response_limit(params: "SamplingParams", room: int) -> tuple[int, bool]:
    """``(limit, budget_limited)`` of one sample with ``room`` tokens left before
    ``max_model_len``: the limit is ``min(max_new_tokens, token_budget, room)``;
    ``budget_limited`` when ``token_budget`` is strictly smaller than the other two."""
    natural = min(params.max_new_tokens, room)
    budget = getattr(params, "token_budget", None)
    if budget is not None and budget < natural:
        return int(budget), True
    return natural, False


def plan_requests(
    prompts: Sequence[Sequence[int]],
    params: "SamplingParams",
    max_model_len: int,
    long_prompt: str = "error",
    where: str = "rollout engine",
) -> list[SampleRequest]:
    """One :class:`SampleRequest` per sample, prompt-major (``i * n + k``).

    ``where`` names the engine in error messages (e.g. ``"role rollout rank 0 (vllm)"``).
    """
    if long_prompt not in LONG_PROMPT_POLICIES:
        raise ValueError(f"long_prompt={long_prompt!r}: choose one of {LONG_PROMPT_POLICIES}")
    validate_params(params)
    out: list[SampleRequest] = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        mm = getattr(prompt, "mm", None)
        error = None
        truncated = False
        if not ids:
            error = f"prompt {i} is empty ({where})"
        elif len(ids) >= max_model_len:
            if long_prompt == "truncate" and mm is not None:
                error = (f"prompt {i} has {len(ids)} tokens with its images' tokens; {where} accepts at most "
                         f"max_model_len={max_model_len} and a prompt with images is never cut")
            elif long_prompt == "truncate":
                keep = max_model_len - min(params.max_new_tokens, max_model_len // 2)
                ids = ids[len(ids) - keep :]
                truncated = True
            else:
                error = (
                    f"prompt {i} has {len(ids)} tokens; {where} accepts at most max_model_len={max_model_len} "
                    f"tokens of prompt + response (set long_prompt: truncate to cut prompts from the left)"
                )
        limit, budget_limited = response_limit(params, max_model_len - len(ids)) if not error else (0, False)
        for k in range(params.n):
            out.append(
                SampleRequest(
                    prompt_index=i,
                    sample_index=k,
                    prompt_ids=ids,
                    max_new_tokens=limit,
                    seed=sample_seed(params.seed, i, k, params.n),
                    truncated=truncated,
                    error=error,
                    budget_limited=budget_limited,
                    mm=mm,
                )
            )
    return out


def stop_token_ids(params: "SamplingParams", eos_ids: Sequence[int]) -> list[int]:
    """The ids that end a sample: ``params.stop_token_ids`` plus EOS unless ``ignore_eos``."""
    ids = [int(t) for t in params.stop_token_ids]
    if not params.ignore_eos:
        ids += [int(t) for t in eos_ids if int(t) not in ids]
    return ids


def cut_at_stop(
    token_ids: Sequence[int], logprobs: Sequence[float], stops: Sequence[int], budget: int
) -> tuple[list[int], list[float], str]:
    """Cut a raw continuation after its first stop token (kept) or at ``budget`` tokens.

    Returns ``(token_ids, logprobs, finish_reason)`` with reason ``"stop"`` or ``"length"``."""
    stop_set = set(int(t) for t in stops)
    ids = [int(t) for t in token_ids[:budget]]
    for j, t in enumerate(ids):
        if t in stop_set:
            return ids[: j + 1], [float(x) for x in logprobs[: j + 1]], "stop"
    return ids, [float(x) for x in logprobs[: len(ids)]], "length"


def finish_generation(
    req: SampleRequest,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    stops: Sequence[int],
    version: "int | Sequence[int]",
    aborted: bool = False,
) -> "Generation":
    """The :class:`Generation` of one sample from its raw continuation.

    Cut after the first stop token (``"stop"``) or at ``req.max_new_tokens``; a sample that
    reached that limit is ``"length"``, or ``"aborted"`` when the limit was the token budget
    (``req.budget_limited``). ``aborted``: the engine stopped the call early on request; a
    sample short of its limit without a stop token is then ``"aborted"`` too. Every token is
    stamped with ``version``, or with its own entry when ``version`` is a sequence (one per
    token of ``token_ids``: weights that changed during the call)."""
    from rlweave.interfaces.engine import Generation

    ids, lps, reason = cut_at_stop(token_ids, logprobs, stops, req.max_new_tokens)
    if reason != "stop":
        at_limit = len(ids) >= req.max_new_tokens
        if (at_limit and req.budget_limited) or (not at_limit and aborted):
            reason = "aborted"
    if isinstance(version, int):
        stamps = [int(version)] * len(ids)
    else:
        stamps = [int(v) for v in version[:len(ids)]]
        if len(stamps) != len(ids):
            raise ValueError(f"finish_generation: {len(version)} versions for {len(token_ids)} tokens")
    return Generation(token_ids=ids, logprobs=lps, finish_reason=reason, truncated=req.truncated, versions=stamps)


class CallRegistry:
    """The ``generate`` calls of one engine, each with its stop flag (thread-safe).

    An engine wraps each call in :meth:`call`, which registers the call's flag, waits until
    no other call of the engine runs (calls run one at a time: they share the engine's
    scheduler and the process's random state) unless the registry is not ``exclusive`` (an
    engine whose calls share one batch, each stepping it for all), and yields the flag; the
    engine polls it at every decoding step. :meth:`abort_all` (``abort()``, from another
    thread) sets the flags of the calls registered at that moment, running or waiting their
    turn, and returns how many there were. A call that starts later gets a fresh flag: an
    abort while idle affects nothing."""

    def __init__(self, exclusive: bool = True) -> None:
        self._lock = threading.Lock()
        self._turn: Any = threading.Lock() if exclusive else nullcontext()
        self._flags: list[threading.Event] = []

    @contextmanager
    def call(self) -> Iterator[threading.Event]:
        flag = threading.Event()
        with self._lock:
            self._flags.append(flag)
        try:
            with self._turn:
                yield flag
        finally:
            with self._lock:
                self._flags.remove(flag)

    def abort_all(self) -> int:
        """Set the flag of every registered call; returns their number."""
        with self._lock:
            for flag in self._flags:
                flag.set()
            return len(self._flags)

    @property
    def registered(self) -> int:
        """Calls running or waiting their turn."""
        with self._lock:
            return len(self._flags)


def group_generations(
    requests: Sequence[SampleRequest], generations: Sequence["Generation"], num_prompts: int
) -> list[list["Generation"]]:
    """Regroup per-sample generations (same order as ``requests``) into ``[prompt][k]``."""
    out: list[list[Generation]] = [[] for _ in range(num_prompts)]
    for req, gen in zip(requests, generations, strict=True):
        out[req.prompt_index].append(gen)
    return out


def error_generation(req: SampleRequest) -> "Generation":
    """The per-sample answer for a request that could not be generated."""
    from rlweave.interfaces.engine import Generation

    return Generation(token_ids=[], logprobs=[], finish_reason="error", error=req.error, truncated=req.truncated)


def eos_token_ids(model_dir: str | Path) -> list[int]:
    """EOS ids of a Hugging Face model directory: ``generation_config.json`` first, then
    ``config.json``; ``[]`` when neither names one."""
    for name in ("generation_config.json", "config.json"):
        f = Path(model_dir) / name
        if not f.is_file():
            continue
        value = json.loads(f.read_text()).get("eos_token_id")
        if value is None:
            continue
        return [int(v) for v in (value if isinstance(value, list) else [value])]
    return []
