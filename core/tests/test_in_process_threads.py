"""rlweave.scheduler.in_process_threads: in-process roles' calls on lanes (threads), so that an
engine's calls run beside the training roles', in order on one lane, with a control lane that
is never queued behind a running call; failures and timeouts reported as on Ray. The workers
here are small classes whose methods meet, block and record; the run loop with threads is
exercised by the config-reach run ``in_process`` (tests/reliability)."""

from __future__ import annotations

import threading
import time

import pytest

from rlweave.config.in_process import in_process_problems
from rlweave.config.schema import RunConfig
from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler.in_process import InProcessWorkerGroup
from rlweave.scheduler.in_process_threads import CallLane, ThreadedWorkerGroup
from rlweave.worker_errors import WorkerError, WorkerTimeout

WAIT_S = 10.0


class Worker:
    """A rank: ``meet`` returns whether ``other`` was set while it waited after setting ``mine``;
    ``block`` waits for ``gate``; ``note`` appends to a shared log; ``fail`` raises."""

    control_plane = False

    def __init__(self, ctx):
        self.ctx = ctx

    def meet(self, mine: threading.Event, other: threading.Event) -> bool:
        mine.set()
        return other.wait(WAIT_S)

    def block(self, gate: threading.Event) -> str:
        if not gate.wait(WAIT_S):
            raise TimeoutError("the gate was never opened")
        return "unblocked"

    def open(self, gate: threading.Event) -> str:
        gate.set()
        return "opened"

    def note(self, log: list, item: str, busy: list) -> None:
        busy.append(item)
        overlapped = len(busy) > 1
        time.sleep(0.02)
        log.append((item, overlapped, threading.current_thread().name))
        busy.remove(item)

    def fail(self) -> None:
        raise ValueError("bad input")


class Engine(Worker):
    control_plane = True


@pytest.fixture
def lanes():
    made: list[CallLane] = []

    def lane(name: str) -> CallLane:
        made.append(CallLane(name))
        return made[-1]

    yield lane
    for lane_ in made:
        lane_.close()


def group(name: str, cls: type, lane: CallLane, control: CallLane | None = None) -> ThreadedWorkerGroup:
    return ThreadedWorkerGroup(InProcessWorkerGroup(name, cls, [WorkerContext(role=name)]), lane, control)


def test_an_engine_lane_runs_beside_the_training_lane(lanes):
    rollout, policy = group("rollout", Engine, lanes("rollout")), group("policy", Worker, lanes("train"))
    a, b = threading.Event(), threading.Event()
    gen = rollout.submit("meet", [0], [((a, b), {})])
    train = policy.submit("meet", [0], [((b, a), {})])
    assert rollout.wait(gen, WAIT_S) == [True] and policy.wait(train, WAIT_S) == [True]


def test_roles_sharing_a_lane_take_turns_in_submission_order(lanes):
    train = lanes("train")
    policy, reference = group("policy", Worker, train), group("reference", Worker, train)
    log, busy = [], []
    pending = [(g, g.submit("note", [0], [((log, f"{g.name}-{k}", busy), {})]))
               for k in range(3) for g in (policy, reference)]
    for g, p in pending:
        g.wait(p, WAIT_S)
    assert [item for item, _, _ in log] == ["policy-0", "reference-0", "policy-1", "reference-1", "policy-2",
                                            "reference-2"]
    assert not any(overlapped for _, overlapped, _ in log)
    assert {thread for _, _, thread in log} == {log[0][2]} and log[0][2].startswith("rlweave-train")


def test_control_calls_pass_a_running_call_only_on_a_control_lane(lanes):
    engine = group("rollout", Engine, lanes("rollout"), lanes("rollout-control"))
    gate = threading.Event()
    running = engine.submit("block", [0], [((gate,), {})])
    assert engine.wait(engine.submit("open", [0], [((gate,), {})], control=True), WAIT_S) == ["opened"]
    assert engine.wait(running, WAIT_S) == ["unblocked"]

    plain = group("rollout", Worker, lanes("plain"))  # no control lane: control calls queue behind
    gate = threading.Event()
    running = plain.submit("block", [0], [((gate,), {})])
    queued = plain.submit("open", [0], [((gate,), {})], control=True)
    with pytest.raises(WorkerTimeout) as timeout:
        plain.wait(queued, 0.3)
    assert (timeout.value.role, timeout.value.method, timeout.value.ranks) == ("rollout", "open", [0])
    assert " in block" in timeout.value.stacks[0]  # where the lane is held up: the call before it
    assert not plain.done(queued)
    gate.set()
    assert plain.wait(running, WAIT_S) == ["unblocked"] and plain.wait(queued, WAIT_S) == ["opened"]


def test_a_failing_call_is_a_worker_error_naming_role_and_method(lanes):
    policy = group("policy", Worker, lanes("train"))
    with pytest.raises(WorkerError) as err:
        policy.wait(policy.submit("fail", [0], [((), {})]), WAIT_S)
    assert (err.value.role, err.value.rank, err.value.method) == ("policy", 0, "fail")
    assert "ValueError: bad input" in str(err.value)


def test_wait_any_returns_when_one_call_ends(lanes):
    rollout, policy = group("rollout", Engine, lanes("rollout")), group("policy", Worker, lanes("train"))
    gate, other = threading.Event(), threading.Event()
    slow = rollout.submit("block", [0], [((gate,), {})])
    fast = policy.submit("open", [0], [((other,), {})])
    t0 = time.monotonic()
    ThreadedWorkerGroup.wait_any([(rollout, slow), (policy, fast)], WAIT_S)
    assert time.monotonic() - t0 < WAIT_S / 2 and policy.done(fast) and not rollout.done(slow)
    gate.set()
    rollout.wait(slow, WAIT_S)


def test_threads_are_refused_with_the_ray_scheduler():
    ray = RunConfig.model_validate({"run": {"in_process_threads": True}})
    assert [path for path, _ in in_process_problems(ray, [])] == ["run.in_process_threads"]
    local = RunConfig.model_validate({"run": {"in_process_threads": True, "scheduler": "in_process"}})
    assert in_process_problems(local, []) == []
