"""A run's training data: its configured splits opened, and a seeded, resumable batch iterator.

Contracts:

* :func:`open_data` opens ``data.train`` and ``data.eval`` of a run's config as
  :class:`~rlweave.data.records.RecordDataset` (reading and checking records is
  :mod:`rlweave.data.records`); a bad file is a :class:`~rlweave.config.errors.ConfigError`
  at its key.
* :class:`DataIterator` yields batches of ``batch_size`` records forever, epoch after epoch;
  with ``shuffle`` each epoch's order is a permutation seeded by ``(seed, epoch)``. A batch
  that crosses an epoch boundary takes the end of one epoch and the start of the next.
  ``state_dict()`` -> ``load_state_dict()`` on a fresh iterator over the same data gives
  exactly the same next batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlweave.data.formats import DataError
from rlweave.data.records import RecordDataset, open_split

__all__ = ["DataIterator", "open_data"]


def open_data(data: Any, tokenizer: Any, source: str = "<config>") -> tuple[RecordDataset | None, RecordDataset | None]:
    """``(train, eval)`` datasets of a run's ``data`` section (None where not configured).

    ``data.chat_template``, when set, becomes ``tokenizer.chat_template``, so that what the
    algorithm renders and the tokenizer saved with the model use the template the data was
    rendered with. A bad file raises :class:`~rlweave.config.errors.ConfigError` at
    ``data.train`` / ``data.eval`` with the one-line :class:`DataError` message."""
    from rlweave.config.errors import ConfigError, ConfigIssue
    from rlweave.data.chat import read_template

    if getattr(data, "chat_template", None) and tokenizer is not None:
        tokenizer.chat_template = read_template(data.chat_template)
    out = []
    for split in ("train", "eval"):
        try:
            out.append(open_split(data, split, tokenizer))
        except (DataError, FileNotFoundError) as exc:
            raise ConfigError([ConfigIssue(source, f"data.{split}", str(exc))]) from None
    return out[0], out[1]


class DataIterator:
    """Seeded, resumable stream of batches over a dataset (see the module docstring)."""

    def __init__(self, dataset: RecordDataset | list[dict[str, Any]], batch_size: int, seed: int = 0,
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
