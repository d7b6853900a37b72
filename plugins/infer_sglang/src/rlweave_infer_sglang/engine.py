"""Placeholder for the SGLang engine: importing it raises NotImplementedError.

``EngineRecord.load()`` imports this module, so a run that gets past validation still
stops here, before any worker starts, with the reason.
"""

from rlweave_infer_sglang import NOT_IMPLEMENTED

raise NotImplementedError(NOT_IMPLEMENTED)
