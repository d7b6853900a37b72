"""Rollout corrections are a plugin kind: the built-in ones are listed by ``rlweave list-plugins``
beside the other parts, a third party's record (``rlweave_rollout_corrections`` hook) or a
``module:function`` of the user's is selected by ``algorithm.off_policy.correction`` and applied
by the policy objective."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from rlweave import cli
from rlweave.algo_parts.corrections import Correction
from rlweave.algo_parts.objective import PolicyObjective
from rlweave.algo_parts.offpolicy import OffPolicyConfig
from rlweave.algo_parts.spec import resolve
from rlweave.data.batch import Batch
from rlweave.plugins import CorrectionRecord, hookimpl
from rlweave.plugins.manager import PluginManager

BUILT_IN = {"none", "token_tis", "seq_tis", "token_mis", "seq_mis", "icepop", "geo_mask", "tis", "decoupled"}


def halve(log_ratio, *, active, scale=0.5, **_):
    """A third party's correction: every trained token's weight times ``scale``."""
    coef = torch.where(active, torch.full_like(log_ratio, scale), torch.ones_like(log_ratio))
    keep = torch.ones_like(active)
    return Correction(coef=coef, log_iw=log_ratio.detach(), keep=keep, truncated=torch.zeros_like(keep))


class HalveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scale: float = 0.5


class ThirdParty:
    @staticmethod
    @hookimpl
    def rlweave_rollout_corrections():
        return [CorrectionRecord("halve", "every weight halved", f"{__name__}:halve", config_model=HalveOptions)]


def _batch():
    b = Batch.from_sequences([[1, 2, 3]], prompt_lens=[1])
    b.add_token("token_weight", torch.tensor([0.0, 0.5, 0.5]))
    b.add_token("advantages", torch.tensor([0.0, 1.0, 1.0]))
    b.add_token("rollout_logprobs", torch.tensor([0.0, -1.0, -1.0]))
    return b


def test_built_in_corrections_are_listed():
    rows = json.loads(CliRunner().invoke(cli.app, ["list-plugins", "--json"]).output)
    listed = {r["name"]: r for r in rows if r["kind"] == "rollout_correction"}
    assert set(listed) == BUILT_IN
    assert all(r["status"] == "ok" and r["distribution"] == "rlweave" and r["summary"] for r in listed.values())


def test_a_third_party_correction_is_listed_resolved_and_applied():
    pm = PluginManager()
    pm.register(ThirdParty, name="halver", distribution="rlweave-halver", version="1.0")
    assert ("rollout_correction", "halve", "ok") in {(r["kind"], r["name"], r["status"]) for r in pm.rows()}
    part = resolve("rollout_correction", {"name": "halve", "scale": 0.25}, pm)
    assert part.options == {"scale": 0.25}
    with pytest.raises(ValueError, match="rollout correction 'halve': bad options: scal: Extra inputs"):
        resolve("rollout_correction", {"name": "halve", "scal": 0.25}, pm)
    fn = PolicyObjective(policy_loss=resolve("policy_loss", "ppo_clip"), off_policy=OffPolicyConfig(), correction=part)
    logp = torch.tensor([0.0, -1.0, -1.0], requires_grad=True)
    loss, _ = fn(SimpleNamespace(logprobs=logp, entropy=None), _batch())
    assert loss.item() == pytest.approx(-0.25)  # sum_t w A * 0.25


def test_a_misspelt_hook_breaks_the_plugin_with_a_hint():
    class Typo:
        @staticmethod
        def rlweave_rollout_correction():
            return []

    info = PluginManager(load_entry_points=False).register(Typo, name="typo")
    assert info.status == "broken" and "did you mean rlweave_rollout_corrections?" in info.error


def test_a_function_of_the_users_own(tmp_path, monkeypatch):
    (tmp_path / "my_corrections.py").write_text(
        "import torch\n"
        "from rlweave.algo_parts.corrections import Correction\n"
        "def clip_to(log_ratio, *, active, top=1.5, **_):\n"
        "    w = torch.exp(log_ratio).clamp(max=top)\n"
        "    keep = torch.ones_like(active)\n"
        "    return Correction(coef=w, log_iw=log_ratio, keep=keep, truncated=torch.zeros_like(keep))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = OffPolicyConfig(correction={"name": "my_corrections:clip_to", "top": 1.2})
    logp = torch.tensor([0.0, 0.0, -2.0], requires_grad=True)  # rho = e (capped at 1.2), e^-1
    fn = PolicyObjective(policy_loss=resolve("policy_loss", "ppo_clip"), off_policy=cfg)
    loss, m = fn(SimpleNamespace(logprobs=logp, entropy=None), _batch())
    assert loss.item() == pytest.approx(-0.5 * (1.2 + math.exp(-1)))
    assert m["offpolicy/iw_max"] == pytest.approx(math.e)
    sys.modules.pop("my_corrections", None)
