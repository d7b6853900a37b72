"""The run's span recorder (rlweave.scheduler.trace): spans only while on, wrapped calls on the row
of their pool thread, Chrome trace JSON with one process per track."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlweave.scheduler.trace import Trace


def test_spans_only_while_on_and_wrapped_calls_on_their_thread_row(tmp_path):
    t = Trace()
    t.span("policy", 0, "train_step", 1.0, 2.0)  # off: not kept
    t.start()
    t.step = 3

    def boom():
        raise ValueError("x")

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="rlweave-env") as pool:
        assert pool.submit(t.wrap("environment", "step", lambda v: v + 1), 1).result() == 2
        with pytest.raises(ValueError):
            pool.submit(t.wrap("environment", "step", boom)).result()  # a call that raises is a span too
    t.version = 2
    t.wrap("rewards", "score", len)([1, 2])
    t.stop()
    t.span("policy", 0, "late", 5.0, 6.0)
    spans = t.spans()
    assert [(s["track"], s["name"], s["step"]) for s in spans] == [
        ("environment", "step", 3), ("environment", "step", 3), ("rewards", "score", 3)]
    assert {s["rank"] for s in spans if s["track"] == "environment"} <= {0, 1} and spans[2]["rank"] == 0
    assert all(s["end"] >= s["start"] for s in spans)
    trace = json.loads(t.write(tmp_path / "trace.json").read_text())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert names == ["controller", "environment", "rewards"]
    assert [e["args"]["policy_version"] for e in trace["traceEvents"] if e["ph"] == "X"] == [0, 0, 2]
