"""Which entry points may load: the ``RLWEAVE_PLUGINS`` / ``RLWEAVE_DISABLE_PLUGINS`` rules.

Both variables hold comma-separated names; a name matches an entry point by its entry-point
name or by its distribution name (case-insensitive, ``-`` and ``_`` alike).

* ``RLWEAVE_DISABLE_PLUGINS=megatron,rlweave-infer-sglang``: those are not imported and show
  as ``disabled``.
* ``RLWEAVE_PLUGINS=fsdp,grpo``: only those load (an empty value loads none). Plugins of the
  core distribution ``rlweave`` itself (built-ins) are not affected by the allow list; they
  can still be blocked by the block list.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

ALLOW_ENV = "RLWEAVE_PLUGINS"
BLOCK_ENV = "RLWEAVE_DISABLE_PLUGINS"
CORE_DISTRIBUTION = "rlweave"


def canonical(name: str) -> str:
    """Normalise a plugin or distribution name for comparison (PEP 503 style)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _names(value: str) -> set[str]:
    return {canonical(n) for n in value.split(",") if n.strip()}


def disabled_reason(entry_point: str, distribution: str, env: Mapping[str, str] | None = None) -> str | None:
    """Return why this entry point must not load (a sentence naming the variable), or None."""
    env = os.environ if env is None else env
    keys = {canonical(entry_point), canonical(distribution)}
    block = env.get(BLOCK_ENV)
    if block and keys & _names(block):
        return f"disabled by {BLOCK_ENV}={block}"
    allow = env.get(ALLOW_ENV)
    if allow is not None and canonical(distribution) != CORE_DISTRIBUTION and not keys & _names(allow):
        return f"not in {ALLOW_ENV}={allow}"
    return None
