"""Residency: which roles hold their device memory in which phase of a step.

When roles share devices (``resources.colocate``) they take turns: before a phase, the roles
idle in it are put away (training and scoring roles ``offload()`` parameters and optimizer
state to CPU memory; engine roles ``sleep()``, releasing their KV cache, and weights where the
engine supports it), then the roles the phase needs are brought back (``onload()`` /
``wake_up()``). Roles on devices of their own never move; their calls simply overlap.

An algorithm names its phases and the roles each one needs, e.g. for GRPO::

    {"generate": ("rollout",), "experience": ("policy", "reference"), "train": ("policy",),
     "sync": ("policy", "rollout"), "rest": ("policy", "rollout")}

(a name ending in ``*`` matches every role with that prefix, e.g. ``reward*``), builds one
:class:`Residency` with :meth:`Residency.for_run`, and calls :meth:`Residency.enter` at the
start of each phase. Every algorithm ends a step (and an evaluation) in a phase where its
trained roles are resident (conventionally ``rest``), so the runner can checkpoint them.

``resources.offload`` picks which roles move: ``auto`` (roles that share devices with
another role of the run), ``always`` (every role; for tests and memory-bound runs),
``never``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

#: roles that are inference engines (``sleep``/``wake_up``); every other role ``offload``/``onload``s
ENGINE_ROLES = ("rollout",)
MODES = ("auto", "always", "never")
#: phases of algorithms that train without generating and evaluate through a rollout role
#: (SFT, DPO): the rollout role sleeps except to receive weights and to answer held-out prompts
EVAL_PHASES = {
    "sync": ("policy", "rollout"),
    "eval": ("rollout",),
    "rest": ("policy", "reference"),
}


def colocated_roles(colocate: Iterable[Iterable[str]], roles: Iterable[str]) -> set[str]:
    """Roles of ``roles`` that share devices with at least one other of them."""
    have = set(roles)
    out: set[str] = set()
    for group in colocate:
        members = [r for r in group if r in have]
        if len(members) > 1:
            out.update(members)
    return out


def _matches(pattern: str, role: str) -> bool:
    return pattern == role or (pattern.endswith("*") and role.startswith(pattern[:-1]))


class Residency:
    """Moves ``roles`` (name -> role handle) between the ``phases`` of a step.

    ``phases``: phase name -> the roles it needs. ``colocate``: groups of roles sharing
    devices. ``mode``: see the module docstring. ``engines``: roles that sleep and wake
    instead of offloading. ``moves`` records ``(phase, role, "out" | "in")`` in order.
    """

    def __init__(self, roles: Mapping[str, Any], phases: Mapping[str, Iterable[str]],
                 colocate: Iterable[Iterable[str]] = (), mode: str = "auto", engines: Iterable[str] = ENGINE_ROLES):
        if mode not in MODES:
            raise ValueError(f"resources.offload: {mode!r}; choose {', '.join(MODES)}")
        self.roles = dict(roles)
        self.phases = {name: tuple(needed) for name, needed in phases.items()}
        self.engines = set(engines)
        if mode == "never":
            self.movable: set[str] = set()
        elif mode == "always":
            self.movable = set(self.roles)
        else:
            self.movable = colocated_roles(colocate, self.roles)
        self.resident = {r: True for r in self.roles}
        self.moves: list[tuple[str, str, str]] = []

    @classmethod
    def for_run(cls, ctx: Any, roles: Iterable[str], phases: Mapping[str, Iterable[str]]) -> "Residency":
        """A residency for the run of ``ctx`` (a ``RunContext``): the handles of ``roles``
        (those present in the run with ranks of their own), ``resources.colocate`` and ``resources.offload`` from its
        config (``auto`` and no colocation when the context has no config)."""
        resources = getattr(ctx.config, "resources", None)
        colocate = getattr(resources, "colocate", None) or ()
        mode = getattr(resources, "offload", None) or "auto"
        # a view (rlweave.scheduler.views: the reference as the policy with adapters off, named in
        # ``view_of``) has no ranks: it moves with the role it views
        own = {r: h for r, h in ctx.roles.items() if not isinstance(getattr(h, "view_of", None), str)}
        return cls({r: own[r] for r in roles if r in own}, phases, colocate, mode)

    def needs(self, phase: str, role: str) -> bool:
        """Whether ``phase`` needs ``role`` resident."""
        if phase not in self.phases:
            raise KeyError(f"unknown phase {phase!r}; phases: {', '.join(self.phases)}")
        return any(_matches(p, role) for p in self.phases[phase])

    def moving(self, *roles: str) -> bool:
        """Whether all of ``roles`` move between phases (e.g. train policy and critic one
        after the other instead of side by side when both do)."""
        return all(r in self.movable for r in roles)

    def enter(self, phase: str) -> float:
        """Put away the movable roles ``phase`` does not need first (freeing memory), then
        bring back the ones it needs; waits for all of it and returns the seconds spent."""
        t0 = time.perf_counter()
        outs = sorted(r for r in self.movable if self.resident[r] and not self.needs(phase, r))
        ins = sorted(r for r in self.movable if not self.resident[r] and self.needs(phase, r))
        self._move(phase, outs, out=True)
        self._move(phase, ins, out=False)
        return time.perf_counter() - t0

    def during(self, phase: str, fn: Callable[..., Any], *args: Any, then: str = "rest", **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in ``phase``, then enter ``then``; returns ``fn``'s result
        (on an error the roles stay as they are: the run is ending or recovering)."""
        self.enter(phase)
        out = fn(*args, **kwargs)
        self.enter(then)
        return out

    def only(self, role: str, phase: str) -> float:
        """Inside ``phase``, keep only ``role`` resident among the movable roles the phase
        needs (to run them one at a time); returns the seconds spent."""
        t0 = time.perf_counter()
        others = sorted(r for r in self.movable if r != role and self.resident[r] and self.needs(phase, r))
        self._move(phase, others, out=True)
        if role in self.movable and not self.resident[role]:
            self._move(phase, [role], out=False)
        return time.perf_counter() - t0

    def _move(self, phase: str, roles: list[str], out: bool) -> None:
        futures = [self._call(r, out) for r in roles]
        for role, future in zip(roles, futures):
            future.result()
            self.resident[role] = not out
            self.moves.append((phase, role, "out" if out else "in"))

    def _call(self, role: str, out: bool) -> Any:
        h = self.roles[role]
        if role in self.engines:
            return h.sleep() if out else h.wake_up()
        return h.offload() if out else h.onload()
