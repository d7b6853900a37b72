"""rlweave training backend on torch FSDP2.

Light package: importing it (or :mod:`.plugin`, :mod:`.config`) imports no torch; the
worker lives in :mod:`rlweave_backend_fsdp.worker` and is loaded only when selected.
"""

__version__ = "0.1.0"
