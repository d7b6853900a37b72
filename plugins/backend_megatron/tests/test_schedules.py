"""The pipeline schedules' order (:mod:`rlweave_backend_megatron.schedules`), on simulated stages.

Each stage runs in a thread with the real schedule function; its neighbours are queues. An
exchange puts its sends first and then takes its receives, which is what posting every send and
receive at once and waiting for all of them allows (``batch_isend_irecv``). Every message names
its micro-batch, so a stage that receives the wrong micro-batch's activations or gradient fails.
What is checked for 2, 3 and 4 stages and 1 to 9 micro-batches: the schedule ends (no deadlock),
every stage runs each forward once and each backward once in micro-batch order, a backward
receives the gradient of its own micro-batch, and with ``1f1b`` a stage holds at most
``pp - stage`` micro-batches' activations (``sequential``: one).

The real tensors through real stages (gradients equal between the schedules, gloo, pp=2) are in
``test_megatron_cpu.py``.
"""

from __future__ import annotations

import queue
import threading

import pytest
from rlweave_backend_megatron.schedules import SCHEDULES, schedule

TIMEOUT_S = 5.0


class _Sim:
    """The exchange side of :class:`~rlweave_backend_megatron.pipeline.Stages`, simulated.
    Tensors are ``("act" | "grad", micro-batch)`` tuples; ``rows`` is the micro-batch index."""

    def __init__(self, pp: int, rank: int, links: dict):
        self.pp, self.pp_rank = pp, rank
        self.first, self.last = rank == 0, rank == pp - 1
        self.links = links
        self.log: list[tuple[str, int]] = []
        self.live, self.peak = 0, 0

    def _send(self, to: int, msg) -> None:
        self.links[(self.pp_rank, to)].put(msg)

    def _recv(self, frm: int):
        return self.links[(frm, self.pp_rank)].get(timeout=TIMEOUT_S)

    def recv_forward(self, i):
        return None if self.first else self._recv(self.pp_rank - 1)

    def send_forward(self, out):
        if not self.last:
            self._send(self.pp_rank + 1, out)

    def recv_backward(self, out):
        return None if self.last else self._recv(self.pp_rank + 1)

    def send_backward(self, grad):
        if not self.first:
            self._send(self.pp_rank - 1, grad)

    def send_forward_recv_backward(self, out, like):
        if self.last:
            return None
        self._send(self.pp_rank + 1, out)
        return self._recv(self.pp_rank + 1)

    def send_backward_recv_forward(self, grad, i):
        if self.first:
            return None
        self._send(self.pp_rank - 1, grad)
        return self._recv(self.pp_rank - 1)

    def forward(self, i, rows, h):
        assert rows == i
        if not self.first:
            assert h == ("act", i), f"stage {self.pp_rank}: forward {i} got {h}"
        self.log.append(("F", i))
        self.live += 1
        self.peak = max(self.peak, self.live)
        return ("act", i), (("loss", i) if self.last else None)

    def backward(self, h, out, loss, grad):
        i = out[1]
        if self.last:
            assert loss == ("loss", i)
        else:
            assert grad == ("grad", i), f"stage {self.pp_rank}: backward {i} got {grad}"
        self.log.append(("B", i))
        self.live -= 1
        return None if self.first else ("grad", i)


def _simulate(name: str, pp: int, n: int) -> list[_Sim]:
    links = {(a, b): queue.Queue() for a in range(pp) for b in range(pp) if abs(a - b) == 1}
    stages = [_Sim(pp, r, links) for r in range(pp)]
    errors: list[BaseException] = []

    def run(st: _Sim) -> None:
        try:
            schedule(name)(st, n, lambda i: i, st.forward)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(st,), daemon=True) for st in stages]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT_S * 4)
    assert not any(t.is_alive() for t in threads), f"{name} pp={pp} n={n}: deadlock"
    assert not errors, f"{name} pp={pp} n={n}: {errors[0]!r}"
    return stages


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_schedule_runs_each_pass_once_in_order_without_deadlock(name, pp):
    for n in range(1, 10):
        for st in _simulate(name, pp, n):
            assert [i for k, i in st.log if k == "F"] == list(range(n))
            assert [i for k, i in st.log if k == "B"] == list(range(n))
            bound = 1 if name == "sequential" else min(pp - st.pp_rank, n)
            assert st.peak == bound, (name, pp, n, st.pp_rank, st.peak)


def test_one_forward_one_backward_overlaps_stages():
    """With 1F1B the first stage runs its second forward before its first backward (it works
    while the next stage does); the sequential schedule never does."""
    one = _simulate("1f1b", 2, 4)[0].log
    seq = _simulate("sequential", 2, 4)[0].log
    assert one[:3] == [("F", 0), ("F", 1), ("B", 0)]
    assert seq[:3] == [("F", 0), ("B", 0), ("F", 1)]


def test_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="pipeline_schedule.*'zb'.*1f1b"):
        schedule("zb")
