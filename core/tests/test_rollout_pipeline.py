"""Property test of the rollout pipeline (partial rollout, one_step_off, async): over random
engine and trainer speeds, no trained token is older than ``run.max_staleness`` versions,
every record drawn is trained exactly once or still waits in the queue, and this holds across
a checkpoint and restore in the middle of the run (requests in flight included).

The engine and the trainer are simulated in time (an engine serves its calls in order, as one
Ray actor does, and stamps each token with the version of the weights it holds); the pipeline
and its queue are the real ones.
"""

from __future__ import annotations

import importlib
import math
import random
import time
from types import SimpleNamespace

import pytest

from rlweave.algo_helpers.pipeline import RolloutPipeline, groups_to_fill
from rlweave.config.schema import RunConfig
from rlweave.interfaces.engine import Generation, SamplingParams

MAX_NEW = 40


class SimEngine:
    """Serves generate calls and weight loads in submission order; ``speed`` seconds a token."""

    def __init__(self, rng: random.Random, speed: float, version: int = 0):
        self.rng, self.speed = rng, speed
        self.free_at = time.monotonic()
        self.version = version  # version of the weights the engine holds after its queued work
        self.tokens_made = 0

    def _queue(self, seconds: float) -> float:
        self.free_at = max(self.free_at, time.monotonic()) + seconds
        return self.free_at

    def generate(self, prompts: list[list[int]], params: SamplingParams):
        out = []
        longest = 0
        for p in prompts:
            target, so_far = p[0], len(p) - 2  # prompt = [target length, record number]
            room = min(params.max_new_tokens, MAX_NEW - so_far)
            limit = min(room, params.token_budget) if params.token_budget else room
            k = min(limit, target - so_far)
            reason = "stop" if so_far + k >= target else ("aborted" if k == params.token_budget and k < room
                                                          else "length")
            out.append([Generation([1] * k, [-0.5] * k, reason, versions=[self.version] * k)])
            longest = max(longest, k)
            self.tokens_made += k
        self.rng.random()
        return SimFuture(self._queue(self.speed * (longest + 1)), out)

    def load(self, version: int):
        done_at = self._queue(self.speed)
        self.version = version
        return SimFuture(done_at, {"bytes": 1, "seconds": 0.0})


class SimFuture:
    def __init__(self, at: float, value):
        self.at, self.value = at, value

    def done(self) -> bool:
        return time.monotonic() >= self.at

    def result(self, timeout=None):
        time.sleep(max(0.0, self.at - time.monotonic()))
        return self.value


class SimSync:
    def __init__(self, engine: SimEngine):
        self.engine = engine

    def sync(self, src, dst, version=None):
        return self.engine.load(version).result()

    def start(self, src, dst, version=None):
        return self.engine.load(version)


class Data:
    """Records ``{"id": i, "target": length}`` with heavy-tailed lengths, in order."""

    def __init__(self, rng: random.Random, batch: int):
        self.rng, self.batch, self.position = rng, batch, 0

    def next_batch(self):
        out = []
        for _ in range(self.batch):
            i = self.position
            self.position += 1
            target = min(MAX_NEW, int(2 + random.Random(i).paretovariate(1.2)))
            out.append({"id": i, "target": target})
        return out


MODULES = {"sync": "sync", "one_step_off": "one_step_off", "async": "async_mode"}


def make(mode: str, staleness: int, partial: bool, request_groups, engine, data, steps: int):
    cfg = RunConfig.model_validate({
        "run": {"mode": mode, "max_staleness": staleness, "total_steps": steps},
        "rollout": {"partial": {"token_budget_per_step": 6, "max_rounds": 3} if partial else None,
                    "request_groups": request_groups},
        "data": {"batch_size": data.batch},
    })
    ctx = SimpleNamespace(config=cfg, roles={"rollout": engine}, weight_sync=SimSync(engine),
                          next_records=data.next_batch)

    def encode(records):
        return [[r["target"], r["id"]] for r in records], [{"id": r["id"]} for r in records]

    schedule = importlib.import_module(f"rlweave.algo_helpers.run_modes.{MODULES[mode]}").schedule(cfg, ctx)
    return RolloutPipeline(ctx, n=3, max_new_tokens=MAX_NEW, encode=encode, schedule=schedule)


