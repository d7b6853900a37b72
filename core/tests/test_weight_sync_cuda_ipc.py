"""The cuda_ipc protocol in this process, on CPU shared memory: one source thread and two
receiver threads over a real TCPStore channel (round trip, a corrupt bucket named, a bucket
slot not reused before every receiver acknowledged it), device buckets and memory handles,
and what ``transport: auto`` picks. The CUDA path carries the ``gpu`` marker."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from rlweave.testing.workers import make_state_dict  # noqa: E402
from rlweave.weight_sync import WeightSyncError, WeightSyncTimeout  # noqa: E402
from rlweave.weight_sync import device_buckets as db  # noqa: E402
from rlweave.weight_sync.auto import colocation_problem, pick_transport  # noqa: E402
from rlweave.weight_sync.buckets import iter_buckets  # noqa: E402
from rlweave.weight_sync.cuda_ipc import leave_end, open_channel, receive_buckets, send_buckets  # noqa: E402
from rlweave.weight_sync.handles import new_buffer, open_handle, share  # noqa: E402

BUCKET = 64 << 10
CPU = torch.device("cpu")


@pytest.fixture
def channel():
    """A TCPStore channel hosted here (the source's end) and a client of it (the receivers')."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_channel("t/", "127.0.0.1", port, True, 3, 20)

    def peer():  # each receiver has its own client, as each rank process does
        return dist.PrefixStore("t/", dist.TCPStore("127.0.0.1", port, 3, is_master=False,
                                                   timeout=timedelta(seconds=20)))

    yield store, peer
    leave_end(None, 0, "t/")


