"""Training data: jsonl records with stable ids, and a seeded, resumable batch iterator.

Contracts:

* :class:`JsonlDataset` reads every non-blank line of a jsonl file as one record (a JSON
  object). Each record gets a stable string ``"id"``: its own ``"id"`` field when present,
  else ``"<file stem>:<line number>"`` (1-based). Bad JSON, a non-object line, a duplicate
  id or a missing required key raises ``ValueError`` naming the file and line.
* :class:`DataIterator` yields batches of ``batch_size`` records forever, epoch after epoch;
  with ``shuffle`` each epoch's order is a permutation seeded by ``(seed, epoch)``. A batch
  that crosses an epoch boundary takes the end of one epoch and the start of the next.
  ``state_dict()`` -> ``load_state_dict()`` on a fresh iterator over the same data gives
  exactly the same next batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


class JsonlDataset:
    """Records of a jsonl file, each with a stable ``"id"`` (see module docstring).

    Args:
        path: the jsonl file.
        required: keys every record must have (e.g. ``("prompt",)`` for GRPO).
    """

    def __init__(self, path: str | Path, required: Iterable[str] = ()) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"data file not found: {self.path}")
        required = tuple(required)
        self.records: list[dict[str, Any]] = []
        first_line: dict[str, int] = {}
        with self.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{self.path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
                missing = [k for k in required if k not in rec]
                if missing:
                    raise ValueError(f"{self.path}:{lineno}: missing key(s) {missing} (has {sorted(rec)})")
                rid = str(rec["id"]) if "id" in rec else f"{self.path.stem}:{lineno}"
                if rid in first_line:
                    raise ValueError(f"{self.path}:{lineno}: duplicate id {rid!r} (first on line {first_line[rid]})")
                first_line[rid] = lineno
                rec["id"] = rid
                self.records.append(rec)
        if not self.records:
            raise ValueError(f"{self.path}: no records")

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]

    def __iter__(self):
        return iter(self.records)

    def head(self, k: int | None) -> list[dict[str, Any]]:
        """The first ``k`` records (all when ``k`` is None), e.g. ``data.eval_size``."""
        return self.records if k is None else self.records[:k]


class DataIterator:
    """Seeded, resumable stream of batches over a dataset (see module docstring)."""

    def __init__(self, dataset: JsonlDataset | list[dict[str, Any]], batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) == 0:
            raise ValueError("DataIterator: empty dataset")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0  # index into the current epoch's order
        self._order = self._make_order(0)

    def _make_order(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def next_batch(self) -> list[dict[str, Any]]:
        """The next ``batch_size`` records (shared dicts; copy before mutating)."""
        out: list[dict[str, Any]] = []
        while len(out) < self.batch_size:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._make_order(self.epoch)
            take = min(self.batch_size - len(out), len(self._order) - self.position)
            out.extend(self.dataset[int(i)] for i in self._order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: ``{epoch, position, seed, shuffle, batch_size, size}``."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "batch_size": self.batch_size, "size": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the data size, seed and shuffle must match the saved run."""
        for key, mine in (("size", len(self.dataset)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise ValueError(f"data iterator state: {key} was {state[key]!r} when saved, now {mine!r}; "
                                 "resume with the same data and seed")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._make_order(self.epoch)
