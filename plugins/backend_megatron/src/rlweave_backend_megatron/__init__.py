"""rlweave training backend on megatron-core (TP/PP/DP) — registered, not implemented yet.

The plugin registers the name ``megatron`` so users see it in ``rlweave list-plugins``
and get a clear "not implemented" error (at ``rlweave validate`` time, and again if the
worker module is imported) instead of "unknown backend".
"""

NOT_IMPLEMENTED = (
    "the megatron-core training backend (rlweave-backend-megatron) is not implemented yet: "
    "megatron-core's distributed optimizer (get_megatron_optimizer) needs CUDA, so it cannot run "
    "on this CPU-only setup; use backend 'fsdp' instead"
)

__all__ = ["NOT_IMPLEMENTED"]
