"""The training-backend contract as a pytest class every backend plugin subclasses.

Usage, in a plugin's ``tests/test_<backend>_contract.py``, class attributes only::

    from rlweave.testing.backend_contract import BackendContractSuite

    class TestMyBackendContract(BackendContractSuite):
        backend = "mine"                                   # its BackendRecord name
        options = {"max_tokens_per_micro_batch": 32}       # roles.<role>.options: >1 micro-batch
        parallel = {"dp": 2}                               # roles.<role>.parallel on world_size ranks
        world_size = 2
        reload_parallel = {}                               # ... on reload_world_size ranks
        reload_world_size = 1
        reload_options = None                              # options there (None: the same)
        tolerance = 1e-5                                   # fp32

The worker class is the record's ``load()``; a record that is unavailable here (its ``probe``)
skips the suite with the probe's reason. The model types checked are the record's
``model_types``: a type it does not list is skipped, saying so. Every check compares with plain
transformers and torch on the same weights (a tiny random Qwen2, fp32):

1. ``compute_logprobs(with_entropy=True)`` of a packed shard of samples of different lengths;
2. one ``train_step`` (token-weighted NLL, AdamW, clipping active, LR warm-up): loss, gradient
   norm, learning rate and updated weights equal one step of transformers + ``torch.optim.AdamW``
   on the whole batch in one process (the token-weight convention);
3. ``compute_scores`` (``reward``) and ``compute_values`` (``value``) equal transformers'
   classification models with the same ``score.weight``; a value step's loss is the reference's
   and it moves the head;
4. ``save_checkpoint`` after one step on ``world_size`` ranks, ``load_checkpoint`` on
   ``reload_world_size`` ranks: equal weights, and the next step equals the original ranks'
   next step (optimizer state and LR schedule restored);
5. ``named_weights()`` has transformers' ``state_dict`` names (a tied ``lm_head.weight`` may be
   left out) and shapes, streams the files' weights before training and in a stable order; after
   a step, loaded into transformers they give the worker's log-probs, and ``save_hf`` wrote the
   same tensors in a directory transformers loads;
6. ``offload`` reports ``param_bytes`` > 0 on every rank, and log-probs after ``onload`` are
   bitwise those before;
7. a loss that is NaN on one rank only: ``train_step`` reports ``skipped == 1.0`` on every rank,
   no weight changes, the LR schedule does not advance, and the next normal step trains.

Time: all checks at ``world_size`` run in one spawn of the ranks (``contract_run``, a
class-scoped fixture), the reload in a second (``reload_run``): the rank side is
:mod:`rlweave.testing.scenarios.contract`. A subclass's tests form one ``xdist_group``
(``backend_contract_<backend>``), so ``--dist loadgroup`` spawns them once.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlweave.testing.scenarios import contract as sc
from rlweave.testing.scenarios import reference as ref

N_SAMPLES = sc.N_SAMPLES


class BackendContractSuite:
    """Base class of backend contract tests (not collected itself: no ``Test`` prefix)."""

    #: name of the backend's BackendRecord (``roles.<role>.backend``)
    backend: str = ""
    #: the backend's ``roles.<role>.options``; a token budget small enough for several micro-batches
    options: ClassVar[dict[str, Any]] = {}
    #: ``roles.<role>.parallel`` for ``world_size`` ranks
    parallel: ClassVar[dict[str, int]] = {}
    world_size: int = 2
    #: ``roles.<role>.parallel`` for ``reload_world_size`` ranks, which load the checkpoint
    reload_parallel: ClassVar[dict[str, int]] = {}
    reload_world_size: int = 1
    #: ``roles.<role>.options`` of the ranks that load the checkpoint (None: ``options``)
    reload_options: ClassVar[dict[str, Any] | None] = None
    #: max absolute difference from the references (relative to the value for losses and norms above 1)
    tolerance: float = 1e-5
    #: ``roles.<role>.optim``: warm-up over 4 steps (each step's LR differs), a clip below the gradient norm
    optim: ClassVar[dict[str, Any]] = {"lr": 1e-2, "weight_decay": 0.01, "eps": 1e-3, "grad_clip": 1.0, "warmup_steps": 4}
    #: arguments of :func:`rlweave.testing.tiny_model.build_tiny_qwen2`
    model_kwargs: ClassVar[dict[str, Any]] = {"seed": 1}
    #: seconds each spawn of the ranks may take
    timeout_s: float = 600

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.backend and "pytestmark" not in cls.__dict__:
            cls.pytestmark = [pytest.mark.xdist_group(f"backend_contract_{cls.backend}")]

    # ---------------------------------------------------------------- fixtures
    @pytest.fixture(scope="class")
    def record(self):
        """The backend's record; skips the suite when its probe says it cannot run here."""
        from rlweave.plugins.errors import PluginUnavailableError
        from rlweave.plugins.manager import get_plugin_manager

        try:
            return get_plugin_manager().get("backend", self.backend)
        except PluginUnavailableError as exc:
            pytest.skip(str(exc))

    @pytest.fixture(scope="class")
    def models(self, tmp_path_factory) -> Iterator[dict[str, str]]:
        from rlweave.testing.tiny_model import build_tiny_qwen2

        root = tmp_path_factory.mktemp(f"backend_contract_{self.backend}_models")
        model = str(build_tiny_qwen2(root / "causal_lm", **self.model_kwargs))
        yield {"model_dir": model, "heads_dir": sc.build_heads_model(model, str(root / "heads"))}
        shutil.rmtree(root, ignore_errors=True)

    @pytest.fixture(scope="class")
    def spec(self, record, models, tmp_path_factory) -> Iterator[dict[str, Any]]:
        work = tmp_path_factory.mktemp(f"backend_contract_{self.backend}")
        yield {"backend": self.backend, **models, "work": str(work), "options": dict(self.options),
               "parallel": dict(self.parallel), "optim": dict(self.optim), "kinds": list(record.model_types)}
        shutil.rmtree(work, ignore_errors=True)

    @pytest.fixture(scope="class")
    def contract_run(self, spec) -> dict[str, Any]:
        """Rank 0's results of every check at ``world_size``, by model type."""
        from rlweave.testing.ranks import run_ranks

        return run_ranks(sc.contract_scenario, self.world_size, spec, timeout_s=self.timeout_s)

    @pytest.fixture(scope="class")
    def reload_run(self, spec, contract_run) -> dict[str, Any]:
        """The checkpoint of ``contract_run`` loaded on ``reload_world_size`` ranks."""
        from rlweave.testing.ranks import run_ranks

        self._needs(spec, "causal_lm")
        options = dict(self.options if self.reload_options is None else self.reload_options)
        return run_ranks(sc.reload_scenario, self.reload_world_size,
                         {**spec, "parallel": dict(self.reload_parallel), "options": options}, timeout_s=self.timeout_s)

    # ----------------------------------------------------------------- helpers
    def _needs(self, spec: dict, kind: str) -> None:
        if kind not in spec["kinds"]:
            pytest.skip(f"backend {self.backend!r} does not list model type {kind!r} in its record's model_types "
                        f"{tuple(spec['kinds'])}")

    def _policy(self, spec: dict, run: dict) -> dict[str, Any]:
        self._needs(spec, "causal_lm")
        return run["causal_lm"]

    def _close(self, got: dict, want: dict, what: str) -> None:
        """Per-sample tensors (or scalars) of all samples within ``tolerance``."""
        assert set(got) == set(want) == set(range(N_SAMPLES)), f"{what}: samples {sorted(got)}"
        for i, w in want.items():
            diff = float((got[i] - w).abs().max())
            assert diff < self.tolerance, f"{what}: sample {i} differs by {diff:.3g}"

    def _near(self, got: float, want: float, what: str) -> None:
        assert abs(got - want) <= self.tolerance * max(1.0, abs(want)), f"{what}: {got} != {want}"

    def _same_weights(self, got: dict, want: dict, what: str, exact: bool = False) -> None:
        assert set(got) <= set(want) and got, f"{what}: names {sorted(set(got) - set(want))} unknown"
        for name, t in got.items():
            assert t.shape == want[name].shape, f"{what}: {name} shape {tuple(t.shape)}"
            diff = float((t - want[name]).abs().max())
            assert (diff == 0.0) if exact else (diff < self.tolerance), f"{what}: {name} differs by {diff:.3g}"

    @staticmethod
    def _files(folder: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        out: dict[str, Any] = {}
        for f in sorted(Path(folder).glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    # ------------------------------------------------------------------- tests
    def test_logprobs_and_entropy_match_transformers(self, spec, contract_run):
        res = self._policy(spec, contract_run)
        lps, ents = ref.reference_outputs(spec["model_dir"])
        self._close(res["logprobs"], lps, "log-probs")
        self._close(res["entropy"], ents, "entropy")

    def test_train_step_matches_plain_torch(self, spec, contract_run):
        res = self._policy(spec, contract_run)
        want = ref.reference_train_step(spec["model_dir"], self.optim)
        got = res["step"]
        assert want["grad_norm"] > self.optim["grad_clip"] > 0, "the reference step must be clipped"
        assert got["skipped"] == 0.0
        assert got["num_micro_batches"] >= 2, "options give one micro-batch per rank: lower the token budget"
        assert (got["tokens"], got["samples"]) == (sc.fixed_batch().num_tokens, N_SAMPLES)
        for key in ("loss", "grad_norm", "lr"):
            self._near(got[key], want[key], key)
        self._near(got["nll"], want["loss"], "the loss function's metric")
        self._same_weights(res["streamed1"], want["weights"], "weights after the step")

    def test_reward_scores_match_transformers(self, spec, contract_run):
        self._needs(spec, "reward")
        res = contract_run["reward"]
        _, scores = ref.reference_heads(spec["heads_dir"])
        self._close(res["scores"], scores, "scores")
        assert max(abs(float(s)) for s in scores.values()) > 1e-2, "the head reads nothing"

    def test_values_match_transformers_and_a_step_moves_the_head(self, spec, contract_run):
        self._needs(spec, "value")
        res = contract_run["value"]
        values, _ = ref.reference_heads(spec["heads_dir"])
        self._close(res["values"], values, "values")
        batch = sc.fixed_batch()
        loss = sum(float((w * (values[i] - 1.0) ** 2).sum()) for i, w in enumerate(batch.sequences("token_weight")))
        self._near(res["step"]["loss"], loss, "value loss")
        assert res["step"]["skipped"] == 0.0
        before, after = res["streamed0"]["score.weight"], res["streamed1"]["score.weight"]
        assert float((after - before).abs().max()) > self.tolerance, "a value step left the head unchanged"

    def test_checkpoint_reloads_at_another_world_size(self, spec, contract_run, reload_run):
        res = self._policy(spec, contract_run)
        self._same_weights(reload_run["loaded"], res["streamed1"], "weights after load_checkpoint")
        assert set(reload_run["loaded"]) == set(res["streamed1"])
        a, b = res["next_step"], reload_run["next_step"]
        assert a["lr"] != res["step"]["lr"], "the schedule must give the next step another learning rate"
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-12), "LR schedule not restored"
        for key in ("loss", "grad_norm"):
            self._near(b[key], a[key], f"next step's {key}")
        self._same_weights(reload_run["streamed2"], res["streamed2"], "weights after the next step")

    def test_streamed_weights_have_transformers_names(self, spec, contract_run):
        from rlweave.testing.reference import load_reference_model

        res = self._policy(spec, contract_run)
        model = load_reference_model(spec["model_dir"])
        sd, tied = model.state_dict(), bool(getattr(model.config, "tie_word_embeddings", False))
        streamed, names = res["streamed0"], set(sd)
        allowed = [names, names - {"lm_head.weight"}] if tied else [names]
        assert set(streamed) in allowed, f"names {sorted(set(streamed) ^ names)} differ from transformers'"
        self._same_weights(streamed, sd, "weights streamed before training (the model's files)")
        assert list(res["streamed1"]) == list(streamed) == list(res["streamed2"]), "the order is not stable"

    def test_streamed_weights_score_like_the_worker_and_equal_save_hf(self, spec, contract_run):
        res = self._policy(spec, contract_run)
        streamed, hf = res["streamed1"], str(Path(spec["work"]) / "hf")
        lps, _ = ref.reference_outputs(spec["model_dir"], state=streamed)
        self._close(res["logprobs1"], lps, "transformers with the streamed weights")
        saved = self._files(hf)
        assert set(saved) == set(streamed), f"save_hf names {sorted(set(saved) ^ set(streamed))}"
        self._same_weights(saved, streamed, "save_hf files", exact=True)
        lps, _ = ref.reference_outputs(hf)
        self._close(res["logprobs1"], lps, "transformers on the save_hf directory")

    def test_offload_onload_keeps_logprobs(self, spec, contract_run):
        res = self._policy(spec, contract_run)
        assert all(r["param_bytes"] > 0 for r in res["offload"]), res["offload"]
        for i, lp in res["logprobs1"].items():
            assert lp.equal(res["logprobs_onload"][i]), f"sample {i}: log-probs changed by offload/onload"

    def test_non_finite_loss_on_one_rank_skips_the_step(self, spec, contract_run):
        res = self._policy(spec, contract_run)
        nan = res["nan_step"]
        assert len(nan) == self.world_size and all(m["skipped"] == 1.0 for m in nan), [m["skipped"] for m in nan]
        self._same_weights(res["streamed_nan"], res["streamed2"], "weights after a skipped step", exact=True)
        after = res["after_nan_step"]
        assert after["skipped"] == 0.0 and after["loss"] == after["loss"]
        assert after["lr"] == nan[0]["lr"], "a skipped step advanced the LR schedule"
        moved = max(float((res["streamed_after_nan"][k] - v).abs().max()) for k, v in res["streamed_nan"].items())
        assert moved > self.tolerance, "the step after a skipped one did not train"