def params(salt: int) -> SamplingParams:
    return SamplingParams(n=3, max_new_tokens=MAX_NEW, seed=salt)


CASES = [
    ("sync", 1, True, None),
    ("one_step_off", 1, False, None),
    ("one_step_off", 1, True, None),
    ("async", 1, True, 1),
    ("async", 2, True, 2),
    ("async", 2, False, None),
    ("async", 0, True, 1),
]


@pytest.mark.parametrize("mode,staleness,partial,request_groups", CASES)
@pytest.mark.parametrize("seed", range(6))
def test_staleness_bound_and_no_record_lost_or_repeated(mode, staleness, partial, request_groups, seed):
    rng = random.Random(seed)
    steps, batch, cut = 10, 4, rng.randint(2, 7)
    engine = SimEngine(rng, speed=rng.uniform(0.0001, 0.0006))
    data = Data(rng, batch)
    pipe = make(mode, staleness, partial, request_groups, engine, data, steps)
    trained: list[int] = []
    steps_done = 0
    pipe.sync_weights(steps_done)
    while steps_done < steps:
        groups = pipe.next_groups(data.next_batch(), steps_done, params)
        assert len(groups) == batch
        for g in groups:
            assert g.complete
            for s in g.samples:
                assert len(s.tokens) == len(s.logprobs) == len(s.versions) <= MAX_NEW
                assert s.tokens, "a trained sample has a response"
                if mode != "sync":
                    assert steps_done - min(s.versions) <= staleness, (steps_done, s.versions)
                assert s.finish_reason in ("stop", "length")
                if s.finish_reason == "stop":
                    assert len(s.tokens) == g.record["target"]
            trained.append(g.record["id"])
        m = pipe.metrics(groups, steps_done)
        assert m["staleness/max"] <= (staleness if mode != "sync" else 3)
        pipe.wait(SimFuture(time.monotonic() + rng.uniform(0.0005, 0.02), {}), steps_done, params)
        steps_done += 1
        pipe.sync_weights(steps_done)
        if steps_done == cut:  # checkpoint at a step's end, requests in flight; restore into a new pipeline
            state, position = pipe.state_dict(), data.position
            engine = SimEngine(rng, speed=rng.uniform(0.0001, 0.0006), version=steps_done)
            data = Data(rng, batch)
            data.position = position
            pipe = make(mode, staleness, partial, request_groups, engine, data, steps)
            pipe.load_state_dict(state)
    waiting = [g.record["id"] for g in pipe.queue.groups.values()]
    assert len(trained) == len(set(trained)) == steps * batch, "no record trained twice"
    assert not set(trained) & set(waiting)
    assert sorted(trained + waiting) == list(range(data.position)), "every record drawn is trained or waiting"
    if mode == "one_step_off":
        assert len(waiting) <= batch


def test_partial_rollout_continues_long_samples_across_steps():
    """sync + partial: a long sample is cut at the budget, kept, and finished in a later step
    with its earlier tokens; ``partial/ratio`` counts it."""
    rng = random.Random(0)
    engine = SimEngine(rng, speed=0.0001)
    data = Data(rng, 4)
    pipe = make("sync", 1, True, None, engine, data, 20)
    ratios, rounds = [], []
    for step in range(8):
        groups = pipe.next_groups(data.next_batch(), step, params)
        ratios.append(pipe.metrics(groups, step)["partial/ratio"])
        rounds += [s.rounds for g in groups for s in g.samples]
        pipe.sync_weights(step + 1)
    assert max(rounds) > 1 and max(rounds) <= 3  # cut and continued, at most max_rounds rounds
    assert any(r > 0 for r in ratios)


