"""Contract of an inference engine worker (the ``rollout`` role).

One instance per engine replica rank. A rollout role may run several replicas (data
parallel: the controller balances prompts across replicas) and a replica may span several
ranks with tensor parallelism where the engine supports it (then only the replica's first
rank receives ``generate`` calls).

Lifecycle: ``__init__(ctx)`` (cheap) -> ``init_engine()`` (loads ``ctx.model['path']``)
-> ``generate`` / ``load_weights`` / ``sleep`` / ``wake_up`` -> ``shutdown()``.

Errors: a prompt the engine cannot take (longer than ``max_model_len``) must not kill
the engine: per config it is truncated (left) or answered with ``finish_reason="error"``
and an ``error`` message. Any other exception propagates to the controller, which names
role and rank.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from rlweave.interfaces.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    import torch


_GATE_MADE = threading.Lock()


@dataclass
class SamplingParams:
    """Sampling settings for one ``generate`` call.

    ``n`` samples per prompt; ``top_k = -1`` and ``top_p = 1.0`` disable those filters;
    ``temperature = 0`` is greedy; ``seed`` makes sampling reproducible (same seed, same
    prompts, same weights -> same tokens; sample ``k`` of prompt ``i`` gets its own seed
    derived from ``(seed, i, k)``); ``ignore_eos`` generates exactly ``max_new_tokens``
    unless a ``stop_token_ids`` token comes first (benchmarks).

    ``token_budget``: the most new tokens this call generates per sample (None: no limit but
    ``max_new_tokens``). A sample the budget stops before it stops or reaches
    ``max_new_tokens`` comes back unfinished, ``finish_reason="aborted"``, with what it has so
    far; a later call continues it with prompt + those tokens as its prompt (partial
    rollout).

    ``return_routing``: an engine whose record says ``routing`` reports, for MoE models, the
    experts every token was routed to (``Generation.routing``); others ignore it (validation
    refuses to ask them)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    token_budget: int | None = None
    return_routing: bool = False


