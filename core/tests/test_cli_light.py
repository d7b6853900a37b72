"""Subprocess checks: importing rlweave, listing plugins (probes included) and validating
configs (valid or not, with the input checks and a reward dry run, also ``train`` with an
invalid config) import no torch, ray, vllm, transformers, sglang or megatron — with every
installed plugin plus broken test plugins on the path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

_spec = importlib.util.spec_from_file_location("rlweave_test_installer", Path(__file__).parent / "plugin_dists" / "installer.py")
site_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_helpers)

RUN_CLI = """
import json, sys
from rlweave.cli import app
codes = []
for args in json.loads(sys.argv[1]):
    try:
        app(args, prog_name="rlweave")
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code or 0)
print("CODES=" + json.dumps(codes))
""" + site_helpers.HEAVY_PROBE


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return site_helpers.install(site_helpers.ALL, tmp_path_factory.mktemp("site"))


def run_cli(site: Path, commands: list[list[str]], cwd: Path | None = None) -> tuple[list[int], list[str], str]:
    proc = site_helpers.run_python(RUN_CLI, site=site, args=[json.dumps(commands)], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("CODES="))[len("CODES="):])
    return codes, site_helpers.heavy_modules(proc.stdout), proc.stdout + proc.stderr


def test_import_rlweave_and_its_light_modules_stay_light():
    proc = site_helpers.run_python("import rlweave, rlweave.plugins.manager, rlweave.config.loader, "
                                   "rlweave.config.rundir, rlweave.interfaces, rlweave.cli\n" + site_helpers.HEAVY_PROBE)
    assert proc.returncode == 0, proc.stderr
    assert site_helpers.heavy_modules(proc.stdout) == []


def test_list_plugins_never_crashes_and_stays_light(site):
    codes, heavy, out = run_cli(site, [["list-plugins"], ["list-plugins", "--json"]])
    assert codes == [0, 0]
    assert heavy == []
    assert "brokenplug" in out and "rlw_missing_dependency" in out and "incompatible" in out
    rows = json.loads(out[out.index("\n[") + 1:out.index("\n]") + 2])
    megatron = next((r for r in rows if r["name"] == "megatron"), None)
    if megatron is not None:  # installed here: probed without importing megatron (heavy is empty)
        assert megatron["status"] == "ok", megatron


def test_validation_errors_come_before_anything_heavy(site, tmp_path):
    good = {"algorithm": {"name": "toyalgo"}, "roles": {"policy": {"backend": "toyback"}},
            "rewards": [{"name": "toyreward"}]}
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    bad = {**good, "algorithm": {"name": "toyalgo", "group_size": 1}, "trainer": {}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    (tmp_path / "no_answer.jsonl").write_text('{"prompt": "1+1="}\n')
    (tmp_path / "inputs.yaml").write_text(yaml.safe_dump({**good, "rewards": [{"name": "arith_exact"}],
                                                          "data": {"train": "train.jsonl"}}))
    codes, heavy, out = run_cli(site, [["validate", "good.yaml"], ["validate", "bad.yaml"],
                                       ["train", "bad.yaml", "roles.policy.backend=toybak"],
                                       ["validate", "inputs.yaml"], ["validate", "inputs.yaml", "data.train=no_answer.jsonl"]],
                                cwd=tmp_path)
    assert codes == [0, 2, 2, 0, 2], out
    assert "inputs.yaml: rewards.0: reward 'arith_exact' fails on the first record of data.train" in out
    assert heavy == []
    assert "bad.yaml: algorithm.group_size: Input should be greater than or equal to 2 (got 1)" in out
    assert "bad.yaml: trainer: unknown key" in out
    assert "Did you mean 'toyback'?" in out
