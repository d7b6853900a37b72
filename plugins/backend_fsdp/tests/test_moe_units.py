"""MoE pieces of the FSDP backend in one process: the load-balancing loss against
transformers, router capture, expert-load metrics, checkpoint names of stacked experts
(Qwen3-MoE and Mixtral), and the validation-time refusal of MoE with sequence parallelism."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from rlweave.testing.tiny_model import build_tiny_qwen2, build_tiny_qwen3_moe
from rlweave_backend_fsdp import checks, hf_export, moe
from rlweave_backend_fsdp.config import FSDPConfig
from rlweave_backend_fsdp.moe_layout import CheckpointLayout


@pytest.fixture(scope="module")
def q3(tmp_path_factory):
    return str(build_tiny_qwen3_moe(tmp_path_factory.mktemp("moe_unit") / "q3", seed=4))


def eager(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, experts_implementation="eager").eval()


@pytest.mark.parametrize("module", ["qwen3_moe", "qwen2_moe", "mixtral"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_load_balancing_loss_equals_transformers(module, top_k):
    import importlib

    ref_fn = importlib.import_module(f"transformers.models.{module}.modeling_{module}").load_balancing_loss_func
    g = torch.Generator().manual_seed(top_k)
    logits = tuple(torch.randn(n, 8, generator=g, requires_grad=True) for n in (13, 13, 13))
    mine = moe.load_balancing_loss(logits, 8, top_k)
    ref = ref_fn(logits, 8, top_k)
    assert float(mine.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    for a, b in zip(torch.autograd.grad(mine, logits), torch.autograd.grad(ref, logits)):
        assert float((a - b).abs().max()) < 1e-7 and float(a.abs().max()) > 0


def test_router_tap_captures_the_routers_of_one_forward(q3):
    """The hooks keep the logits transformers reports as ``router_logits``, only inside
    ``capture()``; the aux loss on them is the model's ``aux_loss``."""
    m = eager(q3)
    blocks = moe.find_blocks(m)
    assert [(b.name, b.num_experts, b.top_k) for b in blocks] == [("model.layers.0.mlp", 8, 2),
                                                                  ("model.layers.1.mlp", 8, 2)]
    tap = moe.RouterTap(blocks)
    ids = torch.randint(2, 128, (1, 21), generator=torch.Generator().manual_seed(0))
    m(ids)
    assert tap.logits == []
    with tap.capture() as got:
        out = m(ids, output_router_logits=True)
    m(ids)
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, out.router_logits))
    aux = moe.load_balancing_loss(got, 8, 2)
    assert float(aux.detach()) == pytest.approx(float(out.aux_loss.detach()), rel=1e-6)

    def mine():
        return [h for b in blocks for h in b.router._forward_hooks.values() if getattr(h, "__self__", None) is tap]

    assert len(mine()) == 2
    tap.remove()
    assert not mine()


def test_load_metrics_of_forced_and_balanced_routing():
    """Every token sent to experts 0 and 1 (top-2 of 8): the busiest experts carry
    ``E / top_k = 4`` times the mean, the idle ones 0; a perfectly balanced router gives 1."""
    t, e, k = 10, 8, 2
    forced = torch.full((t, e), -10.0)
    forced[:, 0], forced[:, 1] = 5.0, 4.0
    counts = moe.expert_counts([forced, forced], e, k)
    assert counts[:, :2].eq(t).all() and counts[:, 2:].eq(0).all()
    m = moe.load_metrics(counts)
    assert m == {"moe_load_max_over_mean": e / k, "moe_load_min_over_mean": 0.0, "moe_tokens_per_expert_max": t}
    balanced = torch.full((8, e), -10.0)
    for i in range(8):  # token i prefers experts 2i and 2i+1 (mod 8): every expert gets 2 tokens
        balanced[i, (2 * i) % e], balanced[i, (2 * i + 1) % e] = 5.0, 4.0
    m = moe.load_metrics(moe.expert_counts([balanced], e, k))
    assert m == {"moe_load_max_over_mean": 1.0, "moe_load_min_over_mean": 1.0, "moe_tokens_per_expert_max": 2.0}
    assert moe.load_metrics(torch.zeros(2, e)) == {}


