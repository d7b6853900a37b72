"""Repair a config that failed pass one, so that pass two can still report its own problems.

"Every error at once" holds across both passes: when the core schema rejects parts of a
config, :class:`Repair` drops exactly those parts so that their defaults apply — a value of
the wrong type or out of range, an unknown key, and the list entry or mapping that lacks a
required key — and validates again (a few rounds at most). Pass two then runs on the repaired
config. Its issues name paths of the repaired config; :meth:`Repair.original` maps them back
(an entry dropped from a list shifts the indices after it), so every message points at the
user's own file.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

MAX_ROUNDS = 8

Loc = tuple[Any, ...]


def _order(loc: Loc) -> tuple[tuple[int, Any], ...]:
    """Sort key: list indices compare as numbers, keys as text (so mixed locations sort)."""
    return tuple((0, p) if isinstance(p, int) else (1, str(p)) for p in loc)


class Repair:
    """Drops the invalid parts of a copy of ``data`` until ``model`` accepts it.

    Attributes:
        data: the repaired mapping (a deep copy; the caller's data is untouched).
        drops: ``(list location, index)`` of every list entry removed, in order.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = copy.deepcopy(data)
        self.drops: list[tuple[tuple[str, ...], int]] = []

    def run(self, model: type[BaseModel], errors: Sequence[dict[str, Any]]) -> BaseModel | None:
        """Validate after dropping what ``errors`` (pydantic's ``exc.errors()``) point at.

        Returns the validated model, or ``None`` when it still fails after
        :data:`MAX_ROUNDS` rounds or a round finds nothing left to drop.
        """
        for _ in range(MAX_ROUNDS):
            targets = self._targets(errors)
            if not targets:
                return None
            for loc in targets:
                self._drop(loc)
            try:
                return model.model_validate(self.data)
            except ValidationError as exc:
                errors = exc.errors()
        return None

    def original(self, path: str) -> str:
        """The dotted ``path`` of the repaired config as a path of the original one."""
        parts = path.split(".")
        for where, index in reversed(self.drops):
            n = len(where)
            if tuple(parts[:n]) == where and len(parts) > n and parts[n].isdigit() and int(parts[n]) >= index:
                parts[n] = str(int(parts[n]) + 1)
        return ".".join(parts)

    # ------------------------------------------------------------------ internals
    def _existing(self, loc: Loc) -> Loc:
        """The longest prefix of ``loc`` that exists in the data."""
        node: Any = self.data
        out: list[Any] = []
        for part in loc:
            if isinstance(node, dict) and part in node or isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
            else:
                break
            out.append(part)
        return tuple(out)

    def _targets(self, errors: Sequence[dict[str, Any]]) -> list[Loc]:
        locs = set()
        for err in errors:
            loc = tuple(err["loc"])
            if err["type"] == "missing":  # the entry or mapping that lacks the key goes
                loc = loc[:-1]
            loc = self._existing(loc)
            if not loc:  # the top level itself: nothing sensible to drop
                return []
            locs.add(loc)
        outer = [loc for loc in locs if not any(o != loc and loc[:len(o)] == o for o in locs)]
        return sorted(outer, key=_order, reverse=True)  # later list entries first: indices stay valid

    def _drop(self, loc: Loc) -> None:
        parent: Any = self.data
        for part in loc[:-1]:
            parent = parent[part]
        if isinstance(parent, list):
            del parent[loc[-1]]
            self.drops.append((tuple(str(p) for p in loc[:-1]), loc[-1]))
        else:
            del parent[loc[-1]]
