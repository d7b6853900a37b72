"""The layout of an RL algorithm's checkpoint state (``state.json``'s ``algorithm``), and its
migration from the layouts that algorithms wrote before they shared the step toolkit.

Format 2 (written by :meth:`rlweave.algo_helpers.experience.ExperienceKit.state_dict` and the
algorithm's own keys beside it)::

    {"format": 2, "steps_done": int, "samples_seen": int, "pipeline": {...},
     "kl": {...} (GRPO, PPO), "reward_moments": {...}, "ptx": {...} (PPO), "tied_total": int (OnlineDPO)}

Format 1 (no ``format`` key) is migrated on load, said once in the log: OnlineDPO's ``steps`` is
``steps_done``, PPO's ``kl_ctl`` is ``kl``; GRPO's keys are unchanged. A format newer than this
rlweave knows is refused with a clear error.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("rlweave.algo")

FORMAT = 2
#: format 1 key -> format 2 key
RENAMED = {"steps": "steps_done", "kl_ctl": "kl"}


class StateFormatError(ValueError):
    """An algorithm state this rlweave cannot read."""


def migrate(state: dict[str, Any], algorithm: str) -> dict[str, Any]:
    """``state`` in format 2 (a copy); see the module docstring."""
    state = dict(state or {})
    fmt = state.get("format", 1 if state else FORMAT)
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise StateFormatError(f"{algorithm}: the checkpoint's algorithm state has format {fmt!r}, newer than this "
                               f"rlweave reads ({FORMAT}); resume with the rlweave version that wrote it")
    if fmt == FORMAT:
        return state
    out = {RENAMED.get(k, k): v for k, v in state.items()}
    out["format"] = FORMAT
    log.warning("%s: the checkpoint's algorithm state was written by an earlier rlweave (format %d); migrated to "
                "format %d (renamed: %s)", algorithm, fmt, FORMAT,
                ", ".join(f"{a} -> {b}" for a, b in RENAMED.items() if a in state) or "nothing")
    return out
