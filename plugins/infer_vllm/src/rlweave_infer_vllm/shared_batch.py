"""Generate calls from several threads sharing one vLLM engine's running batch.

vLLM batches continuously: a request added between two engine steps joins the running batch at
the next. :class:`SharedBatch` lets ``generate`` calls made from several threads use that, with one
thread at a time touching the engine:

* a call registers its requests (:class:`EngineCall`) and either becomes the **driver** (no call
  drives) or sleeps on its own event;
* the driver, before each engine step, adds the requests of calls that joined, aborts those of
  calls whose stop flag is set, then steps once and hands every output to the call it belongs
  to; a call whose requests all finished (or were aborted) is woken and returns;
* when the driver's own call is done it hands the driving to a call still waiting.

So a call that joins waits at most one engine step to be in the batch, no thread contends for the
engine between steps, and the waiting threads cost nothing while they sleep. A call waiting for
another's steps also wakes every :data:`WAIT_S` to let its caller's step boundary run (weight
updates land between steps). If a step fails, every call in the batch raises the error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: longest a waiting call sleeps before it looks again (its caller's step boundary runs between looks)
WAIT_S = 0.05


class EngineCall:
    """One ``generate`` call's ``requests`` (``(request id, rendered input, vLLM SamplingParams)``)
    and what came back: each sample's ``latest`` cumulative output and the weight version of each
    of its tokens (``stamps``); ``pending`` holds the request ids not finished, ``aborted`` says
    the stop flag ended it, ``error`` the failure of a step it was part of."""

    def __init__(self, requests: list[tuple[str, Any, Any]], stop_flag: threading.Event):
        self.requests = requests
        self.stop_flag = stop_flag
        self.stamps: dict[tuple[str, int], list[int]] = {(rid, k): [] for rid, _, sp in requests for k in range(sp.n)}
        self.latest: dict[tuple[str, int], Any] = {}
        self.pending: set[str] = {rid for rid, _, _ in requests}
        self.added = False
        self.aborted = False
        self.attended = True  # False once its thread left (the driver aborts its requests)
        self.error: BaseException | None = None
        self.wake = threading.Event()

    def take(self, out: Any, version: int) -> bool:
        """Record a step's output of one of the call's requests; whether the request finished."""
        for o in out.outputs:  # one sample of the request (all of them once finished)
            key = (out.request_id, o.index)
            self.latest[key] = o
            got = self.stamps[key]
            got += [version] * (len(o.token_ids) - len(got))
        if out.finished:
            self.pending.discard(out.request_id)
        return bool(out.finished)


class SharedBatch:
    """See the module docstring. One per engine."""

    def __init__(self) -> None:
        self._mu = threading.Lock()  # guards the fields below (held briefly, never during a step)
        self._driver: EngineCall | None = None
        self._live: list[EngineCall] = []  # calls with requests to add, running or to abort
        self._owners: dict[str, EngineCall] = {}  # request id -> its call

    def run(self, call: EngineCall, engine: Any, *, version: Callable[[], int], before_add: Callable[[Any], None],
            boundary: Callable[[], Any] | None, lora: Any = None) -> None:
        """Run ``call`` on ``engine`` (vLLM's ``LLMEngine``) until its requests finished or its
        stop flag ended them. ``version()`` is the weight version of the next step's tokens,
        ``before_add(engine)`` runs before requests are added, ``boundary()`` (or None) between
        two of this thread's looks. Raises the error of a failed step."""
        with self._mu:
            self._live.append(call)
            if self._driver is None:
                self._driver = call
        try:
            while True:
                call.wake.clear()
                if call.error is not None:
                    raise call.error
                if not call.pending:
                    break
                if self._driver is call:
                    self._drive(engine, version, before_add, lora)
                else:
                    call.wake.wait(WAIT_S)
                if boundary is not None:
                    boundary()
        except BaseException:
            call.attended = False
            call.stop_flag.set()  # its requests are aborted by whoever drives next
            raise
        finally:
            with self._mu:
                if not call.pending and call in self._live:
                    self._live.remove(call)
                if self._driver is call:
                    self._driver = next((c for c in self._live if c.attended), None)
                    if self._driver is not None:
                        self._driver.wake.set()

    def wake_all(self) -> None:
        """Wake every waiting call (after stop flags were set: the driver acts on them)."""
        with self._mu:
            for c in self._live:
                c.wake.set()

    def drives(self, call: EngineCall) -> bool:
        """Whether ``call``'s thread is the one stepping the engine now."""
        with self._mu:
            return self._driver is call

    def drain(self, engine: Any, version: Callable[[], int], ready: Callable[[], bool]) -> None:
        """Hand out the outputs the engine already holds, one ``engine.step()`` each while
        ``ready()``, without adding or aborting requests: on the driver's thread, with the
        engine paused (outputs made before the pause, stamped ``version()``)."""
        while ready():
            self._drive(engine, version, lambda _: None, None, steps_only=True)

    def _drive(self, engine: Any, version: Callable[[], int], before_add: Callable[[Any], None], lora: Any,
               steps_only: bool = False) -> None:
        """Add the joined calls' requests, abort the stopped calls' ones (not with
        ``steps_only``), step once."""
        with self._mu:
            live = list(self._live)
        try:
            for c in [] if steps_only else live:
                if c.stop_flag.is_set() and c.pending:
                    self._abort(engine, c)
            joining = [] if steps_only else [c for c in live if c.pending and not c.added]
            if joining:
                before_add(engine)
                for c in joining:
                    for rid, inp, sp in c.requests:
                        engine.add_request(rid, inp, sp, lora_request=lora)
                        self._owners[rid] = c
                    c.added = True
            if steps_only or any(c.pending for c in live):  # a drain takes what is queued, whoever's it is
                if not steps_only and not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM has no unfinished requests but {sum(len(c.pending) for c in live)} "
                                       "requests of running calls never finished")
                v = version()  # no update lands during a step
                for out in engine.step():
                    owner = self._owners.get(out.request_id)
                    if owner is not None and owner.take(out, v):
                        del self._owners[out.request_id]
        except BaseException as exc:
            for c in live:
                if c.pending and c is not self._driver:
                    c.error = exc
            for c in live:
                if c.pending:
                    try:
                        self._abort(engine, c)
                    except Exception:  # noqa: BLE001 - the engine may be dead; report the first error
                        pass
            raise
        finally:
            with self._mu:
                for c in live:
                    if not c.pending:
                        if c in self._live:
                            self._live.remove(c)
                        c.wake.set()

    def _abort(self, engine: Any, call: EngineCall) -> None:
        """Abort a call's unfinished requests (in vLLM where they were added)."""
        rids = sorted(call.pending)
        call.pending.clear()
        call.aborted = True
        for rid in rids:
            self._owners.pop(rid, None)
        if rids and call.added:
            engine.abort_request(rids)
