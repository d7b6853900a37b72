"""Fault injection for reliability tests: make one rank hang or die at a chosen call.

``RLWEAVE_FAULTS`` holds comma-separated rules ``role:rank:method:action[@n]``:

* ``action``: ``hang`` (the call sleeps for ever, as a deadlocked rank would), ``kill`` (the
  process SIGKILLs itself, as the OOM killer would) or ``raise`` (the call raises
  ``RuntimeError``, an ordinary worker bug);
* ``n``: the rule fires on the n-th call (1-based, default 1) of ``method`` on that rank, once.

Example: ``RLWEAVE_FAULTS=policy:0:train_step:hang@3`` hangs the policy's rank 0 in its third
``train_step``. The scheduler passes the variable from the controller to every rank it
starts; a rank built again after a recovery starts with fresh counts, so a rule can fire
again there. With ``RLWEAVE_FAULTS_FIRED`` naming a directory (passed on the same way), a rule
that fires leaves a marker file there first and never fires again in the run, in any process
(a fault during the first setup of a role, say, that its rebuilt rank would otherwise repeat).
Without the variables nothing is checked beyond one dictionary lookup per call.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "RLWEAVE_FAULTS"
#: a directory of markers of the rules that fired (each fires once per run)
FIRED_ENV = "RLWEAVE_FAULTS_FIRED"
ACTIONS = ("hang", "kill", "raise")


@dataclass(frozen=True)
class Fault:
    role: str
    rank: int
    method: str
    action: str
    nth: int = 1

    @property
    def marker(self) -> str:
        """The file name that records this rule fired (:data:`FIRED_ENV`)."""
        return f"{self.role}-{self.rank}-{self.method}-{self.action}-{self.nth}"


def parse(text: str) -> list[Fault]:
    """The rules of ``text``; ``ValueError`` names a malformed one."""
    out = []
    for rule in filter(None, (r.strip() for r in text.split(","))):
        head, _, nth = rule.partition("@")
        parts = head.split(":")
        if len(parts) != 4 or parts[3] not in ACTIONS or not parts[1].isdigit() or (nth and not nth.isdigit()):
            raise ValueError(f"{ENV}: bad rule {rule!r}; expected role:rank:method:{'|'.join(ACTIONS)}[@n]")
        out.append(Fault(parts[0], int(parts[1]), parts[2], parts[3], int(nth or 1)))
    return out


class FaultPlan:
    """The rules for one rank, with per-method call counts."""

    def __init__(self, role: str, rank: int, text: str | None = None, fired: str | None = None) -> None:
        text = os.environ.get(ENV, "") if text is None else text
        self.fired = (os.environ.get(FIRED_ENV) or None) if fired is None else fired
        self.rules = {f.method: f for f in parse(text) if f.role == role and f.rank == rank} if text else {}
        if self.fired:
            self.rules = {m: f for m, f in self.rules.items() if not os.path.exists(os.path.join(self.fired, f.marker))}
        self.calls: dict[str, int] = {}

    def before(self, method: str) -> None:
        """Count a call of ``method`` and fire its rule when due."""
        rule = self.rules.get(method)
        if rule is None:
            return
        self.calls[method] = n = self.calls.get(method, 0) + 1
        if n != rule.nth:
            return
        if self.fired:
            try:  # exclusive: one process fires it
                with open(os.path.join(self.fired, rule.marker), "x", encoding="utf-8") as f:
                    f.write(f"{os.getpid()}\n")
            except FileExistsError:
                return
        if rule.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if rule.action == "raise":
            raise RuntimeError(f"injected fault: {rule.role} rank {rule.rank} {method} call {n}")
        while True:  # hang
            time.sleep(3600)
