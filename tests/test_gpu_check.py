"""The GPU check (``scripts/gpu_check.sh``) on a machine without a GPU: what it selects, the
environment it lays out for a machine without network, and how it reads and reports results.

* every test file with ``gpu`` tests is selected, and all of them collect with Ray and vLLM
  blocked (the GPU machine has neither);
* the offline site unpacks only the wheels whose distribution is missing or older here, and its
  metadata carries every package's entry points, so plugin discovery finds them uninstalled;
* a group's command is read for its key figure, killed with its children at its cap, and the
  table names the GPU.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as the GPU check itself
REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "gpu_check"


def _load(name: str):
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(f"gpu_check_{name}", SCRIPTS / f"{name}.py")
        mod = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SCRIPTS))


driver, figures, offline_env = _load("driver"), _load("figures"), _load("offline_env")

BLOCK_RAY_AND_VLLM = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_every_gpu_test_file_is_selected_and_collects_without_ray_or_vllm():
    by_folder = driver.gpu_test_files(REPO)
    files = [f for fs in by_folder.values() for f in fs]
    known = {"core/tests/test_weight_sync_cuda_ipc.py", "plugins/backend_fsdp/tests/test_fsdp_backend_gpu.py",
             "plugins/kernel_moe/tests/test_triton_gpu.py", "plugins/infer_hf/tests/test_hf_contract_gpu.py",
             "tests/test_in_process_run.py"}
    assert known <= set(files) and "plugins/backend_fsdp/tests" in by_folder
    assert all(f.startswith(folder + "/") for folder, fs in by_folder.items() for f in fs)
    proc = subprocess.run([sys.executable, "-c", BLOCK_RAY_AND_VLLM, "--collect-only", "-q", "-m", "gpu", "-p",
                           "no:cacheprovider", *files], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert collected == set(files), set(files) - collected  # each selected file holds gpu tests


def _wheel(folder: Path, name: str, version: str, module: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "VALUE = 1\n")
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def test_offline_site_unpacks_what_is_missing_and_registers_every_plugin(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "rlweave_gpu_check_probe", "1.0", "rlweave_gpu_check_probe")  # missing here
    _wheel(wheels, "pytest", md.version("pytest"), "pytest_copy")  # installed at this version
    _wheel(wheels, "pluggy", "999.0", "pluggy_newer")  # installed, older than the carried one
    lines = offline_env.build_site(site, wheels, REPO)
    assert (site / "rlweave_gpu_check_probe" / "__init__.py").is_file()
    assert not (site / "pytest_copy").exists() and (site / "pluggy_newer").is_dir()
    assert any("pytest" in line and "not used" in line for line in lines)
    found = {d.metadata["Name"]: d for d in md.distributions(path=[str(site)])}
    for src in offline_env.source_dirs(REPO):
        project = tomllib.loads((src.parent / "pyproject.toml").read_text())["project"]
        dist = found[project["name"]]
        assert dist.version == project["version"]
        want = {(ep_name, target) for ep_name, target in project.get("entry-points", {}).get("rlweave.plugins",
                                                                                            {}).items()}
        assert {(ep.name, ep.value) for ep in dist.entry_points.select(group="rlweave.plugins")} == want
    assert any(ep.value == "rlweave.cli:main" for ep in found["rlweave"].entry_points.select(group="console_scripts"))


def test_bench_outputs_give_their_key_figures(tmp_path):
    sync = ("weight sync (cuda_ipc), 2026-11-27, NVIDIA H100\n| state | receivers | cuda_ipc s (GiB/s) | ... |\n"
            "|---|---|---|---|---|\n| 1024 MiB | 1 | 0.0200 (50.0) | 0.00050 (2000.0) | 40.0x |\n")
    assert figures.weight_sync(sync) == "cuda_ipc 50.0 GiB/s vs device copy 2000 GiB/s (1024 MiB, 1 receiver)"
    moe = ("| implementation | ms fwd+bwd | vs hf eager | GFLOP/s | max diff |\n|---|---:|---:|---:|---:|\n"
           "| hf eager | 227.2 | 1.00x | 4084 | 0.0e+00 / 3.4e-03 |\n| ours torch | 5.3 | 42.78x | 174720 | x |\n"
           "| ours triton | 8.3 | 27.23x | 111213 | x |\n")
    assert figures.moe_experts(moe) == "grouped experts fwd+bwd: torch 5.3 ms (42.8x), triton 8.3 ms (27.2x) vs " \
                                       "hf eager 227.2 ms"
    out = tmp_path / "fsdp.json"
    out.write_text('{"precision": "bf16", "ceiling_flop_s": 989e12, "args": {"preset": "qwen2.5-0.5b"}, "rows": '
                   '[{"config": "fsdp", "tok_s": 35426.0, "flop_s": 107.8e12, "mem_gib": 33.4}]}')
    assert figures.training(out) == "fsdp: 35,426 tokens/s, MFU 10.9%, 33.4 GiB (qwen2.5-0.5b shape, bf16)"
    decode = ("fit: a decode step 14.20 ms + 0.8 us a sequence\ntask (16 x 4 a step, 2351 tokens on average): sync "
              "generation 2.389 s, partial round at least 0.686 s (budget 48); 0.29 of sync\n")
    assert figures.decode_cost(decode) == "decode step 14.20 ms + 0.8 us a sequence; a partial round (budget 48) >= " \
                                          "0.29 of sync's generation"
    with pytest.raises(ValueError):
        figures.weight_sync("Traceback (most recent call last): ...")
    with pytest.raises(ValueError):
        figures.decode_cost("Traceback (most recent call last): ...")


def test_junit_counts_and_key_figures(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1">'
                   '<testcase name="a"><properties><property name="key_figure" value="0.9 s/step"/></properties>'
                   '</testcase></testsuite></testsuites>')
    assert figures.junit_counts(xml) == (2, 2, 1, ["0.9 s/step"])
    stopped = ("tests/test_a.py::test_one PASSED [ 25%]\ntests/test_a.py::test_two[bf16] FAILED [ 50%]\n"
               "tests/test_a.py::test_three SKIPPED (needs two GPUs) [ 75%]\ntests/test_a.py::test_four ")
    assert figures.verbose_counts(stopped) == (1, 1, 1)


def test_a_group_is_read_and_one_past_its_cap_is_killed_with_its_children(tmp_path):
    row = "| 1024 MiB | 1 | 0.0200 (50.0) | 0.00050 (2000.0) | 40.0x |"
    ok = driver.Group("bench: weight sync", [sys.executable, "-c", f"print({row!r})"], 30, figure=figures.weight_sync)
    driver.run_group(ok, 30, tmp_path / "ok.log", dict(os.environ))
    assert ok.result["passed"] == 1 and ok.result["figure"].startswith("cuda_ipc 50.0 GiB/s")
    child = tmp_path / "child.pid"
    hang = driver.Group("bench: hangs", [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen("
                                         "[sys.executable, '-c', 'import time; time.sleep(60)']); open(sys.argv[1], "
                                         "'w').write(str(p.pid)); time.sleep(60)", str(child)], 1, figure=str)
    t0 = time.monotonic()
    driver.run_group(hang, 1.5, tmp_path / "hang.log", dict(os.environ))
    assert time.monotonic() - t0 < 15 and hang.result["failed"] == 1 and "timed out" in hang.result["figure"]
    assert not _alive(int(child.read_text()), 5.0)  # its child was killed too
    table = driver.render([ok, hang], {"nvidia_smi": "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65", "torch": "2.11"},
                          440, 20)
    assert table.startswith("## GPU check: NVIDIA H100 80GB HBM3") and "| bench: hangs | 0 | 1 | 0 | timed out" in table


def _alive(pid: int, wait_s: float) -> bool:
    """Whether ``pid`` still runs after up to ``wait_s`` seconds (a zombie counts as gone)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.1)
    return True


def test_the_scripts_parse():
    for name in ("gpu_check.sh", "gpu_run.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "scripts" / name)]).returncode == 0, name


def test_gpu_run_makes_rlweave_and_its_plugins_importable_then_removes_its_site(tmp_path):
    """scripts/gpu_run.sh runs its command with the sources on PYTHONPATH behind a temporary site
    folder that carries the plugins' entry points, and removes that folder afterwards."""
    probe = ("import os, rlweave.cli; from importlib.metadata import entry_points; "
             "print(os.environ['PYTHONPATH'].split(os.pathsep)[0]); "
             "print(sorted(e.name for e in entry_points(group='rlweave.plugins')))")
    env = {**os.environ, "PYTHON": sys.executable, "RLWEAVE_WHEELS": str(tmp_path / "no_wheels"),
           "TMPDIR": str(tmp_path)}
    (tmp_path / "no_wheels").mkdir()
    out = subprocess.run(["bash", str(REPO / "scripts" / "gpu_run.sh"), sys.executable, "-c", probe], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    site, plugins = out.stdout.strip().splitlines()[-2:]
    assert site.startswith(str(tmp_path / "rlweave_gpu_site.")) and not Path(site).exists()
    assert "hf" in plugins and "fsdp" in plugins
