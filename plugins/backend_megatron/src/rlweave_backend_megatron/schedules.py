"""Pipeline schedules of a training step (``roles.<role>.options.pipeline_schedule``).

A schedule decides in which order this rank's pipeline stage runs the forward and backward
passes of a step's ``n`` micro-batches, and when it exchanges activations and gradients with the
neighbouring stages (:class:`.pipeline.Stages`). It is called alike on every stage of a replica
with:

* ``rows_of(i)``: micro-batch ``i``'s padded rows (cheap; shapes of what travels);
* ``forward(i, rows, h) -> (out, loss)``: the stage's forward of micro-batch ``i`` on input
  ``h`` (None on the first stage), with the loss on the last stage (None elsewhere).

Every schedule runs the backward passes in micro-batch order, so gradients accumulate in the
same order and equal the ``sequential`` schedule's. :data:`SCHEDULES` maps the option's names to
them; a new schedule (interleaved virtual stages, zero-bubble) is one more entry.

* ``sequential``: one micro-batch forward through every stage, then backward, then the next:
  one stage works at a time.
* ``1f1b``: each stage runs ``pp - stage - 1`` warm-up forwards, then alternates one forward and
  one backward, then the remaining backwards (PipeDream-flush, megatron's default). Stages work at
  the same time once the pipeline is full; a stage holds the activations of at most
  ``pp - stage`` micro-batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlweave_backend_megatron.pipeline import Rows, Stages

RowsOf = Callable[[int], "Rows"]
Forward = Callable[[int, "Rows", "torch.Tensor | None"], "tuple[torch.Tensor, torch.Tensor | None]"]


def sequential(stages: Stages, n: int, rows_of: RowsOf, forward: Forward) -> None:
    """One micro-batch at a time through the whole pipeline, forward then backward."""
    for i in range(n):
        rows = rows_of(i)
        h = stages.recv_forward(rows)
        out, loss = forward(i, rows, h)
        stages.send_forward(out)
        grad = stages.recv_backward(out)
        stages.send_backward(stages.backward(h, out, loss, grad))


def one_forward_one_backward(stages: Stages, n: int, rows_of: RowsOf, forward: Forward) -> None:
    """Warm-up forwards, one forward one backward, then the remaining backwards (module docstring)."""
    warm = min(stages.pp - stages.pp_rank - 1, n)
    live: deque = deque()  # (input, output, loss) of micro-batches whose backward is still to run
    for i in range(warm):
        rows = rows_of(i)
        h = stages.recv_forward(rows)
        out, loss = forward(i, rows, h)
        stages.send_forward(out)
        live.append((h, out, loss))
    h = stages.recv_forward(rows_of(warm)) if warm < n else None
    for i in range(warm, n):
        out, loss = forward(i, rows_of(i), h)
        live.append((h, out, loss))
        grad = stages.send_forward_recv_backward(out, like=live[0][1])  # the oldest output's gradient
        grad_in = stages.backward(*live.popleft(), grad)
        if i + 1 < n:
            h = stages.send_backward_recv_forward(grad_in, rows_of(i + 1))
        else:
            stages.send_backward(grad_in)
    while live:
        h, out, loss = live.popleft()
        grad = stages.recv_backward(out)
        stages.send_backward(stages.backward(h, out, loss, grad))


#: ``pipeline_schedule`` name -> schedule
SCHEDULES: dict[str, Callable[..., None]] = {"sequential": sequential, "1f1b": one_forward_one_backward}


def schedule(name: str) -> Callable[..., None]:
    """The schedule called ``name`` (:data:`SCHEDULES`)."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ValueError(f"megatron backend: options.pipeline_schedule: unknown schedule {name!r} "
                         f"(choose from {sorted(SCHEDULES)})") from None
