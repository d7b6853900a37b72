"""Plugin discovery with REAL entry points.

The test distributions of ``plugin_dists/`` are installed (real dist-info, and once with
pip) into a temporary directory, and discovery runs in a subprocess with that directory
on PYTHONPATH: the virtual environment is never touched.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("rlweave_test_installer", Path(__file__).parent / "plugin_dists" / "installer.py")
site_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_helpers)

PROBE = """
import json, sys
from rlweave.plugins.manager import PluginManager
pm = PluginManager()
gets = {}
for kind, name in json.loads(sys.argv[1]):
    try:
        gets[kind + ":" + name] = "ok: " + pm.get(kind, name, where="c.yaml: x").summary
    except Exception as exc:
        gets[kind + ":" + name] = type(exc).__name__ + ": " + str(exc)
plugins = {p.entry_point: {"distribution": p.distribution, "version": p.version, "status": p.status,
                           "error": p.error, "records": [r.kind + ":" + r.name for r in p.records]}
           for p in pm.plugins}
rows = {r["kind"] + ":" + r["name"] + "@" + r["distribution"]: r["status"] for r in pm.rows()}
print("RESULT=" + json.dumps({"plugins": plugins, "rows": rows, "gets": gets,
                              "imported": sorted(m for m in sys.modules if m.startswith("rlw_"))}))
