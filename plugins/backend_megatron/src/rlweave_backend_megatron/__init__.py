"""rlweave training backend on megatron-core (TP/PP/DP) — registered, not implemented yet.

The plugin registers the name ``megatron`` so users see it in ``rlweave list-plugins``
(status ``unavailable``, with :data:`UNAVAILABLE` as the reason, from the record's probe)
and a config selecting it fails at ``rlweave validate`` with that reason instead of
"unknown backend"; importing the worker module raises :data:`NOT_IMPLEMENTED`.
"""

UNAVAILABLE = (
    "not implemented yet: megatron-core's distributed optimizer (get_megatron_optimizer) needs CUDA, "
    "so it cannot run on this CPU-only setup; use backend 'fsdp' instead"
)

NOT_IMPLEMENTED = f"the megatron-core training backend (rlweave-backend-megatron) is {UNAVAILABLE}"


def probe() -> str:
    """Why the backend cannot run here (always: it is not implemented yet)."""
    return UNAVAILABLE


__all__ = ["NOT_IMPLEMENTED", "UNAVAILABLE", "probe"]