@dataclass
class Generation:
    """One sampled continuation: ``token_ids`` (the response only), ``logprobs`` of those
    tokens under the engine (same length), ``finish_reason`` in ``{"stop", "length",
    "aborted", "error"}``, ``error`` set when ``finish_reason == "error"``, ``truncated`` when
    the prompt was cut to fit, ``versions``: the engine's ``weight_version`` when each token
    was generated (same length as ``token_ids``; engines that do not stamp them leave it
    empty and the caller uses the version it last synced).

    ``"aborted"``: the sample was stopped unfinished, by ``SamplingParams.token_budget`` or by
    :meth:`RolloutEngine.abort`; its tokens and log-probs so far are valid and a later call
    with prompt + ``token_ids`` continues it (greedy: the same tokens as an uninterrupted
    call).

    Conventions every engine follows (shared code: :mod:`rlweave.engine_helpers.requests`):

    * ``logprobs[i]`` is the log-prob of ``token_ids[i]`` under the distribution it was
      sampled from: ``log_softmax(logits / T)`` (restricted to the top-k/top-p set when those
      are on). Without top-k/top-p this equals what a training backend computes with
      ``compute_logprobs(batch, temperature=T)``; greedy (``T = 0``) reports
      ``log_softmax(logits)``. (Engines may offer ``logprobs_mode: raw``: always
      ``log_softmax(logits)``.)
    * A stop token (``stop_token_ids`` or the model's EOS unless ``ignore_eos``) is kept as
      the last token, with ``finish_reason="stop"``; ``"length"`` when ``max_new_tokens`` or
      ``max_model_len`` was reached.
    * An error sample has empty ``token_ids``/``logprobs``."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    error: str | None = None
    truncated: bool = False
    versions: list[int] = field(default_factory=list)
    #: with ``SamplingParams.return_routing`` (MoE models): ``(len(prompt) + len(token_ids), layers,
    #: top_k)`` int16 expert indices per token of prompt and response, ``-1`` where the engine
    #: ran no forward on the token (the last sampled one); None otherwise
    routing: Any = None


class VisionPrompt(list):
    """A prompt's token ids (a ``list[int]``) with its images' vision inputs ``mm``
    (:data:`rlweave.data.vision.MM_KEYS`; the ids hold each image's placeholder tokens already
    expanded, :class:`rlweave.data.vision.VisionProcessor`). Engines whose record says ``vision``
    generate from it; others refuse it. It pickles with its images; slicing or adding to it
    gives a plain list without them, so code that builds a new prompt from it must carry ``mm``
    itself."""

    def __init__(self, ids=(), mm: dict[str, Any] | None = None) -> None:
        super().__init__(ids)
        self.mm = mm

    def __reduce__(self):
        return (VisionPrompt, (list(self), self.mm))


def prompt_images(prompt: Any) -> dict[str, Any] | None:
    """The vision inputs a prompt carries (:class:`VisionPrompt`), None for plain token ids."""
    return getattr(prompt, "mm", None)


class RolloutEngine(Worker):
    """Generates with the policy's weights and accepts new weights in place.

    ``weight_version``: the policy version of the weights the engine holds (0 at start; set
    with each weight sync, inside :meth:`weights_landing`, or by :meth:`set_weight_version`),
    stamped on every generated token (``Generation.versions``).

    **Control plane.** An engine whose class sets ``control_plane = True`` promises that
    :meth:`weights_landing` (with the ``load_weights`` inside it), :meth:`weight_dtype`,
    :meth:`set_weight_version` and :meth:`abort` may run on another thread while ``generate``
    runs: its ``generate`` holds :attr:`step_gate` (``running()``) and, where it can, calls
    ``step_gate.boundary()`` between decoding steps, so new weights land between two steps
    of a running call and the tokens after them carry the new version. The scheduler then
    gives each rank a control channel that is never queued behind ``generate`` (a Ray
    concurrency group), and weight syncs and aborts use it. Without it (default) those calls
    wait for the calls queued before them.

    **Concurrent calls.** An engine whose class sets ``concurrent_calls`` above 1 promises
    that that many ``generate`` calls may run at once, from threads of their own, and batches
    them together (continuous batching: a call that starts joins the running batch). The
    scheduler then runs up to that many of a rank's ``generate`` calls at once; the default,
    1, runs them one after the other."""

    weight_version: int = 0
    control_plane: bool = False
    concurrent_calls: int = 1

    @property
    def lands_between_steps(self) -> bool:
        """Whether new weights land between two decoding steps of a running ``generate``
        call (else they wait for its end); ``control_plane`` unless the engine says more."""
        return bool(self.control_plane)

    @property
    def step_gate(self) -> Any:
        """This engine's :class:`~rlweave.interfaces.step_gate.StepGate` (made on first use)."""
        gate = self.__dict__.get("_step_gate")
        if gate is None:
            from rlweave.interfaces.step_gate import StepGate

            with _GATE_MADE:  # the control thread and a generate call may both ask first
                gate = self.__dict__.setdefault("_step_gate", StepGate())
        return gate

    @contextmanager
    def weights_landing(self, version: int | None = None) -> Iterator[None]:
        """Held by a weight sync's receiving end around ``load_weights``: no decoding step
        runs inside it (:attr:`step_gate`), and on success the engine takes ``version`` (when
        given) before any step runs again, so every token is stamped with the version of the
        weights that produced it."""
        with self.step_gate.update():
            yield
            if version is not None:
                self.set_weight_version(version)

    def set_weight_version(self, version: int) -> int:
        """Record that the weights now loaded are policy version ``version``; returns it."""
        self.weight_version = int(version)
        return self.weight_version

    def abort(self) -> int:
        """Ask the ``generate`` call in progress (from another thread of this process) to stop
        at its next decoding step and return every unfinished sample as ``"aborted"``;
        returns the number of calls asked (0: none was running). Engines that cannot stop
        mid-call raise ``NotImplementedError`` naming themselves."""
        raise NotImplementedError(f"{type(self).__name__} cannot abort a generate call in progress")

    @abstractmethod
    def init_engine(self) -> None:
        """Start the engine on ``ctx.model['path']`` (HF directory)."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """For each prompt (token ids, or a :class:`VisionPrompt` for an engine that takes
        images) ``params.n`` generations, in prompt order."""

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """Replace the weights in place (HF names), no restart, no temporary files. The
        tensors have already been verified by the weight-sync transport."""

    def weight_dtype(self) -> str | None:
        """The dtype the engine keeps its weights in (a torch name, e.g. ``"bfloat16"``), or
        None. Weight sync casts floating-point tensors to it before they travel, so an fp32
        trainer feeding a bf16 engine moves half the bytes, and the engine receives what it
        would have cast them to itself (None: tensors arrive in the sender's dtypes)."""
        return None

    def sleep(self, level: int = 1) -> dict[str, Any]:
        """Release memory while colocated roles train: level 1 the KV cache, level 2 the
        weights too where supported. Returns what was freed."""
        return {"freed_bytes": 0}

    def wake_up(self) -> None:
        """Retake what :meth:`sleep` released."""

    @property
    def max_model_len(self) -> int:
        """Longest prompt + response the engine accepts (``options.max_model_len``, else 2048)."""
        opts = self.ctx.options
        value = opts.get("max_model_len") if isinstance(opts, dict) else getattr(opts, "max_model_len", None)
        return int(value or 2048)

    def health(self) -> dict[str, Any]:
        """Liveness and basic facts (role, rank, pid, engine name)."""
        return self.ping()
