"""The reference role as a view of the policy (``AdaptersDisabled``): what it forwards and what not."""

from __future__ import annotations

import pytest
from rlweave.scheduler.views import AdaptersDisabled, is_view


class _Policy:
    world_size, dp, parallel, closed = 2, 2, {"dp": 2}, False

    def __init__(self):
        self.calls = []

    def _dp_call(self, method, args, kw, combine):
        self.calls.append((method, args, kw, combine))
        return "future"

    def shutdown(self, timeout_s=10.0):
        raise AssertionError("the view must not end the policy")

    kill = offload = onload = shutdown


def test_logprobs_are_the_policys_with_adapters_off():
    roles = {"policy": _Policy()}
    view = AdaptersDisabled(roles)
    assert view.logprobs("batch", temperature=0.7) == "future"
    assert roles["policy"].calls == [("compute_logprobs", ("batch",),
                                      {"temperature": 0.7, "with_entropy": False, "adapters": False}, None)]
    roles["policy"] = _Policy()  # a rebuilt policy (after a lost worker) is the one used
    view.logprobs("b2")
    assert roles["policy"].calls[0][1] == ("b2",)
    assert (view.world_size, view.dp, view.parallel) == (2, 2, {"dp": 2})


def test_lifecycle_leaves_the_policy_alone_and_other_calls_are_refused():
    view = AdaptersDisabled({"policy": _Policy()})
    view.shutdown()
    view.kill()
    assert view.offload().result() == [{"freed_bytes": 0}] and view.onload().result() == [{"loaded_bytes": 0}]
    assert is_view(view) and not is_view(_Policy())
    with pytest.raises(AttributeError, match="only computes log-probs, not train"):
        view.train("batch", None)
