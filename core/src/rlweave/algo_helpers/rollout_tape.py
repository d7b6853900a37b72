"""Rollout dump and replay: what a step generated and how it was rewarded, written with the run
(``rollout.dump``) and read back instead of an engine and the reward sources (``rollout.replay``).

A step's *tape* is the sequence of what the toolkit got from outside the trainers, in order: each
batch a rollout produced (the pipeline's, another round of dynamic sampling, ReMax's greedy
baseline) and each scoring of a batch (the summed rewards, the per-rule breakdown, the sources'
metrics). :class:`TapeWriter` records it and writes ``<run_dir>/rollouts/step_XXXXXX.safetensors``
when the step ends; :class:`TapeReader` hands the same things back in the same order, so the
algorithm's own code runs unchanged and, with the trainers deterministic, reproduces the weights
bitwise.

A step file is safetensors (no pickle): the tensors of event ``i`` are ``{i}.cu_seqlens``,
``{i}.token.<key>``, ``{i}.sample.<key>`` (a batch) or ``{i}.scores`` (a scoring), and the file's
metadata ``rlweave`` is JSON: ``{"step": n, "events": [...]}``, each event with its ``kind``
(``batch`` or ``scores``), ``label``, and ``ids``, ``meta``, ``token`` and ``sample`` key lists
(a batch) or ``breakdown`` and ``metrics`` (a scoring). Every per-token and per-sample tensor of a
batch is kept: token ids, ``loss_mask``, the engine's ``rollout_logprobs``, weight versions, and
MoE routing where the engine reports it (``algorithm.router_replay: r3``: the per-token ``routing``
tensor is written and replayed like any other key). The header beside the steps is
:mod:`rlweave.config.replay`'s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from rlweave.algo_helpers.reward_sources import Contribution, RewardSource
from rlweave.config.replay import DUMP_DIR, dump_folder, step_file, write_header
from rlweave.data.batch import Batch
from rlweave.interfaces.pipeline import Params, Pipeline

META_KEY = "rlweave"


class ReplayError(RuntimeError):
    """A dump does not hold what the replayed step asks for (the settings that shape a step changed)."""


class TapeWriter:
    """Records each step's tape and writes it when the step ends (``rollout.dump``)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._tensors: dict[str, torch.Tensor] = {}
        self._events: list[dict[str, Any]] = []

    def batch(self, batch: Batch, label: str = "generate") -> None:
        """Record a rollout's batch as it is now (later changes to it are not recorded)."""
        i = len(self._events)
        self._tensors[f"{i}.cu_seqlens"] = batch.cu_seqlens.detach().cpu().clone().contiguous()
        for part in ("token", "sample"):
            for key, value in getattr(batch, part).items():
                self._tensors[f"{i}.{part}.{key}"] = value.detach().cpu().clone().contiguous()
        self._events.append({"kind": "batch", "label": label, "ids": list(batch.ids),
                             "meta": [dict(m) for m in batch.meta], "token": list(batch.token),
                             "sample": list(batch.sample)})

    def scores(self, totals: torch.Tensor, breakdown: list[dict] | None, metrics: dict[str, float]) -> None:
        """Record a scoring: each sample's summed reward, the per-rule breakdown, the sources' metrics."""
        i = len(self._events)
        self._tensors[f"{i}.scores"] = totals.detach().cpu().clone().contiguous()
        self._events.append({"kind": "scores", "breakdown": breakdown, "metrics": dict(metrics)})

    def end(self, step: int) -> Path:
        """Write step ``step``'s file (atomically: a temporary file renamed) and start the next tape."""
        from safetensors.torch import save_file

        try:
            meta = json.dumps({"step": int(step), "events": self._events})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"rollout.dump: step {step}'s sample metadata is not JSON-able: {exc}") from None
        path = self.folder / step_file(step)
        tmp = path.with_name(path.name + ".tmp")
        save_file(self._tensors, str(tmp), metadata={META_KEY: meta})
        os.replace(tmp, path)
        self._tensors, self._events = {}, []
        return path


