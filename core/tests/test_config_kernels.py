"""Kernels from the config to the ranks: which roles receive a kernel, the errors when a
selection would reach no worker, and what a rank gets in its context.

In-process test plugins (``plugin_dists/fakes.py``) plus a backend that uses one kernel; the
file is ``c.yaml`` in the working directory, so messages read ``c.yaml: <path>: <message>``.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import yaml

from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins import BackendRecord, KernelRecord
from rlweave.scheduler.ray_impl.build import worker_context

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes_k", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

#: what the kernel record points at: an object in this module
KERNEL_OBJECT = types.SimpleNamespace(name="the fast experts")
BASE = {
    "algorithm": {"name": "grpo", "kl_beta": 0.1},
    "roles": {"policy": {"backend": "kfsdp"}, "rollout": {"engine": "vllm"}, "reference": {"backend": "fsdp"}},
    "rewards": [{"name": "arith_exact"}],
}


@pytest.fixture(autouse=True)
def setup(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    fake = types.ModuleType("rlweave.config.placement")
    fake.check_placement = lambda cfg, roles, supported=None, rank_spans=None: []
    fake.spans_of = lambda record: ()
    monkeypatch.setitem(sys.modules, "rlweave.config.placement", fake)
    monkeypatch.setitem(sys.modules, "rlweave_test_kernel_target", sys.modules[__name__])


def _pm():
    pm = fakes.make_pm()
    pm.register(fakes.plugin(rlweave_training_backends=lambda: [BackendRecord(
        "kfsdp", "FSDP that uses a kernel", "x:y", None, kernels=("fast",))]),
        name="kfsdp", distribution="rlweave-backend-kfsdp", version="0.1.0")
    pm.register(fakes.plugin(rlweave_kernels=lambda: [KernelRecord(
        "fast", "fast experts", "rlweave_test_kernel_target:KERNEL_OBJECT")]),
        name="fast", distribution="rlweave-kernel-fast", version="0.1.0")
    return pm


def _write(**changes):
    Path("c.yaml").write_text(yaml.safe_dump(fakes.changed(BASE, **changes)))


def _load(**changes):
    _write(**changes)
    return load_config("c.yaml", (), _pm())


def _errors(**changes) -> list[str]:
    _write(**changes)
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml", (), _pm())
    return [str(issue) for issue in err.value.issues]


def test_a_top_level_kernel_reaches_only_the_roles_whose_backend_uses_it():
    _, resolved = _load(kernels={"fast": True})
    assert resolved.role_kernels == {"policy": ["fast"], "rollout": [], "reference": []}
    assert set(resolved.kernels) == {"fast"}


def test_a_role_can_switch_a_top_level_kernel_off_and_nothing_is_handed_over():
    _, resolved = _load(kernels={"fast": True}, roles__policy__kernels={"fast": False})
    assert resolved.role_kernels["policy"] == [] and resolved.kernels == {}


def test_a_kernel_switched_on_for_one_role_only():
    _, resolved = _load(roles__policy__kernels={"fast": True})
    assert resolved.role_kernels["policy"] == ["fast"]


def test_a_kernel_no_role_uses_is_an_error_naming_what_each_role_uses():
    assert _errors(kernels={"fast": True}, roles__policy__backend="fsdp") == [
        "c.yaml: kernels.fast: no role's plugin uses kernel 'fast' (kernels they use: backend 'fsdp' of role "
        "'policy': none; backend 'fsdp' of role 'reference': none; engine 'vllm' of role 'rollout': none); "
        "remove it, or choose a backend that uses it"]


def test_a_kernel_switched_on_for_a_role_whose_backend_does_not_use_it_is_an_error():
    assert _errors(roles__reference__kernels={"fast": True}) == [
        "c.yaml: roles.reference.kernels.fast: backend 'fsdp' of role 'reference' does not use kernel 'fast' "
        "(kernels it uses: none)"]


def test_an_unavailable_kernel_is_refused_with_its_reason_and_an_unknown_one_with_the_choices():
    assert _errors(roles__policy__kernels={"moe_groupgemm": True, "fsat": True}) == [
        "c.yaml: roles.policy.kernels.fsat: unknown kernel 'fsat'. Choose one of: fast (rlweave-kernel-fast 0.1.0), "
        "moe_groupgemm (rlweave 0.1.0, unavailable). Did you mean 'fast'?",
        "c.yaml: roles.policy.kernels.moe_groupgemm: kernel 'moe_groupgemm' (rlweave 0.1.0) is unavailable here: "
        "needs CUDA"]


def test_a_switched_off_kernel_is_not_looked_up():
    _, resolved = _load(kernels={"moe_groupgemm": False})  # unavailable here, but off: no error
    assert resolved.kernels == {}


def test_the_rank_receives_the_kernel_object_and_none_for_others():
    cfg, resolved = _load(kernels={"fast": True})
    ctx = worker_context(cfg, "policy", 0, ("127.0.0.1", 1), record=resolved.roles["policy"],
                         kernel_records=resolved.kernels)
    assert ctx.kernels == {"fast": "rlweave_test_kernel_target:KERNEL_OBJECT"}
    assert ctx.kernel("fast") is KERNEL_OBJECT and ctx.kernel("other") is None
    ref = worker_context(cfg, "reference", 0, ("127.0.0.1", 1), record=resolved.roles["reference"],
                         kernel_records=resolved.kernels)
    assert ref.kernels == {} and ref.kernel("fast") is None


def test_a_kernel_whose_target_does_not_import_names_role_rank_and_target():
    from rlweave.interfaces.worker import WorkerContext

    ctx = WorkerContext(role="policy", rank=1, kernels={"fast": "no_such_module_xyz:K"})
    with pytest.raises(RuntimeError, match=r"role policy rank 1: kernel 'fast' \(no_such_module_xyz:K\) could not "
                                           r"be loaded: ModuleNotFoundError"):
        ctx.kernel("fast")