"""


def discover(site: Path, env: dict[str, str] | None = None, gets: list[tuple[str, str]] = ()) -> dict:
    proc = site_helpers.run_python(PROBE, site=site, env=env, args=[json.dumps(list(gets))])
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT="))
    return json.loads(line[len("RESULT="):])


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return site_helpers.install(site_helpers.ALL, tmp_path_factory.mktemp("site"))


GETS = [("backend", "toyback"), ("backend", "toybak"), ("algorithm", "brokenplug"), ("engine", "oldengine"),
        ("engine", "twin"), ("algorithm", "blockalgo")]


@pytest.fixture(scope="module")
def default(site) -> dict:
    return discover(site, gets=GETS)


def test_healthy_plugin_is_ok_with_its_records_and_distribution(default):
    info = default["plugins"]["healthy"]
    assert info == {"distribution": "rlweave-testplug-healthy", "version": "0.3.0", "status": "ok", "error": None,
                    "records": ["backend:toyback", "algorithm:toyalgo", "reward:toyreward"]}
    assert default["gets"]["backend:toyback"] == "ok: toy backend"


def test_unknown_name_lists_choices_with_distributions_and_suggests(default):
    msg = default["gets"]["backend:toybak"]
    assert msg.startswith("UnknownPluginError: unknown training backend 'toybak' (c.yaml: x). Choose one of: ")
    assert "toyback (rlweave-testplug-healthy 0.3.0)" in msg
    assert "Did you mean 'toyback'?" in msg
    assert "brokenplug (rlweave-testplug-broken 0.1.0, broken: import of rlw_broken.plugin failed" in msg


def test_broken_on_import_is_listed_and_fails_only_when_selected(default):
    info = default["plugins"]["brokenplug"]
    assert (info["status"], info["records"]) == ("broken", [])
    assert info["error"] == ("import of rlw_broken.plugin failed: ModuleNotFoundError: "
                             "No module named 'rlw_missing_dependency'")
    assert default["rows"]["-:brokenplug@rlweave-testplug-broken"] == "broken"
    assert default["gets"]["algorithm:brokenplug"] == (
        "PluginUnavailableError: algorithm 'brokenplug' (c.yaml: x): plugin 'brokenplug' "
        "(rlweave-testplug-broken 0.1.0) is broken: import of rlw_broken.plugin failed: "
        "ModuleNotFoundError: No module named 'rlw_missing_dependency'")


def test_incompatible_api_version_is_listed_and_refused(default):
    info = default["plugins"]["oldapi"]
    assert info["status"] == "incompatible"
    assert default["rows"]["engine:oldengine@rlweave-testplug-oldapi"] == "incompatible"
    assert default["gets"]["engine:oldengine"] == (
        "PluginUnavailableError: inference engine 'oldengine' (c.yaml: x) comes from rlweave-testplug-oldapi "
        "0.2.0, which is incompatible: engine 'oldengine' was built for plugin API 99; rlweave 0.1.0 speaks "
        "plugin API 1")


def test_incompatible_rlweave_requirement_is_not_even_imported(default):
    info = default["plugins"]["future"]
    assert (info["status"], info["error"]) == ("incompatible", "requires rlweave>=9.0 but rlweave 0.1.0 is installed")
    assert "rlw_future.plugin" not in default["imported"]


def test_duplicate_name_is_a_conflict_naming_both_distributions(default):
    assert default["rows"]["engine:twin@rlweave-testplug-twin-a"] == "conflict"
    assert default["rows"]["engine:twin@rlweave-testplug-twin-b"] == "conflict"
    assert default["gets"]["engine:twin"] == (
        "PluginConflictError: inference engine 'twin' (c.yaml: x) is offered by more than one plugin: "
        "rlweave-testplug-twin-a 1.0.0 and rlweave-testplug-twin-b 2.0.0. Uninstall one of them, or block one "
        "with RLWEAVE_DISABLE_PLUGINS=<distribution>.")


def test_unknown_hook_makes_the_plugin_broken_and_its_records_unavailable(default):
    info = default["plugins"]["unknownhook"]
    assert info["status"] == "broken" and info["records"] == []
    assert info["error"].startswith("implements unknown hook rlweave_optimizer")
    assert "known hooks: rlweave_training_backends, rlweave_inference_engines" in info["error"]


def test_hook_returning_non_records_is_broken(default):
    info = default["plugins"]["badreturn"]
    assert (info["status"], info["error"]) == (
        "broken", "TypeError: rlweave_rewards() returned str 'not a record', expected RewardRecord")


@pytest.mark.parametrize("blocked", ["blockme", "rlweave-testplug-blockme", "Rlweave_Testplug_Blockme"])
def test_block_list_by_entry_point_or_distribution_name(site, blocked):
    out = discover(site, env={"RLWEAVE_DISABLE_PLUGINS": f"nothing,{blocked}"}, gets=[("algorithm", "blockalgo")])
    info = out["plugins"]["blockme"]
    assert (info["status"], info["error"]) == ("disabled", f"disabled by RLWEAVE_DISABLE_PLUGINS=nothing,{blocked}")
    assert "rlw_blockme.plugin" not in out["imported"]
    msg = out["gets"]["algorithm:blockalgo"]
    assert msg.startswith("UnknownPluginError: unknown algorithm 'blockalgo' (c.yaml: x).")
    assert "blockme (rlweave-testplug-blockme 0.1.0, disabled: disabled by RLWEAVE_DISABLE_PLUGINS" in msg


def test_allow_list_loads_only_named_plugins_and_builtins(site, default):
    assert default["plugins"]["blockme"]["status"] == "ok"
    out = discover(site, env={"RLWEAVE_PLUGINS": "healthy"})
    statuses = {ep: p["status"] for ep, p in out["plugins"].items()}
    assert statuses["healthy"] == "ok"
    assert statuses["blockme"] == statuses["brokenplug"] == "disabled"
    assert out["plugins"]["blockme"]["error"] == "not in RLWEAVE_PLUGINS=healthy"
    assert statuses.get("builtin-rewards") == "ok"  # the core's own plugin ignores the allow list
    assert not [m for m in out["imported"] if m != "rlw_healthy" and not m.startswith("rlw_healthy.")]


def test_a_wheel_installed_by_pip_is_discovered(tmp_path):
    target = tmp_path / "pipsite"
    src = shutil.copytree(site_helpers.HERE / "healthy", tmp_path / "healthy")  # pip leaves build/ behind
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = discover(target)
    assert out["plugins"]["healthy"]["status"] == "ok"
    assert out["plugins"]["healthy"]["records"] == ["backend:toyback", "algorithm:toyalgo", "reward:toyreward"]
