"""``ChangedTally`` (rlweave.backend_helpers.router_replay): the share of replayed routing
decisions whose experts differ, as a set, from the router's own; rows with a ``-1`` are neither
replayed nor counted."""

from __future__ import annotations

import torch

from rlweave.backend_helpers.router_replay import CHANGED, ChangedTally


def test_share_of_replayed_decisions_that_differ():
    t = ChangedTally()
    own = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]])
    given = torch.tensor([[1, 0], [2, 4], [-1, -1], [5, 6]], dtype=torch.int16)  # same set, one differs, none, both
    t.add(own, given)  # before any reset: not counted
    assert t.metrics() == {}
    t.reset(torch.device("cpu"))
    t.add(own, given)
    assert t.metrics() == {CHANGED: 2 / 3}
    t.add(own[:1], torch.tensor([[3, 4]]))  # another layer's forward
    assert t.metrics() == {CHANGED: 3 / 4}
    t.reset(torch.device("cpu"))
    assert t.metrics() == {}  # nothing replayed since the reset
    t.add(own, torch.full((4, 2), -1))
    assert t.metrics() == {}
