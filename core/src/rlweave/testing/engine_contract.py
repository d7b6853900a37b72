"""The inference-engine contract as a pytest class every engine plugin subclasses.

Usage, in a plugin's ``tests/test_<engine>_contract.py``::

    from rlweave.testing.engine_contract import EngineContractSuite

    class TestMyEngineContract(EngineContractSuite):
        engine_name = "mine"                                   # EngineRecord name
        engine_target = "my_engine.engine:MyEngine"            # the RolloutEngine subclass
        engine_options = {"max_model_len": 48}                  # its plugin options

The suite builds one tiny random Qwen2 checkpoint and one engine per test class
(class-scoped fixtures ``model_dir`` and ``engine``: engines may take tens of seconds to
start) and checks, against plain transformers on the same weights:

* shapes and finish reasons; stop ids end a sample and are kept; ``ignore_eos``;
* ``n`` samples per prompt; seeded sampling reproducible (and, with
  ``batch_invariant_seeds``, independent of the rest of the batch);
* the log-probs the engine reports equal ``log_softmax(logits / T)`` of the sampled tokens
  (mean |delta| below ``logprob_tolerance``), the quantity training backends recompute;
* after ``load_weights`` with perturbed weights, greedy output identical to transformers
  ``generate`` on those weights;
* a corrupted weight-sync bucket is rejected by the verification of
  :mod:`rlweave.weight_sync` and never reaches the engine;
* a prompt longer than ``max_model_len`` gives a per-sample error (or truncation, per
  ``long_prompt``) and the engine keeps working;
* ``sleep``/``wake_up`` keep the engine usable;
* through the Ray scheduler (slow): an engine whose process dies is reported as a
  :class:`rlweave.scheduler.WorkerError` naming role and rank.

Override :meth:`make_context` or :meth:`make_engine` for engines that need more than a
:class:`~rlweave.interfaces.worker.WorkerContext` with ``options=engine_options``.
Prompts are token ids; no tokenizer is needed.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from rlweave.interfaces.engine import Generation, RolloutEngine, SamplingParams
from rlweave.interfaces.worker import WorkerContext
from rlweave.plugins.types import EngineRecord, import_target
from rlweave.engine_helpers.consistency import logprob_gap
from rlweave.testing.reference import load_reference_model, reference_greedy, reference_logprobs

FINISH_REASONS = {"stop", "length", "error"}


class EngineContractSuite:
    """Base class of engine contract tests (not collected itself: no ``Test`` prefix)."""

    #: name of the engine's EngineRecord (used for the scheduler test)
    engine_name: str = ""
    #: ``"module:Class"`` of the RolloutEngine subclass
    engine_target: str = ""
    #: the engine's plugin options (``roles.rollout.options``)
    engine_options: dict[str, Any] = {}
    #: must match ``engine_options['max_model_len']``
    max_model_len: int = 48
    #: the long-prompt policy the engine is configured with (``engine_options['long_prompt']``)
    long_prompt: str = "error"
    #: tiny model shape (head size 32: vLLM's CPU attention supports 32 and up)
    model_kwargs: dict[str, Any] = dict(vocab_size=128, hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, seed=0)
    #: max mean |log-prob difference| against transformers, fp32
    logprob_tolerance: float = 1e-3
    #: True when a seeded sample does not depend on the other samples in the call
    batch_invariant_seeds: bool = False

    prompts: list[list[int]] = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 11], [60]]

    # ------------------------------------------------------------- overridable
    def build_model(self, path: Path) -> Path:
        """Write the tiny checkpoint the suite runs on; returns its directory."""
        from rlweave.testing.tiny_model import build_tiny_qwen2

        return build_tiny_qwen2(path, **self.model_kwargs)

    def make_context(self, model_dir: Path, rank: int = 0) -> WorkerContext:
        return WorkerContext(
            role="rollout",
            rank=rank,
            world_size=1,
            device="cpu",
            options=dict(self.engine_options),
            model={"path": str(model_dir), "dtype": "float32"},
            seed=1,
        )

    def make_engine(self, model_dir: Path) -> RolloutEngine:
        cls = import_target(self.engine_target)
        engine = cls(self.make_context(model_dir))
        engine.init_engine()
        return engine

    # ---------------------------------------------------------------- fixtures
    @pytest.fixture(scope="class")
    def model_dir(self, tmp_path_factory) -> Path:
        return self.build_model(tmp_path_factory.mktemp("engine_contract_model") / "tiny")

    @pytest.fixture(scope="class")
    def contract_state(self, model_dir) -> dict[str, Any]:
        """The weights the engine currently holds (HF names -> tensors), kept in step by
        the tests that load new weights, so transformers references use the same."""
        import torch
        from safetensors.torch import load_file

        files = sorted(Path(model_dir).glob("*.safetensors"))
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return {"weights": state}

    @pytest.fixture(scope="class")
    def engine(self, model_dir):
        engine = self.make_engine(model_dir)
        try:
            yield engine
        finally:
            engine.shutdown()

    @pytest.fixture(scope="class")
    def reference(self, model_dir, contract_state):
        """A transformers model on the engine's current weights (refreshed by tests that
        change them)."""
        return {"model": load_reference_model(model_dir, contract_state["weights"])}

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _check_generation(g: Generation, max_new: int, vocab: int) -> None:
        assert isinstance(g, Generation)
        assert g.finish_reason in FINISH_REASONS, g.finish_reason
        assert g.finish_reason != "error", g.error
        assert len(g.token_ids) == len(g.logprobs)
        assert 1 <= len(g.token_ids) <= max_new
        if g.finish_reason == "length":
            assert len(g.token_ids) == max_new
        assert all(0 <= t < vocab for t in g.token_ids)
        assert all(math.isfinite(x) and x <= 1e-6 for x in g.logprobs)

    def _greedy(self, engine, prompts, max_new=12) -> list[list[int]]:
        out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True))
        return [gs[0].token_ids for gs in out]

    # ------------------------------------------------------------------- tests
    def test_health(self, engine):
        info = engine.health()
        assert info["role"] == "rollout" and info["rank"] == 0 and info["pid"] == os.getpid()
        assert engine.max_model_len == self.max_model_len

    def test_shapes_and_finish_reasons(self, engine):
        vocab = self.model_kwargs["vocab_size"]
        out = engine.generate(self.prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3))
        assert len(out) == len(self.prompts)
        for gens in out:
            assert len(gens) == 2
            for g in gens:
                self._check_generation(g, 8, vocab)
        out = engine.generate(self.prompts, SamplingParams(temperature=1.0, max_new_tokens=10, seed=4, ignore_eos=True))
        assert [(len(g[0].token_ids), g[0].finish_reason) for g in out] == [(10, "length")] * len(self.prompts)

    def test_stop_token_ends_sample(self, engine):
        full = self._greedy(engine, self.prompts[:1], max_new=12)[0]
        j = next(i for i in range(1, len(full)) if full[i] not in full[:i])
        out = engine.generate(
            self.prompts[:1],
            SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=[full[j]], ignore_eos=True),
        )
        g = out[0][0]
        assert g.token_ids == full[: j + 1]
        assert g.finish_reason == "stop"
        assert len(g.logprobs) == j + 1

    def test_n_samples_per_prompt(self, engine):
        out = engine.generate(self.prompts[:2], SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=5))
        assert [len(g) for g in out] == [4, 4]
        for gens in out:
            distinct = {tuple(g.token_ids) for g in gens}
            assert len(distinct) > 1, "n samples of one prompt are all identical at temperature 1"

    def test_seeded_sampling_reproducible(self, engine):
        params = SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=8, seed=11)
        a = engine.generate(self.prompts, params)
        b = engine.generate(self.prompts, params)
        c = engine.generate(self.prompts, SamplingParams(**{**params.__dict__, "seed": 12}))
        toks = lambda out: [[g.token_ids for g in gens] for gens in out]  # noqa: E731
        assert toks(a) == toks(b)
        for ga, gb in zip(a, b):
            for x, y in zip(ga, gb):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
        assert toks(a) != toks(c)
        if self.batch_invariant_seeds:
            # seeds follow (prompt index, sample index): a smaller batch keeps the first samples
            fewer = engine.generate(self.prompts[:2], params)
            assert toks(fewer) == toks(a)[:2]

    @pytest.mark.parametrize("temperature", [1.0, 0.7])
    def test_logprobs_match_transformers(self, engine, reference, temperature):
        out = engine.generate(self.prompts, SamplingParams(n=2, temperature=temperature, max_new_tokens=10, seed=21))
        eng, ref = [], []
        for prompt, gens in zip(self.prompts, out):
            for g in gens:
                eng += g.logprobs
                ref += reference_logprobs(reference["model"], prompt, g.token_ids, temperature).tolist()
        gap = logprob_gap(eng, ref)
        assert gap["num_tokens"] == len(eng) > 0
        assert gap["mean_abs"] < self.logprob_tolerance, gap

    def test_greedy_matches_transformers_after_load_weights(self, engine, reference, model_dir, contract_state):
        import torch

        before = self._greedy(engine, self.prompts)
        assert before == [reference_greedy(reference["model"], p, 12) for p in self.prompts]

        gen = torch.Generator().manual_seed(1234)
        new = {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in contract_state["weights"].items()}
        engine.load_weights(iter(list(new.items())))
        contract_state["weights"] = new
        reference["model"] = load_reference_model(model_dir, new)

        after = self._greedy(engine, self.prompts)
        assert after != before, "load_weights had no effect on greedy output"
        assert after == [reference_greedy(reference["model"], p, 12) for p in self.prompts]
        # and the log-probs follow the new weights too
        out = engine.generate(self.prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=8, seed=2))
        ref = reference_logprobs(reference["model"], self.prompts[0], out[0][0].token_ids)
        assert logprob_gap(out[0][0].logprobs, ref)["mean_abs"] < self.logprob_tolerance

    def test_corrupted_bucket_rejected(self, engine, contract_state):
        import torch

        from rlweave.weight_sync.buckets import iter_buckets, unpack_bucket
        from rlweave.weight_sync.interface import WeightSyncError

        before = self._greedy(engine, self.prompts)
        gen = torch.Generator().manual_seed(99)
        new = [(k, v + 0.5 * torch.randn(v.shape, generator=gen)) for k, v in contract_state["weights"].items()]
        buckets = list(iter_buckets(new, bucket_bytes=1 << 40))  # one bucket: all or nothing
        assert len(buckets) == 1
        meta, payload = buckets[0]
        payload = payload.copy()
        payload[len(payload) // 2] ^= 0xFF
        with pytest.raises(WeightSyncError, match=r"bucket 0 .*failed verification"):
            for m, p in [(meta, payload)]:  # what a receiving rank does for every bucket
                engine.load_weights(unpack_bucket(m, p, where="rollout rank 0"))
        assert self._greedy(engine, self.prompts) == before, "a rejected bucket changed the engine's weights"
        # the intact bucket goes through the same path
        engine.load_weights(unpack_bucket(*buckets[0], where="rollout rank 0"))
        assert self._greedy(engine, self.prompts) != before
        engine.load_weights(iter(list(contract_state["weights"].items())))  # back to the tracked weights
        assert self._greedy(engine, self.prompts) == before

    def test_long_prompt_handled_and_engine_survives(self, engine):
        too_long = [(7 * i) % 100 + 2 for i in range(self.max_model_len + 5)]
        near_limit = too_long[: self.max_model_len - 3]  # fits, leaves room for 3 tokens
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=1, ignore_eos=True)
        out = engine.generate([too_long, self.prompts[0], near_limit], params)
        assert [len(g) for g in out] == [2, 2, 2]
        for g in out[0]:
            if self.long_prompt == "error":
                assert g.finish_reason == "error" and g.token_ids == [] and g.logprobs == []
                assert "max_model_len" in (g.error or "") and str(self.max_model_len) in g.error
            else:
                assert g.truncated and g.finish_reason == "length" and len(g.token_ids) >= 1
        for g in out[1]:
            assert g.finish_reason == "length" and len(g.token_ids) == 8 and not g.truncated
        for g in out[2]:
            assert g.finish_reason == "length" and len(g.token_ids) == 3
        # still alive and correct
        again = engine.generate([self.prompts[0]], SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True))
        assert len(again[0][0].token_ids) == 4

    def test_sleep_wake_up(self, engine):
        before = self._greedy(engine, self.prompts)
        info = engine.sleep(level=1)
        assert isinstance(info, dict) and int(info["freed_bytes"]) >= 0
        engine.wake_up()
        assert self._greedy(engine, self.prompts) == before

    # ------------------------------------------------------ through the scheduler
    @pytest.mark.slow
    def test_dead_engine_reported_with_role_and_rank(self, model_dir):
        from rlweave.config.schema import RunConfig
        from rlweave.scheduler import WorkerError, build_roles, ray_session

        cfg = RunConfig.model_validate(
            {
                "ray": {"num_cpus": 2},
                "model": {"path": str(model_dir), "dtype": "float32"},
                "resources": {"pools": {"default": {"device": "cpu", "devices_per_node": 1}}},
                "roles": {"rollout": {"engine": self.engine_name, "devices": 1, "options": dict(self.engine_options)}},
            }
        )
        record = EngineRecord(name=self.engine_name, summary="contract test", target=self.engine_target)
        params = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
        with ray_session(cfg.ray):
            handle = build_roles(cfg, {"rollout": record}, ["rollout"])["rollout"]
            health: dict = {}
            try:
                gens = handle.generate([self.prompts[0]], params).result(timeout=300)
                assert len(gens[0][0].token_ids) == 4
                health = handle.call("health").result(timeout=60)[0]
                assert health["role"] == "rollout" and health["rank"] == 0
                # 1. the engine's own process dies (engines that have one, e.g. vLLM's core)
                for pid in health.get("engine_pids", []):
                    os.kill(int(pid), signal.SIGKILL)
                if health.get("engine_pids"):
                    time.sleep(1.0)
                    with pytest.raises(WorkerError) as err:
                        handle.generate([self.prompts[0]], params).result(timeout=120)
                    assert err.value.role == "rollout" and err.value.rank == 0
                    assert "rollout" in str(err.value) and "rank 0" in str(err.value)
                # 2. the rank's whole process dies
                os.kill(int(health["pid"]), signal.SIGKILL)
                time.sleep(1.0)
                with pytest.raises(WorkerError) as err:
                    handle.generate([self.prompts[0]], params).result(timeout=120)
                assert err.value.role == "rollout" and err.value.rank == 0
                assert "rollout" in str(err.value) and "rank 0" in str(err.value)
            finally:
                handle.shutdown()
                if health.get("scratch_dir"):  # what the killed process could not remove itself
                    shutil.rmtree(health["scratch_dir"], ignore_errors=True)
