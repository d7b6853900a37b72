"""Naming and resolving algorithm parts (rlweave.algo_parts.spec): the three YAML forms, errors
that list the choices, option validation, user functions, the default aggregation, and that the
config side stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlweave.algo_parts.spec import PartSpec, choose_loss_agg, resolve


def test_the_three_forms():
    assert resolve("advantage", "rloo").target == "rlweave.algo_parts.advantages:rloo"
    p = resolve("policy_loss", {"name": "ppo_clip", "clip_high": 0.28})
    assert p.options == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}
    assert PartSpec.model_validate({"name": "gspo", "clip_low": 1e-4}).model_dump() == {"name": "gspo",
                                                                                        "clip_low": 1e-4}
    assert PartSpec("k3").model_dump() == "k3"
    assert resolve("advantage", "remax").needs == ("baseline",)
    assert resolve("advantage", "gae").needs == ("values",)


def test_unknown_names_and_bad_options_say_what_to_write():
    with pytest.raises(ValueError, match=r"unknown policy loss 'gpso'.*cispo.*gspo.*ppo_clip.*Did you mean 'gspo'"):
        resolve("policy_loss", "gpso")
    with pytest.raises(ValueError, match="bad options: dual_clip"):
        resolve("policy_loss", {"name": "ppo_clip", "dual_clip": 0.5})  # must be > 1
    with pytest.raises(ValueError, match="'rloo' takes no options"):
        resolve("advantage", {"name": "rloo", "eps": 1.0})
    with pytest.raises(ValueError, match="needs a 'name'"):
        PartSpec.model_validate({"clip_low": 0.1})


def test_a_user_function_carries_its_own_metadata(tmp_path, monkeypatch):
    (tmp_path / "user_parts.py").write_text(
        "def est(*, scores, **_):\n    return scores, None\nest.needs = ('baseline',)\nest.loss_agg = 'token_sum'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    part = resolve("advantage", {"name": "user_parts:est", "alpha": 2})
    assert part.needs == ("baseline",) and part.loss_agg == "token_sum" and part.options == {"alpha": 2}
    assert part.load()(scores=3)[0] == 3
    with pytest.raises(ValueError, match=r"advantage estimator 'user_parts:nope': module 'user_parts' has no "
                                         r"attribute 'nope' \(its functions: est\)"):
        resolve("advantage", "user_parts:nope")


def test_the_default_aggregation_follows_the_parts():
    grpo, dr = resolve("advantage", "grpo"), resolve("advantage", "dr_grpo")
    clip, gspo = resolve("policy_loss", "ppo_clip"), resolve("policy_loss", "gspo")
    assert choose_loss_agg(None, clip, grpo).name == "token_mean"
    assert choose_loss_agg(None, clip, dr).name == "seq_mean_token_sum_norm"
    assert choose_loss_agg(None, gspo, dr).name == "seq_mean_token_mean"  # the loss's own first
    assert choose_loss_agg(PartSpec("token_sum"), gspo, dr).name == "token_sum"


def test_the_config_side_imports_no_torch():
    code = ("import sys, rlweave.algo_parts.plugin, rlweave.algo_parts.spec, rlweave.algo_parts.config, "
            "rlweave.algo_helpers.reward_models, rlweave_algo_grpo.config, rlweave_algo_ppo.config; "
            "from rlweave.algo_parts.spec import resolve; resolve('advantage', 'rloo'); "
            "print(sorted(m for m in ('torch', 'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_algo_parts_sit_below_the_rest_of_the_core():
    """The math layer imports only the plugin contract (and the import-target helper it uses):
    algorithms and helpers build on it, never the other way round (no import cycle through it)."""
    import ast
    from pathlib import Path

    import rlweave.algo_parts as pkg

    found = set()
    for f in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found |= {m.split(".")[1] for m in mods if m.startswith("rlweave.")}
    assert found <= {"algo_parts", "plugins", "targets"}, found
