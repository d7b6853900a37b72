"""A run directory's config: the file ``rlweave train`` writes there, and reading a run config
back without checking its inputs (the data files of a finished run may be gone).

Shared by :mod:`.source` (which model an argument names) and :mod:`.export` (a checkpoint to a
Hugging Face directory). Imports no torch or ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: the resolved config ``rlweave train`` writes into a run directory
RUN_CONFIG = "config.resolved.yaml"


def load_run_config(path: Path, pm: Any) -> tuple[Any, Any]:
    """``(cfg, resolved)`` of a run config (a YAML file), validated without its inputs (the data
    files of a finished run may be gone). Raises ``ConfigError`` listing every problem."""
    from rlweave.config.loader import load_config

    return load_config(path, (), pm, check_inputs=False)
