"""Placeholder for the megatron-core worker: importing it raises NotImplementedError.

``BackendRecord.load()`` imports this module, so a run that gets past validation still
stops here, before any worker starts, with the reason.
"""

from rlweave_backend_megatron import NOT_IMPLEMENTED

raise NotImplementedError(NOT_IMPLEMENTED)