class TapeReader:
    """Hands back each step's tape in order (``rollout.replay``); a step's file is read when the
    step asks for its first event."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._step = -1
        self._events: list[dict[str, Any]] = []
        self._tensors: dict[str, torch.Tensor] = {}
        self._pos = 0

    def _next(self, step: int, kind: str) -> tuple[int, dict[str, Any]]:
        if step != self._step:
            self._load(step)
        if self._pos >= len(self._events) or self._events[self._pos]["kind"] != kind:
            got = self._events[self._pos]["kind"] if self._pos < len(self._events) else "the end of the step"
            raise ReplayError(f"rollout.replay: step {step} asks for its {kind} (event {self._pos}) where the dump has "
                              f"{got}: the settings that shape a step (algorithm, data, rewards) changed")
        self._pos += 1
        return self._pos - 1, self._events[self._pos - 1]

    def _load(self, step: int) -> None:
        from safetensors import safe_open

        path = self.folder / step_file(step)
        if not path.is_file():
            raise ReplayError(f"rollout.replay: {path} is missing: the dump ends before step {step}")
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[META_KEY])
            self._tensors = {k: f.get_tensor(k) for k in f.keys()}
        self._step, self._events, self._pos = step, meta["events"], 0

    def batch(self, step: int) -> Batch:
        """The next batch step ``step`` generated."""
        i, ev = self._next(step, "batch")
        t = self._tensors
        return Batch(cu_seqlens=t[f"{i}.cu_seqlens"], token={k: t[f"{i}.token.{k}"] for k in ev["token"]},
                     sample={k: t[f"{i}.sample.{k}"] for k in ev["sample"]}, ids=list(ev["ids"]),
                     meta=[dict(m) for m in ev["meta"]])

    def scores(self, step: int) -> Contribution:
        """The next scoring of step ``step``, as one reward source's contribution."""
        i, ev = self._next(step, "scores")
        return Contribution(self._tensors[f"{i}.scores"], dict(ev["metrics"]), ev["breakdown"])


class ReplayPipeline(Pipeline):
    """``run.mode: sync`` fed from a dump: each step's batches come from the tape, nothing is
    generated and no weights are synced (there is no engine)."""

    def __init__(self, tape: TapeReader):
        self.tape = tape

    def next_batch(self, records: list[dict[str, Any]], steps_done: int, params: Params) -> Batch:
        return self.tape.batch(steps_done + 1)

    def sync_weights(self, version: int) -> dict[str, float]:
        return {"sync_bytes": 0.0, "time/sync": 0.0}


class ReplayedRewards(RewardSource):
    """Every reward of a replayed step, as the dump recorded it (no reward is computed)."""

    name = "replay"

    def __init__(self, tape: TapeReader, steps_done: Any):
        self.tape, self.steps_done = tape, steps_done

    @classmethod
    def build(cls, ctx: Any, config: Any, wait: Any) -> None:
        return None  # never picked by itself: the toolkit puts it in place of the sources when replaying

    def collect(self, pending: Any, batch: Batch) -> Contribution:
        part = self.tape.scores(self.steps_done() + 1)
        if len(part.scores) != len(batch):
            raise ReplayError(f"rollout.replay: the dump scored {len(part.scores)} samples where the step has "
                              f"{len(batch)}")
        return part


def open_tape(ctx: Any) -> TapeWriter | TapeReader | None:
    """The run's tape: a writer with ``rollout.dump`` (its header written now), a reader with
    ``rollout.replay``, else None (or a context without a run config)."""
    section = getattr(getattr(ctx, "config", None), "rollout", None)
    if getattr(section, "replay", None):
        folder = dump_folder(section.replay)
        if folder is None:
            raise ValueError(f"rollout.replay: no rollout dump at {section.replay!r}")
        return TapeReader(folder)
    if getattr(section, "dump", False):
        write_header(Path(ctx.run_dir), ctx.config)
        return TapeWriter(Path(ctx.run_dir) / DUMP_DIR)
    return None
