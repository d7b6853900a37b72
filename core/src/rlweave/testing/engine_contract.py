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
* partial rollout: ``token_budget`` stops unfinished samples at exactly the budget with
  ``finish_reason="aborted"``, and continuing them greedily from prompt + partial tokens
  gives the uninterrupted tokens, the log-probs of the pieces concatenated matching too;
* ``Generation.versions`` stamps every token with the engine's ``weight_version``;
* ``abort()`` from a second thread stops a long ``generate`` early: its samples come back
  ``"aborted"`` with aligned tokens/log-probs that are a prefix of the uninterrupted
  output, and continuing them gives the rest of it; ``abort()`` while idle returns 0 and
  changes nothing;
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
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rlweave.interfaces.engine import Generation, RolloutEngine, SamplingParams
from rlweave.interfaces.worker import WorkerContext
from rlweave.plugins.types import EngineRecord
from rlweave.targets import import_target
from rlweave.engine_helpers.consistency import logprob_gap
from rlweave.testing.reference import load_reference_model, reference_greedy, reference_logprobs

FINISH_REASONS = {"stop", "length", "aborted", "error"}


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
    #: prompts in the abort test's long call (more: a longer call, harder to miss)
    abort_batch: int = 128

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
    def _check_generation(g: Generation, max_new: int, vocab: int, aborted_ok: bool = False) -> None:
        assert isinstance(g, Generation)
        assert g.finish_reason in FINISH_REASONS, g.finish_reason
        assert g.finish_reason != "error", g.error
        assert aborted_ok or g.finish_reason != "aborted", "a sample came back aborted without a budget or abort()"
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

    # ------------------------------------------------- partial rollout and abort
    @staticmethod
    def _generate_then_abort(engine, prompts, params, delay: float | None) -> tuple[int, list, float]:
        """Run ``generate`` in a second thread and, unless ``delay`` is None, call ``abort()``
        ``delay`` seconds later (then until it reaches the call, or the call ended). Returns
        ``(what abort() returned, the generations, seconds the call took)``; re-raises an
        error of the generate call. (Timed in a thread too: on CPU a call's speed can
        depend on the thread it runs in.)"""
        result: dict = {}

        def run() -> None:
            t0 = time.perf_counter()
            try:
                result["out"] = engine.generate(prompts, params)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
                result["error"] = exc
            result["seconds"] = time.perf_counter() - t0

        worker = threading.Thread(target=run, name="contract-generate")
        worker.start()
        asked = 0
        try:
            if delay is not None:
                time.sleep(delay)
                while not asked and worker.is_alive():
                    asked = engine.abort()
                    if not asked:
                        time.sleep(0.001)
        finally:
            worker.join(timeout=600)
        assert not worker.is_alive(), "generate did not return within 600 s"
        if "error" in result:
            raise result["error"]
        return asked, result["out"], result["seconds"]

    def test_token_budget_stops_and_continuation_matches(self, engine):
        """Greedy with ``token_budget=k``: unfinished samples stop at exactly ``k`` tokens,
        ``"aborted"``; prompt + partial continued (``max_new_tokens - k``) gives the
        uninterrupted tokens, the two pieces' log-probs concatenated match it; a limit that
        is ``max_new_tokens`` or the room left is still ``"length"``; a sample whose stop
        token comes first is ``"stop"``."""
        max_new, k = 12, 5
        near_limit = [(7 * i) % 100 + 2 for i in range(self.max_model_len - 3)]  # room for 3 < k
        prompts = self.prompts + [near_limit]
        greedy = dict(temperature=0.0, ignore_eos=True)
        full = [g[0] for g in engine.generate(prompts, SamplingParams(max_new_tokens=max_new, **greedy))]
        assert [g.finish_reason for g in full] == ["length"] * len(prompts)
        cut = [g[0] for g in engine.generate(prompts, SamplingParams(max_new_tokens=max_new, token_budget=k, **greedy))]
        for i, (f, c) in enumerate(zip(full, cut)):
            assert len(c.token_ids) == len(c.logprobs)
            assert c.token_ids == f.token_ids[: len(c.token_ids)]
            if i == len(prompts) - 1:
                assert (c.finish_reason, len(c.token_ids)) == ("length", 3), "room left < budget must stay 'length'"
            else:
                assert (c.finish_reason, len(c.token_ids)) == ("aborted", k)
        # continue each unfinished sample from prompt + its partial tokens
        todo = [i for i, c in enumerate(cut) if c.finish_reason == "aborted"]
        rest = engine.generate(
            [prompts[i] + cut[i].token_ids for i in todo], SamplingParams(max_new_tokens=max_new - k, **greedy)
        )
        eng, ref = [], []
        for i, gens in zip(todo, rest):
            g = gens[0]
            assert g.finish_reason == "length"
            assert cut[i].token_ids + g.token_ids == full[i].token_ids, f"prompt {i}: continuation differs"
            eng += cut[i].logprobs + g.logprobs
            ref += full[i].logprobs
        gap = logprob_gap(eng, ref)
        assert gap["num_tokens"] == len(todo) * max_new and gap["mean_abs"] < self.logprob_tolerance, gap
        # in rounds of k (partial rollout): 5 + 5 + 2, the last round limited by max_new_tokens
        done = [[] for _ in self.prompts]
        reasons: list[list[str]] = [[] for _ in self.prompts]
        while len(done[0]) < max_new:
            params = SamplingParams(max_new_tokens=max_new - len(done[0]), token_budget=k, **greedy)
            out = engine.generate([p + d for p, d in zip(self.prompts, done)], params)
            for d, r, gens in zip(done, reasons, out):
                d += gens[0].token_ids
                r.append(gens[0].finish_reason)
        assert done == [f.token_ids for f in full[: len(self.prompts)]]
        assert reasons == [["aborted", "aborted", "length"]] * len(self.prompts)
        # a budget that is not smaller than max_new_tokens changes nothing
        same = engine.generate(self.prompts, SamplingParams(max_new_tokens=max_new, token_budget=max_new, **greedy))
        assert [(g[0].token_ids, g[0].finish_reason) for g in same] == [(f.token_ids, "length") for f in full[:-1]]
        # a stop token before the budget ends the sample as usual
        f0 = full[0].token_ids
        j = next((i for i in range(1, k) if f0[i] not in f0[:i]), 0)  # first occurrence of that token
        stop = engine.generate(
            self.prompts[:1], SamplingParams(max_new_tokens=max_new, token_budget=k, stop_token_ids=[f0[j]], **greedy)
        )[0][0]
        assert (stop.token_ids, stop.finish_reason) == (f0[: j + 1], "stop")
        with pytest.raises(ValueError, match="token_budget"):
            engine.generate(self.prompts[:1], SamplingParams(max_new_tokens=4, token_budget=0))

    def test_versions_stamp_every_token(self, engine):
        """After ``set_weight_version(v)`` every generated token carries ``v``; an error
        sample carries none."""
        before = engine.weight_version
        try:
            assert engine.set_weight_version(7) == 7 and engine.weight_version == 7
            out = engine.generate(self.prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3))
            out += engine.generate(self.prompts, SamplingParams(temperature=0.0, max_new_tokens=6, token_budget=2))
            for gens in out:
                for g in gens:
                    assert len(g.token_ids) >= 1 and g.versions == [7] * len(g.token_ids)
            engine.set_weight_version(8)
            greedy3 = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)
            g = engine.generate(self.prompts[:1], greedy3)[0][0]
            assert g.versions == [8, 8, 8]
            if self.long_prompt == "error":
                too_long = [3] * (self.max_model_len + 1)
                err = engine.generate([too_long], SamplingParams(max_new_tokens=3))[0][0]
                assert err.finish_reason == "error" and err.versions == []
        finally:
            engine.set_weight_version(before)

    def test_abort_from_another_thread(self, engine):
        """``abort()`` while a long ``generate`` runs in another thread makes it return early:
        its samples come back ``"aborted"`` (or finished) with aligned tokens, log-probs and
        versions, each a prefix of the uninterrupted greedy output, and continued from prompt +
        those tokens each ends as the uninterrupted one. ``abort()`` while idle returns 0 and
        does not affect the next call."""
        prompts = [[(5 * i) % 97 + 2, (3 * i) % 89 + 2] for i in range(self.abort_batch)]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_model_len, ignore_eos=True)
        room = self.max_model_len - 2
        took = []
        for _ in range(2):  # the second run is warm: its time is what a call takes
            assert engine.abort() == 0, "abort() while idle must ask no call"
            _, gens, seconds = self._generate_then_abort(engine, prompts, params, delay=None)
            full = [g[0] for g in gens]
            took.append(seconds)
        assert [(len(g.token_ids), g.finish_reason) for g in full] == [(room, "length")] * len(prompts)

        # abort a third into the call; should the call beat that (a loaded machine), retry sooner
        for fraction in (1 / 3, 1 / 10, 0.0):
            asked, gens, _ = self._generate_then_abort(engine, prompts, params, delay=min(took) * fraction)
            if asked:
                break
        assert asked == 1, f"generate finished before abort() reached it ({min(took):.2f} s a call): raise abort_batch"
        out = [g[0] for g in gens]
        assert len(out) == len(prompts)
        assert sum(g.finish_reason == "aborted" for g in out) >= 1
        assert sum(len(g.token_ids) for g in out) < sum(len(f.token_ids) for f in full), "abort() did not stop early"
        lp, lp_ref = [], []
        for g, f in zip(out, full):
            assert len(g.token_ids) == len(g.logprobs) == len(g.versions)
            assert g.token_ids == f.token_ids[: len(g.token_ids)], "aborted tokens are not a prefix of the full output"
            if g.finish_reason == "aborted":
                assert len(g.token_ids) < room
            else:
                assert (g.finish_reason, g.token_ids) == ("length", f.token_ids)
            lp += g.logprobs
            lp_ref += f.logprobs[: len(g.logprobs)]
        if lp:
            assert logprob_gap(lp, lp_ref)["mean_abs"] < self.logprob_tolerance
        # continued from prompt + partial tokens, every aborted sample ends as the uninterrupted one
        # (max_new_tokens as before: the room left in max_model_len is the limit, as it was)
        todo = [i for i, g in enumerate(out) if g.finish_reason == "aborted"]
        rest = engine.generate([prompts[i] + out[i].token_ids for i in todo], params)
        for i, gens in zip(todo, rest):
            assert out[i].token_ids + gens[0].token_ids == full[i].token_ids, f"prompt {i}: continuation differs"
            assert gens[0].finish_reason == "length"
        # idle again: abort() asks nothing and the next call is whole
        assert engine.abort() == 0
        again = [g[0] for g in engine.generate(prompts, params)]
        assert [(g.token_ids, g.finish_reason) for g in again] == [(f.token_ids, "length") for f in full]

    def test_weights_land_between_steps_of_a_running_call(self, engine, contract_state):
        """A weight sync's landing (``weights_landing(version)`` + ``load_weights``) from
        another thread while a long greedy call runs: on an engine that
        ``lands_between_steps`` it finishes before the call does, the call's tokens carry the
        old version, then the new one (never back), and, the weights being the same, the
        tokens equal an uninterrupted call's (pausing keeps the running sequences intact);
        on one that does not, it waits for the call's end and every token is old."""
        prompts = [[(5 * i) % 97 + 2, (3 * i) % 89 + 2] for i in range(self.abort_batch)]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_model_len, ignore_eos=True)
        before = engine.weight_version
        full = [g[0].token_ids for g in engine.generate(prompts, params)]
        weights = list(contract_state["weights"].items())
        try:
            for _ in range(3):  # should the call end before the landing reaches it (a fast machine), again
                result: dict = {}

                def run() -> None:
                    result["out"] = engine.generate(prompts, params)
                    result["ended"] = time.perf_counter()

                worker = threading.Thread(target=run, name="contract-generate")
                worker.start()
                while not engine.step_gate.busy and worker.is_alive():
                    time.sleep(0.001)
                version = engine.weight_version + 1
                with engine.weights_landing(version):
                    engine.load_weights(iter(weights))
                landed = time.perf_counter()
                worker.join(timeout=600)
                assert not worker.is_alive() and "out" in result, "generate did not return"
                out = [g[0] for g in result["out"]]
                if not engine.lands_between_steps or any(version in g.versions for g in out):
                    break
            assert engine.weight_version == version
            for g, f in zip(out, full):
                assert len(g.versions) == len(g.token_ids) and g.versions == sorted(g.versions)
                assert set(g.versions) <= {version - 1, version}
                assert g.token_ids == f, "tokens changed across a reload of the same weights"
            stamps = {v for g in out for v in g.versions}
            if engine.lands_between_steps:
                assert landed < result["ended"] and stamps == {version - 1, version}, stamps
            else:
                assert stamps == {version - 1}, stamps
            again = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True))
            assert again[0][0].versions == [version] * 3
        finally:
            engine.set_weight_version(before)

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
