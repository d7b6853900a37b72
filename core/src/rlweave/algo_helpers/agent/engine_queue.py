"""The requests of every episode, batched into the rollout's engine calls.

The endpoint's handlers :meth:`EngineQueue.submit` one prompt (a sample's ids) with its sampling;
one thread takes what is queued, waits while more arrive (each within ``gather_s`` of the last,
until as many as there are agents running), and makes one ``generate`` call per distinct
sampling. That is the call the episode rollout makes (``Rollout.run``'s ``generate``), so
log-probs and weight versions come back exactly as they do for environment episodes. A request
without a seed gets the run's seed plus a count of the calls, so a run is as reproducible as its
agents' timing.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.interfaces.rollout import GenerateFn


class EngineQueue:
    """See the module docstring. ``waiting()``: how many agents could send a request now (the
    batch is not waited for beyond that many). :meth:`close` ends the thread; requests still queued
    fail with ``RuntimeError``."""

    def __init__(self, generate: GenerateFn, waiting: Callable[[], int], seed: int | None, gather_s: float = 0.005):
        self.generate, self.waiting, self.seed, self.gather_s = generate, waiting, seed, gather_s
        self.calls = 0
        self.busy_s = 0.0  # seconds inside generate
        self._q: queue.Queue[tuple[list[int], SamplingParams, Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="rlweave-agent-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[list[Generation]]":
        """The generations of ``prompt`` (``params.n`` of them), when its engine call returns."""
        fut: Future = Future()
        self._q.put((list(prompt), params, fut))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        stop = False
        while not stop:
            item = self._q.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < max(1, self.waiting()):
                try:
                    item = self._q.get(timeout=self.gather_s)
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._run(batch)
        self._fail_queued()

    def _run(self, batch: list[tuple[list[int], SamplingParams, Future]]) -> None:
        groups: dict[str, list[tuple[list[int], SamplingParams, Future]]] = {}
        for entry in batch:
            groups.setdefault(repr(entry[1]), []).append(entry)
        for entries in groups.values():
            params = entries[0][1]
            if params.seed is None and self.seed is not None:
                params = dataclasses.replace(params, seed=int(self.seed) + 7919 * self.calls)
            self.calls += 1
            t0 = time.perf_counter()
            try:
                gens = self.generate([p for p, _, _ in entries], params)
            except BaseException as exc:  # noqa: BLE001 - every waiting request gets the engine's failure
                for _, _, fut in entries:
                    fut.set_exception(exc)
                continue
            finally:
                self.busy_s += time.perf_counter() - t0
            for (_, _, fut), gen in zip(entries, gens):
                fut.set_result(gen)

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[2].set_exception(RuntimeError("the rollout's engine calls have ended"))
