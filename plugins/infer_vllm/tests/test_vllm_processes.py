"""The vLLM engine and the processes around it: another child of the engine's process, here a
zombie, never disturbs it (the engine once listed every child and died on its ``cmdline()``),
and ``shutdown()`` leaves none of the processes vLLM started behind, running or as a zombie
(vLLM kills an engine core that outlives its 5 s grace and never waits for it)."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (pip install rlweave-infer-vllm[cpu] or [gpu])")
psutil = pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlweave.testing.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("procs") / "m", vocab_size=128, hidden=128, layers=1, heads=4,
                            kv_heads=2, ffn=256, seed=5)


@pytest.fixture
def zombie():
    """A child of this process that has ended and is not waited for until the test is over."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    yield pid
    os.waitpid(pid, 0)


def _gone(pid: int, created: float) -> bool:
    try:
        return psutil.Process(pid).create_time() != created  # the pid was reused
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("engine_core", ["in_process", "subprocess"])
def test_foreign_zombie_tolerated_and_shutdown_reaps(model_dir, zombie, engine_core):
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.interfaces.worker import WorkerContext
    from rlweave_infer_vllm.engine import VLLMEngine

    engine = VLLMEngine(WorkerContext(role="rollout", rank=0, seed=1, model={"path": str(model_dir), "dtype": "float32"},
                                      options={"max_model_len": 32, "kv_cache_gib": 0.25, "engine_core": engine_core}))
    try:
        engine.init_engine()
        out = engine.generate([[3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True))
        assert len(out[0][0].token_ids) == 2
        info = engine.health()
        pids = engine.engine_pids()
        assert psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE  # the engine ran beside it
        assert zombie not in pids and zombie not in info["engine_pids"]
        if engine_core == "in_process":
            assert pids == []
        else:  # the engine core (a child of this process) and its worker
            assert len(pids) >= 2 and psutil.Process(pids[0]).ppid() == os.getpid(), pids
        started = {pid: psutil.Process(pid).create_time() for pid in pids}
    finally:
        engine.shutdown()
    assert engine.engine_pids() == []
    left = [pid for pid, created in started.items() if not _gone(pid, created)]
    assert left == [], f"processes of the engine left after shutdown(): {left}"
    engine.shutdown()  # idempotent
