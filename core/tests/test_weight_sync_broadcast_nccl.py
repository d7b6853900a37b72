"""The broadcast group's backend: NCCL when every member is a CUDA rank, gloo otherwise; the
NCCL path (device buckets, device checksum) needs two GPUs and carries the ``gpu`` marker."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")

from rlweave.weight_sync.broadcast import backend_for  # noqa: E402


def test_backend_is_nccl_only_when_every_member_is_a_cuda_rank():
    cuda, cpu = {"device": "cuda"}, {"device": "cpu"}
    assert backend_for([cuda, cuda, cuda]) == "nccl"
    assert backend_for([cuda, cpu]) == "gloo"
    assert backend_for([cpu, cpu]) == "gloo"
    assert backend_for([]) == "gloo"


@pytest.mark.gpu
def test_nccl_broadcast_keeps_buckets_on_the_devices():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (NCCL does not put two ranks on one GPU)")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    from rlweave.testing.transports import nccl_broadcast_rank

    procs = [ctx.Process(target=nccl_broadcast_rank, args=(r, port, 8, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = {m[0]: m for m in (q.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(60)
    assert "error" not in results, results
    sent, (_, received, same) = results["sent"][1], results["received"]
    assert received == sent and sent["buckets"] >= 3 and same
