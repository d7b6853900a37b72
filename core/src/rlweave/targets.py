"""Import targets: ``"package.module:attr.sub"`` strings that name an object to import later.

Plugin records point at their heavy code this way (:meth:`rlweave.plugins.types.PluginRecord.load`),
and so do the kernels a worker is handed (:meth:`rlweave.interfaces.worker.WorkerContext.kernel`)
and the named algorithm parts. Imports nothing of rlweave, so every layer can use it.
"""

from __future__ import annotations

import importlib
from typing import Any


def import_target(target: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute.

    Raises ImportError/AttributeError with the target named, so a broken selection
    says which plugin object could not be loaded.
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"import target {target!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
