"""What every run mode that generates while the policy trains needs of a run config (light)."""

from __future__ import annotations

from typing import Any


def overlap_problems(mode: str, cfg: Any) -> list[tuple[str, str]]:
    """``(key path, message)`` when the rollout role cannot keep generating during training: put
    away between phases (``resources.offload: always``) or sharing devices with another role."""
    out = []
    if cfg.resources.offload == "always":
        out.append(("resources.offload", f"run.mode {mode!r} keeps the rollout engine generating while the policy "
                    "trains, so it cannot be put away between phases; use offload: auto or never"))
    for group in cfg.resources.colocate:
        if "rollout" in group and len(group) > 1:
            others = ", ".join(r for r in group if r != "rollout")
            out.append(("resources.colocate", f"run.mode {mode!r} generates while the policy trains, so the rollout "
                        f"role needs devices of its own; it is colocated with {others}"))
    return out
