"""The run's WeightSync (transports built once per pair, set up, forgotten, closed), the
weight_sync config section, and the seams: weight sync reaches ranks through the generic
call, and the scheduler neither imports weight sync nor carries weight-sync methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlweave.config.schema import RunConfig
from rlweave.weight_sync.interface import WeightTransport
from rlweave.weight_sync.section import WeightSyncSection
from rlweave.weight_sync.service import WeightSync, make_transport

SCHEDULER = Path(__file__).resolve().parents[1] / "src" / "rlweave" / "scheduler"


class Logged(WeightTransport):
    name = "logged"

    def __init__(self, log: list, pair: tuple[str, str]):
        self.log, self.pair = log, pair

    def setup(self, src, dst):
        self.log.append(("setup", self.pair, src, dst))

    def sync(self, src, dst, bucket_bytes, timeout_s):
        self.log.append(("sync", self.pair, bucket_bytes, timeout_s))
        return {"bytes": 1}

    def close(self):
        self.log.append(("close", self.pair))


def service(section=None):
    log: list = []
    roles = {"policy": "P", "rollout": "R", "reference": "F"}
    return WeightSync(roles, section, transport_factory=lambda s, d: Logged(log, (s, d))), roles, log


def test_one_transport_per_pair_set_up_once():
    ws, _, log = service(WeightSyncSection(bucket_mb=2, timeout_s=7))
    ws.sync("policy", "rollout")
    ws.sync("policy", "rollout")
    ws.sync("policy", "reference")
    assert log == [
        ("setup", ("policy", "rollout"), "P", "R"),
        ("sync", ("policy", "rollout"), 2 << 20, 7),
        ("sync", ("policy", "rollout"), 2 << 20, 7),
        ("setup", ("policy", "reference"), "P", "F"),
        ("sync", ("policy", "reference"), 2 << 20, 7),
    ]
    ws.close()
    assert sorted(e for e in log if e[0] == "close") == [("close", ("policy", "reference")),
                                                           ("close", ("policy", "rollout"))]
    ws.close()  # idempotent
    assert sum(e[0] == "close" for e in log) == 2


def test_forget_a_rebuilt_role_gives_its_pairs_a_new_transport():
    ws, roles, log = service()
    ws.sync("policy", "rollout")
    ws.sync("policy", "reference")
    old = ws.transport("policy", "rollout")
    roles["rollout"] = "R2"  # the runner put a rebuilt handle in the live mapping
    ws.forget("rollout")
    assert ("close", ("policy", "rollout")) in log and ("close", ("policy", "reference")) not in log
    assert ws.transport("policy", "rollout") is not old
    assert log[-1] == ("setup", ("policy", "rollout"), "P", "R2")


def test_unknown_role_is_named():
    ws, _, _ = service()
    with pytest.raises(KeyError, match="no role 'critic'"):
        ws.sync("policy", "critic")


class Timed:
    """A handle with ``roles.<name>.timeouts.sync`` = ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def timeout_for(self, method):
        return (self.seconds, "sync") if method == "receive_weights" else (None, None)


def test_default_timeout_is_the_destinations_sync_timeout():
    ws, roles, log = service()
    roles["rollout"] = Timed(42.0)
    ws.sync("policy", "rollout")
    assert log[-1][3] == 42.0
    ws, roles, log = service(WeightSyncSection(timeout_s=5))
    roles["rollout"] = Timed(42.0)
    ws.sync("policy", "rollout")
    assert log[-1][3] == 5  # weight_sync.timeout_s wins


def test_config_section_and_transport_choice():
    assert type(make_transport("auto")).__name__ == "ObjectStoreTransport"
    assert make_transport("object_store").name == "object_store"
    bcast = make_transport("broadcast", timeout_s=12)
    assert bcast.name == "broadcast" and bcast.timeout_s == 12
    ipc = make_transport("cuda_ipc", timeout_s=7)
    assert ipc.name == "cuda_ipc" and ipc.timeout_s == 7
    assert RunConfig.model_validate({"weight_sync": {"transport": "cuda_ipc"}}).weight_sync.transport == "cuda_ipc"
    cfg = RunConfig.model_validate({"weight_sync": {"bucket_mb": 16, "timeout_s": 30}})
    assert cfg.weight_sync.bucket_mb == 16 and cfg.weight_sync.transport == "auto"
    for bad in ({"transport": "carrier_pigeon"}, {"bucket_mb": 0}, {"timeout_s": -1}, {"bucket": 1}):
        with pytest.raises(ValueError, match="weight_sync"):
            RunConfig.model_validate({"weight_sync": bad})


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_scheduler_does_not_import_weight_sync():
    offenders = {str(p.relative_to(SCHEDULER)): sorted(m for m in _imports(p) if m.startswith("rlweave.weight_sync"))
                 for p in SCHEDULER.rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_rank_actor_has_no_weight_sync_methods():
    from rlweave.scheduler.ray_impl.actor import WorkerActor

    assert not [m for m in ("send_weights", "receive_weights", "weight_dtype", "load_weights")
                if hasattr(WorkerActor, m)]


def test_generic_call_runs_a_function_on_each_rank_and_names_failures():
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.scheduler.local import LocalWorkerGroup
    from rlweave.worker_errors import WorkerError

    class W:
        def __init__(self, ctx):
            self.ctx = ctx

    h = RoleHandle("policy", LocalWorkerGroup("policy", W, ["a", "b"]), timeouts={"sync": 5})
    got = h.submit_ranks("send_weights", [0, 1], [((10,), {})] * 2, list, fn=_describe).result()
    assert got == [("a", 0, 10), ("b", 1, 10)]
    assert h.timeout_for("send_weights") == (5.0, "roles.policy.timeouts.sync")
    with pytest.raises(WorkerError) as ei:
        h.submit_ranks("receive_weights", [1], [((), {})], list, fn=_fail).result()
    assert ei.value.rank == 1 and ei.value.method == "receive_weights" and "no room" in str(ei.value)


def _describe(worker, rank, n):
    return worker.ctx, rank, n


def _fail(worker, rank):
    raise RuntimeError("no room")