class _Counting(SimEngine):
    def __init__(self, rng):
        super().__init__(rng, speed=0.0)
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        return super().generate(prompts, params)


def test_a_sync_step_with_partial_rollout_does_not_wait_for_its_longest_group():
    """sync + partial: once a round leaves groups missing, the next round starts that many fresh
    groups (an unfinished sample gets one round a step); the step returns a full batch of short
    groups while the long one is still unfinished, and later steps finish it, a budget's worth
    of tokens from each version."""
    targets = iter([40, 3, 3, 3] + [3] * 200)

    class Records(Data):
        def next_batch(self):
            out = [{"id": self.position + i, "target": next(targets)} for i in range(self.batch)]
            self.position += self.batch
            return out

    engine = _Counting(random.Random(0))
    data = Records(random.Random(0), 4)
    pipe = make("sync", 1, True, None, engine, data, 20)
    pipe.queue.max_rounds = 10  # the long group needs 7 rounds of 6 tokens
    groups = pipe.next_groups(data.next_batch(), 0, params)
    assert [g.record["id"] for g in groups] == [1, 2, 3, 4]  # record 4: the fresh group of the second round
    assert engine.calls == 2 and pipe.metrics(groups, 0)["partial/rounds"] == 2
    long, *rest = pipe.queue.groups.values()  # and the rest of the batch drawn for the fresh group
    # one round a step: the second round went to the fresh group alone
    assert long.record["id"] == 0 and all(len(s.tokens) == 6 and s.finish_reason is None for s in long.samples)
    assert [g.record["id"] for g in rest] == [5, 6, 7]
    # 3 of 4 fresh groups completed their first round: the second round started ceil(1 / (4 / 5))
    # fresh groups for the one missing; the one beyond the batch is trained first in the next step
    assert pipe.queue.started() == 2 and rest[0].complete and not rest[1].samples[0].tokens
    pipe.sync_weights(1)
    assert pipe.next_groups(data.next_batch(), 1, params)[0].record["id"] == 5
    trained = {}
    for step in range(2, 9):
        pipe.sync_weights(step)
        trained.update({g.record["id"]: g for g in pipe.next_groups(data.next_batch(), step, params)})
        if 0 in trained:
            break
    assert [len(s.tokens) for s in trained[0].samples] == [40] * 3
    for s in trained[0].samples:  # at most token_budget_per_step tokens of each version
        assert [s.versions.count(v) for v in sorted(set(s.versions))] == [6] * 6 + [4]


def test_overlapping_modes_keep_the_engine_generating_while_training():
    """one_step_off: the next batch is requested before the caller trains."""
    rng = random.Random(1)
    engine = SimEngine(rng, speed=0.0002)
    data = Data(rng, 4)
    pipe = make("one_step_off", 1, False, None, engine, data, 5)
    pipe.next_groups(data.next_batch(), 0, params)
    assert pipe.queue.in_flight, "a request for the next batch is on the engine"
    assert len(pipe.queue) == 4


class _FailedSync:
    def result(self):
        raise RuntimeError("weight sync into 'rollout' rank 0: load_weights failed: boom")


class _Aborting:
    """The rollout handle of a run that fails: ``abort()`` is recorded."""

    def __init__(self, engine: SimEngine):
        self.engine, self.aborts = engine, 0

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)

    def abort(self):
        self.aborts += 1
        return SimFuture(time.monotonic(), 1)


