"""Role views: a role an algorithm asks for, served by another role's ranks.

:class:`AdaptersDisabled` is the ``reference`` role of a run whose policy trains LoRA adapters and
whose reference is the policy's base model (``algorithm.reference``, :mod:`rlweave.config.lora`):
its log-probs are the policy ranks' ``compute_logprobs(..., adapters=False)``. It has no ranks,
devices or checkpoints of its own: ``offload``/``onload``/``shutdown`` leave the policy alone, and
the runner writes no workers or checkpoints for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlweave.scheduler.future import RoleFuture

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.data.batch import Batch


class AdaptersDisabled:
    """The reference role as the policy with its LoRA adapters off.

    ``roles`` is the run's live mapping of role handles: the source (``source``, default
    ``policy``) is looked up at each call, so a policy rebuilt after a lost worker is used."""

    def __init__(self, roles: Mapping[str, Any], name: str = "reference", source: str = "policy"):
        self.name = name
        self.view_of = source
        self._roles = roles

    @property
    def source(self) -> Any:
        return self._roles[self.view_of]

    @property
    def world_size(self) -> int:
        return self.source.world_size

    @property
    def dp(self) -> int:
        return self.source.dp

    @property
    def parallel(self) -> dict[str, int]:
        return self.source.parallel

    @property
    def closed(self) -> bool:
        return self.source.closed

    def logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> RoleFuture:
        """The policy's base-model log-probs ``{"logprobs": (T,), ...}`` in batch order."""
        kw = {"temperature": temperature, "with_entropy": with_entropy, "adapters": False}
        return self.source._dp_call("compute_logprobs", (batch,), kw, None)

    def offload(self) -> RoleFuture:
        return RoleFuture.ready([{"freed_bytes": 0}])

    def onload(self) -> RoleFuture:
        return RoleFuture.ready([{"loaded_bytes": 0}])

    def ping(self) -> RoleFuture:
        return self.source.ping()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Nothing to end: the ranks are the policy's."""

    def kill(self, release: bool = True) -> None:
        """Nothing to end: the ranks are the policy's."""

    def __getattr__(self, method: str) -> Any:
        raise AttributeError(f"role {self.name!r} is the {self.view_of} with its LoRA adapters disabled "
                             f"(algorithm.reference); it only computes log-probs, not {method}()")

    def __repr__(self) -> str:
        return f"AdaptersDisabled({self.name!r} of {self.view_of!r})"


def is_view(handle: Any) -> bool:
    """Whether ``handle`` is a view of another role (no ranks of its own)."""
    return isinstance(getattr(handle, "view_of", None), str)