def test_mixtral_export_uses_its_checkpoint_names(tmp_path):
    """Stacked Mixtral experts stream and export as ``block_sparse_moe.experts.<e>.w1/w3/w2``
    plus ``block_sparse_moe.gate`` -- the names ``save_pretrained`` writes -- and the export
    reloads in transformers with identical logits."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rlweave.testing.tiny_model import build_tiny_mixtral

    ref_dir = build_tiny_mixtral(tmp_path / "ref")
    model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    ref = load_file(str(ref_dir / "model.safetensors"))
    streamed = dict(hf_export.stream_full(model, 0, set()))
    assert set(streamed) == set(ref) and "model.layers.1.block_sparse_moe.experts.3.w3.weight" in ref
    for k, v in ref.items():
        assert torch.equal(streamed[k], v), k
    hf_export.write_hf(str(tmp_path / "out"), iter(streamed.items()), hf_export.export_config(model, "causal_lm",
                       torch.float32), "causal_lm", None, 1 << 30)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    ids = torch.randint(2, 128, (1, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_streamed_expert_slices_are_copies(q3):
    """A per-expert tensor is its own storage (a consumer keeping it does not pin the whole
    stacked tensor); the streamed tensors of a one-rank model are snapshots, not parameters."""
    m = eager(q3)
    streamed = dict(hf_export.stream_full(m, 0, set()))
    stacked = m.model.layers[0].mlp.experts.gate_up_proj
    piece = streamed["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert torch.equal(piece, stacked[3, :32]) and piece.untyped_storage().nbytes() == piece.numel() * 4
    assert streamed["lm_head.weight"].data_ptr() != m.lm_head.weight.data_ptr()


def test_unknown_stacked_expert_layout_is_refused(q3):
    m = eager(q3)
    m.config.model_type = "olmoe"
    with pytest.raises(ValueError, match=r"model type 'olmoe'.*mixtral, qwen2_moe, qwen3_moe"):
        CheckpointLayout(m)
    m.config.model_type = "qwen3_moe"
    m.model.layers[1].mlp.experts.down_proj = torch.nn.Parameter(torch.zeros(8, 16, 64))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.experts .*expected gate_up_proj \(E, 2I, H\)"):
        CheckpointLayout(m)


def test_validation_refuses_moe_with_sequence_parallelism(q3, tmp_path):
    dense = str(build_tiny_qwen2(tmp_path / "dense", hidden=64, heads=4, kv_heads=2))

    def problems(path: str, sp: int):
        section = SimpleNamespace(parallel={"sp": sp}, options={})
        return checks.check_role("policy", section, SimpleNamespace(path=path))

    (key, msg), = problems(q3, 2)
    assert key == "roles.policy.parallel.sp"
    assert "mixture-of-experts models (8 experts) with parallel.sp=2 are not supported yet" in msg and q3 in msg
    assert problems(q3, 1) == [] and problems(dense, 2) == []


def test_kernel_on_a_model_without_moe_layers_replaces_nothing(caplog):
    class Recording:
        calls = 0

        def apply(self, model, device):
            self.calls += 1
            return {"replaced": 0, "impl": "torch"}

    k = Recording()
    with caplog.at_level(logging.INFO, logger="rlweave.backend_fsdp"):
        assert moe.apply_kernel(torch.nn.Linear(2, 2), k, "cpu", [], role="critic") is None
        assert moe.apply_kernel(torch.nn.Linear(2, 2), None, "cpu", []) is None
    assert k.calls == 0
    expected = "role critic: kernel moe_groupgemm selected, but the model has no MoE layers: nothing to replace"
    assert caplog.messages == [expected]


def test_aux_loss_coefficient_option():
    assert FSDPConfig().moe_aux_loss_coef is None
    assert FSDPConfig(moe_aux_loss_coef=0).moe_aux_loss_coef == 0
    with pytest.raises(ValueError, match="moe_aux_loss_coef"):
        FSDPConfig(moe_aux_loss_coef=-0.1)