def run_sync(store, peer, named, receivers=2, tamper=None, load=None, n=1):
    """One sync: the source in a thread, ``receivers`` receiver threads (``peer()``: a
    receiver's store); returns
    (source result or exception, [receiver result or exception], [received dict])."""
    out: dict = {}
    got = [dict() for _ in range(receivers)]

    def default_load(rank):
        return lambda items: got[rank].update((k, t.clone()) for k, t in items)

    def src():
        try:
            out["src"] = send_buckets(store, n, receivers, iter(named), BUCKET, CPU, 20, tamper)
        except Exception as exc:  # noqa: BLE001
            out["src"] = exc

    def dst(rank):
        try:
            out[rank] = receive_buckets(peers[rank], n, rank, (load or default_load)(rank), CPU)
        except Exception as exc:  # noqa: BLE001
            out[rank] = exc

    peers = [peer() for _ in range(receivers)]
    threads = [threading.Thread(target=src)] + [threading.Thread(target=dst, args=(r,)) for r in range(receivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out["src"], [out[r] for r in range(receivers)], got


def test_round_trip_to_two_receivers(channel):
    state = make_state_dict(1, 3)
    sent, received, got = run_sync(*channel, list(state.items()))
    assert sent["buckets"] >= 3 and sent["tensors"] == len(state)
    assert received == [sent, sent]
    for g in got:
        assert list(g) == list(state)
        for name, t in state.items():
            assert g[name].dtype == t.dtype and torch.equal(g[name], t), name
    # a second sync over the same channel (new sync number) works the same
    again, received2, _ = run_sync(*channel, list(state.items()), n=2)
    assert again == sent and received2 == [sent, sent]


def test_corrupt_bucket_is_named_and_the_source_is_not_left_waiting(channel):
    from rlweave.testing.transports import flip_shared_bucket_1

    state = make_state_dict(1, 3)
    sent, received, _ = run_sync(*channel, list(state.items()), tamper=flip_shared_bucket_1)
    assert isinstance(sent, dict) and sent["buckets"] >= 3  # every receiver acknowledged to the end
    for err in received:
        assert isinstance(err, WeightSyncError) and not isinstance(err, WeightSyncTimeout)
        assert "bucket 1" in str(err) and "checksum" in str(err)


def test_a_slot_is_reused_only_after_every_receiver_acknowledged(channel):
    """A slow receiver holds bucket 0's memory mapped while it loads; the source must not pack
    bucket 2 into that slot before the receiver acknowledged bucket 0, and returns only after
    the last acknowledgement."""
    store, make_peer = channel
    peer = make_peer()
    state = {f"w{i}": torch.full((BUCKET // 4,), float(i)) for i in range(5)}  # one tensor per bucket
    acks: list[tuple[float, int]] = []

    class Recording:  # the receivers' store, noting when they acknowledge
        def get(self, key):
            return peer.get(key)

        def set(self, key, value):
            if "/a/" in key:
                acks.append((time.monotonic(), int(key.split("/")[2])))
            return peer.set(key, value)

    packed: list[tuple[float, int]] = []
    real_pack = db.pack

    def recording_pack(index, items, buffer):
        packed.append((time.monotonic(), index))
        return real_pack(index, items, buffer)

    def slow_load(_rank):
        def load(items):
            for _name, t in items:
                time.sleep(0.15)
                assert float(t[0]) == float(_name[1:])
        return load

    db.pack = recording_pack
    try:
        t0 = time.monotonic()
        sent, received, _ = run_sync(store, Recording, list(state.items()), receivers=1, load=slow_load)
        t_end = time.monotonic()
    finally:
        db.pack = real_pack
    assert sent["buckets"] == 5 and received == [sent]
    ack_at = {i: t for t, i in acks}
    for t, i in packed:
        if i >= 2:
            assert t >= ack_at[i - 2], f"bucket {i} packed before bucket {i - 2} was acknowledged"
    assert t_end - t0 >= 5 * 0.15 * 0.9


def test_device_buckets_on_cpu_match_the_object_store_buckets():
    state = make_state_dict(1, 5)
    host = list(iter_buckets(state.items(), BUCKET))
    groups = list(db.group(state.items(), BUCKET))
    assert len(groups) == len(host)
    for i, (items, (meta, payload)) in enumerate(zip(groups, host)):
        got, flat = db.pack(i, items, lambda n: torch.empty(n + 5, dtype=torch.uint8))
        assert got == meta and torch.equal(flat, torch.from_numpy(payload))
        assert [(n, t.dtype) for n, t in db.views(got, flat)] == [(n, t.dtype) for n, t in items]
        damaged = flat.clone()
        damaged[-1] ^= 0x80
        with pytest.raises(WeightSyncError, match=f"bucket {i}"):
            db.verify(got, damaged)


def test_shared_memory_handle_maps_without_copy():
    buf = new_buffer(1000, "cpu")
    handle = share(buf)
    view = open_handle(handle)
    buf[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert view.numel() == 1000 and view[:4].tolist() == [1, 2, 3, 4]  # the same memory
    with pytest.raises(WeightSyncError, match="shared memory"):
        share(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(WeightSyncError, match="cannot map"):
        open_handle(("cpu", 2**22 + 7, 999, 16, 0, 16))  # no such process


_PIDS = itertools.count(100)


def place(node="n1", device="cuda", gpu="g0", visible=("g0",), pid=None):
    """A located rank; each in its own process unless ``pid`` is given."""
    return {"node": node, "node_ip": None, "pid": next(_PIDS) if pid is None else pid, "device": device,
            "gpu": gpu if device == "cuda" else None, "visible": list(visible) if device == "cuda" else []}


@pytest.mark.parametrize("src, dst, want", [
    (place(), [place()], "cuda_ipc"),  # colocated on one GPU
    (place(), [place(gpu="g0", visible=("g0", "g1")), place(gpu="g1", visible=("g0", "g1"))], "cuda_ipc"),
    (place(), [place(gpu="g1", visible=("g1",))], "broadcast"),  # same node, another GPU it alone sees
    (place(), [place(node="n2")], "broadcast"),  # another node
    (place(device="cpu"), [place(device="cpu")], "object_store"),  # CPU: bench/RESULTS.md
    (place(device="cpu"), [place()], "object_store"),  # CPU trainer feeding a GPU engine
    (place(), [place(), place(device="cpu")], "object_store"),
    (None, [place()], "object_store"),  # could not be located
    (place(pid=7), [place(pid=7)], "in_process"),  # run.scheduler: in_process, on a GPU
    (place(device="cpu", pid=7), [place(device="cpu", pid=7)], "in_process"),  # and on CPU
    (place(pid=7), [place(pid=7, node="n2")], "broadcast"),  # a pid of another node is another process
    (place(pid=7), [place(pid=7), place()], "cuda_ipc"),  # one destination rank elsewhere
])
def test_auto_picks_by_placement(src, dst, want):
    assert pick_transport(src, dst) == want


def test_ray_nodes_of_one_machine_are_separate_nodes():
    """Two raylets of one host (or containers with the host's name) share the machine's key but
    are separate Ray nodes: no memory handles between them, and the message names both."""
    a, b = {**place(), "ray_node": "a" * 56, "node_ip": "127.0.0.1"}, {**place(), "ray_node": "b" * 56}
    assert colocation_problem(a, [dict(a, pid=2)]) is None
    msg = colocation_problem(a, [b], "policy", "rollout")
    assert "'rollout' rank 0" in msg and "b" * 12 in msg and "a" * 12 in msg and "one node" in msg
    assert pick_transport(a, [b]) == "broadcast"
    assert colocation_problem(place(), [{**place(), "ray_node": "b" * 56}]) is None  # one side unknown: the machine


def test_colocation_problem_names_the_rank_and_why():
    assert colocation_problem(place(device="cpu"), [place(device="cpu")]) is None
    msg = colocation_problem(place(device="cpu"), [place(device="cpu"), place(device="cpu", node="n2")],
                             "policy", "rollout")
    assert "'rollout' rank 1" in msg and "one node" in msg
    msg = colocation_problem(place(), [place(gpu="g1", visible=("g1",))], "policy", "rollout")
    assert "'rollout' rank 0" in msg and "g0" in msg


@pytest.mark.gpu
def test_cuda_handle_round_trip_in_a_child_process():
    """CUDA IPC of a device bucket into another process, which verifies its device checksum."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import torch.multiprocessing as mp

    items = [(n, t.cuda()) for n, t in make_state_dict(4, 1).items()]
    buf = new_buffer(db.packed_size(items), "cuda")
    meta, flat = db.pack(0, items, lambda _n: buf)
    assert meta.checksum.startswith("dev:")
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    from rlweave.testing.transports import open_and_verify_child

    p = ctx.Process(target=open_and_verify_child, args=(meta, share(buf), q))
    p.start()
    result = q.get(timeout=120)
    p.join(60)
    assert result == "ok", result


def test_device_checksum_catches_flips_and_moved_words():
    """The checksum CUDA buckets use, computed here on CPU (the same arithmetic)."""
    flat = torch.arange(4096, dtype=torch.int64).view(torch.uint8).clone()
    base = db.device_checksum(b"head", flat)
    assert base.startswith("dev:") and db.device_checksum(b"head", flat.clone()) == base
    flipped = flat.clone()
    flipped[1000] ^= 0x04
    swapped = flat.view(torch.int64).clone()
    swapped[[3, 9]] = swapped[[9, 3]]
    assert db.device_checksum(b"head", flipped) != base
    assert db.device_checksum(b"head", swapped.view(torch.uint8)) != base  # same words, other places
    assert db.device_checksum(b"head2", flat) != base


@pytest.mark.gpu
def test_device_checksum_on_cuda_equals_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    flat = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    assert db.device_checksum(b"h", flat.cuda()) == db.device_checksum(b"h", flat)


def test_auto_asks_the_ranks_where_they_run():
    from rlweave.scheduler.handle import RoleHandle
    from rlweave.scheduler.local import LocalWorkerGroup
    from rlweave.weight_sync.auto import locate, resolve_auto

    class Ctx:
        device = "cpu"

    class W:
        def __init__(self, ctx):
            self.ctx = ctx

    h = RoleHandle("policy", LocalWorkerGroup("policy", W, [Ctx(), Ctx()]))
    places = locate(h, [0, 1], 5)
    assert places[0]["node"] == places[1]["node"] and [p["device"] for p in places] == ["cpu", "cpu"]
    assert resolve_auto(h, h, 5) == "in_process"  # every rank in this process