def test_drain_raises_the_last_syncs_error_and_aborts_when_asked():
    """The sync begun at the last step is awaited by ``drain()`` (before an evaluation, a
    checkpoint, the end) and its error surfaces there; ``drain(abort=True)`` (a failing run)
    asks the engine to stop its calls in flight first, and leaves none."""
    rng = random.Random(0)
    engine = SimEngine(rng, speed=0.0005)
    p = make("one_step_off", 1, False, None, engine, Data(rng, 2), steps=4)
    p.ctx.weight_sync.start = lambda src, dst, version=None: _FailedSync()
    groups = p.next_groups(p.ctx.next_records(), 0, params)
    assert groups and p.queue.in_flight, "the next step's request is in flight"
    p.sync_weights(1)
    with pytest.raises(RuntimeError, match="load_weights failed: boom"):
        p.drain()
    assert not p.queue.in_flight and p.pending_sync is None

    handle = _Aborting(SimEngine(rng, speed=0.0005))
    q = make("one_step_off", 1, False, None, handle.engine, Data(rng, 2), steps=4)
    q.ctx.roles["rollout"] = handle
    q.next_groups(q.ctx.next_records(), 0, params)
    q.drain(abort=True)
    assert handle.aborts == 1 and not q.queue.in_flight


def test_fresh_groups_fill_the_batch_with_the_configured_probability():
    """groups_to_fill: the fewest fresh groups of which at least ``missing`` complete with the
    given probability (Binomial upper tail), never fewer than the count that does so on average."""
    def at_least(m, n, r):
        return sum(math.comb(n, k) * r ** k * (1 - r) ** (n - k) for k in range(m, n + 1))

    for missing, rate, conf in [(16, 0.3, 0.9), (16, 0.3, 0.5), (4, 0.5, 0.9), (1, 0.8, 0.99), (7, 0.6, 0.75)]:
        n = groups_to_fill(missing, rate, conf)
        assert n >= math.ceil(missing / rate)
        assert at_least(missing, n, rate) >= conf
        assert n == math.ceil(missing / rate) or at_least(missing, n - 1, rate) < conf, (missing, rate, conf, n)
    assert groups_to_fill(16, 0.3, 0.9) > groups_to_fill(16, 0.3, 0.5) == 54
    assert groups_to_fill(0, 0.3, 0.9) == 0 and groups_to_fill(-2, 0.3, 0.9) == 0
    assert groups_to_fill(5, 1.0, 0.9) == 5  # every group completes
    assert groups_to_fill(1, 0.01, 0.5) == 4  # counted at MIN_FIRST_ROUND_RATE at least
    # a large batch: 1024 groups missing at rate 0.3 (mean count 3414, sd ~27 complete groups)
    big = groups_to_fill(1024, 0.3, 0.9)
    assert math.ceil(1024 / 0.3) + 60 < big < math.ceil(1024 / 0.3) + 150


class _LateLoads(SimEngine):
    """Weights land ``delay`` seconds after the load is sent; a generate call started before
    stamps its tokens with the weights the engine held then."""

    def __init__(self, rng, delay: float):
        super().__init__(rng, speed=0.0001)
        self.delay, self.landing = delay, []

    def load(self, version: int):
        at = time.monotonic() + self.delay
        self.landing.append((at, version))
        return SimFuture(at, {"bytes": 1, "seconds": self.delay})

    def generate(self, prompts, params):
        now = time.monotonic()
        for at, v in [x for x in self.landing if x[0] <= now]:
            self.version = max(self.version, v)
            self.landing.remove((at, v))
        return super().generate(prompts, params)


def test_one_step_off_starts_the_next_batch_on_the_landed_weights():
    """one_step_off with a weight load slower than the engine's generation: the next batch's
    request waits for the last update's weights, so no trained token is two versions old."""
    rng = random.Random(3)
    engine = _LateLoads(rng, delay=0.03)
    data = Data(rng, 3)
    pipe = make("one_step_off", 2, False, None, engine, data, 8)
    worst = []
    for steps_done in range(6):
        groups = pipe.next_groups(data.next_batch(), steps_done, params)
        worst.append(pipe.metrics(groups, steps_done)["staleness/max"])
        pipe.wait(SimFuture(time.monotonic() + 0.002, {}), steps_done, params)
        pipe.sync_weights(steps_done + 1)
    assert worst[1:] == [1.0] * 5, worst
