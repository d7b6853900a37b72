"""Contract of a training backend worker (one instance per rank of a role).

Who calls what: the controller (an algorithm through a role handle) calls every method on
all ranks of the role at once; ``batch`` arguments are already the rank's data-parallel
shard (see ``Batch.balanced_partition``), and per-rank results are gathered back in the
original sample order by the controller. Methods are synchronous on the rank.

Lifecycle: ``__init__(ctx)`` (cheap) -> ``init_model()`` (joins the process group, builds
and shards the model, optimizer and LR schedule when ``ctx.optim`` is given) ->
any number of operations -> ``shutdown()``.

Loss functions come from the algorithm plugin (see :class:`LossFn`). Token-weight
convention: the algorithm puts a ``token_weight`` field in the batch so that
``sum(weight * per_token_loss)`` over *all* tokens of the mini-batch on *all* ranks is the
loss it wants (token-mean, sequence-mean...). The backend therefore sums micro-batch losses
without dividing, and compensates the data-parallel gradient averaging (multiplies by the
data-parallel size) so the gradient is that of the global sum. Every rank must run the same
number of forward/backward passes (pad with empty micro-batches if needed).

Failure: any exception propagates to the controller, which reports it with role and rank.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from rlweave.interfaces.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave.data.batch import Batch


class ModelOutputs(Protocol):
    """Per-token outputs of a forward pass on a packed micro-batch, aligned with
    ``batch.token['input_ids']`` under the prediction convention (``logprobs[t]`` is
    ``log p(input_ids[t] | input_ids[<t])``, 0 at each sample's first token).

    ``logprobs`` (with grad), ``entropy`` (when requested, else None), ``values``
    (value-head models, else None)."""

    logprobs: "torch.Tensor"
    entropy: "torch.Tensor | None"
    values: "torch.Tensor | None"


class LossFn(Protocol):
    """``loss_fn(outputs, micro_batch) -> (loss, metrics)``.

    Must be picklable (a module-level function or a small dataclass instance) because it
    travels to the ranks. ``loss`` is a scalar tensor following the token-weight
    convention above; ``metrics`` are floats summed over micro-batches and ranks by the
    backend (so return token-weighted sums when a mean is wanted), except keys ending in
    ``_max`` or ``_min``, reduced by max and min (:func:`merge_metric`).

    Optional attributes a backend reads from the loss function: ``temperature`` (float,
    default 1.0: ``outputs.logprobs`` are those of ``logits / temperature``, as
    ``compute_logprobs(temperature=...)`` computes them) and ``needs_entropy`` (bool,
    default True: whether ``outputs.entropy`` is computed)."""

    def __call__(self, outputs: ModelOutputs, batch: "Batch") -> tuple["torch.Tensor", dict[str, float]]: ...


def merge_metric(key: str, total: float | None, value: float) -> float:
    """A loss metric ``value`` combined into the ``total`` so far (None: none yet) over
    micro-batches and ranks: the maximum for keys ending in ``_max``, the minimum for keys
    ending in ``_min``, else the sum."""
    if total is None:
        return 0.0 + value
    if key.endswith("_max"):
        return max(total, value)
    if key.endswith("_min"):
        return min(total, value)
    return total + value


class TrainingWorker(Worker):
    """Trains and/or scores one model on one rank."""

    @abstractmethod
    def init_model(self) -> None:
        """Build, shard and (if ``ctx.optim``) set up optimizer and LR schedule."""

    @abstractmethod
    def compute_logprobs(self, batch: "Batch", temperature: float = 1.0, with_entropy: bool = False) -> dict[str, "torch.Tensor"]:
        """``{"logprobs": (T,), "entropy": (T,) if requested}`` for this rank's shard, no grad.
        A backend whose record says ``lora`` also takes ``adapters=False``: the log-probs of the
        role's base model, its LoRA adapters switched off."""

    def compute_values(self, batch: "Batch") -> "torch.Tensor":
        """Per-token values ``(T,)`` (value-head models)."""
        raise NotImplementedError(f"{type(self).__name__} does not compute values")

    def compute_scores(self, batch: "Batch") -> "torch.Tensor":
        """Per-sample scalar scores ``(n,)`` read at each sample's last token (reward models)."""
        raise NotImplementedError(f"{type(self).__name__} does not compute scores")

    @abstractmethod
    def train_step(self, batch: "Batch", loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step on this rank's shard of a mini-batch: micro-batches by token
        budget, gradient accumulation, grad-norm clipping, optimizer and LR-schedule step.
        Returns *global* metrics, identical on every rank (reduced across data-parallel
        ranks by the backend): at least ``loss``, ``grad_norm``, ``lr``, ``tokens``, ``time_s``,
        plus the sums of the loss function's own metrics."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        """Stream the full (unsharded) weights as ``(hf_name, tensor)`` in a stable order,
        without materialising the whole model on every rank. All ranks must iterate it
        together (it may run collectives); only rank 0 yields tensors."""

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Sharded checkpoint (model, optimizer, LR schedule, RNG) into ``path``; all ranks."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote, so training continues exactly."""

    @abstractmethod
    def save_hf(self, path: str) -> None:
        """Hugging Face format (config, safetensors, tokenizer if known) loadable by
        transformers and vLLM; rank 0 writes, all ranks call."""

    def save_adapter(self, path: str) -> None:
        """A LoRA role's adapter as a PEFT adapter directory in ``path`` (backends whose record
        says ``lora``); rank 0 writes, all ranks call."""
        raise NotImplementedError(f"{type(self).__name__} does not train LoRA adapters")

    def offload(self) -> dict[str, Any]:
        """Move parameters/optimizer state to CPU memory between phases; returns bytes freed."""
        return {"freed_bytes": 0}

    def onload(self) -> dict[str, Any]:
        """Undo :meth:`offload`."""
        return {}
