"""``algorithm.name: module:Class``: a local Algorithm subclass, no plugin
(:mod:`rlweave.plugins.user_algorithm`), and the config errors of bad names in ``rlweave validate``."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from rlweave import cli
from rlweave.plugins.user_algorithm import FILE_MODULE_PREFIX, UserAlgorithmRecord, import_algorithm
from typer.testing import CliRunner

_spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" / "fakes.py")
fakes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes)

ALGOS = textwrap.dedent('''
    """Local algorithms for the tests."""
    from pydantic import BaseModel, ConfigDict, Field
    from rlweave.interfaces.algorithm import Algorithm

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        scale: float = Field(1.0, gt=0)
        use_reference: bool = False

    class MyAlgorithm(Algorithm):
        """Scaled policy gradient: a test algorithm."""
        config_model = Options

        @classmethod
        def required_roles(cls, config):
            return ("policy", "reference") if config.use_reference else ("policy",)

        def step(self, records):
            return {"scale": self.config.scale}

    class Abstract(Algorithm):
        pass

    class NotAnAlgorithm:
        pass

    class BadModel(MyAlgorithm):
        config_model = dict

    def helper():
        return 1
''')
runner = CliRunner()


@pytest.fixture
def setup(monkeypatch, tmp_path, use_plugins):
    """The config folder ``tmp_path/cfg`` holds ``ualgo_mod.py``; the commands run in
    ``tmp_path/elsewhere``; sys.path and the imported test modules are restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    (tmp_path / "cfg" / "algos").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cfg" / "ualgo_mod.py").write_text(ALGOS)
    (tmp_path / "cfg" / "algos" / "file_algo.py").write_text(ALGOS)
    (tmp_path / "cfg" / "ualgo_broken.py").write_text("x = 1 / 0\n")
    (tmp_path / "cfg" / "ualgo_needs.py").write_text("import rlw_not_installed_anywhere\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    use_plugins(fakes.make_pm())
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith(("ualgo_", FILE_MODULE_PREFIX)):
            del sys.modules[name]


def validate(root: Path, algorithm: dict, *overrides: str):
    config = {"algorithm": algorithm, "roles": {"policy": {"backend": "fsdp"}, "reference": {"backend": "fsdp"}}}
    path = root / "cfg" / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return runner.invoke(cli.app, ["validate", str(path), *overrides])


def test_a_local_algorithm_validates_with_its_own_keys_and_roles(setup):
    result = validate(setup, {"name": "ualgo_mod:MyAlgorithm", "scale": 2.0, "use_reference": True})
    assert result.exit_code == 0, result.output
    assert "algorithm: ualgo_mod:MyAlgorithm (policy, reference)" in result.output
    result = validate(setup, {"name": "algos/file_algo.py:MyAlgorithm"})  # a file, relative to the config's folder
    assert result.exit_code == 0, result.output
    assert "algorithm: algos/file_algo.py:MyAlgorithm (policy)" in result.output
    assert "warning: roles.reference: role 'reference' is not used" in result.output


def test_its_keys_are_checked_like_a_plugins(setup):
    result = validate(setup, {"name": "ualgo_mod:MyAlgorithm", "scale": -1, "scael": 2})
    assert result.exit_code == 2
    assert "c.yaml: algorithm.scale: Input should be greater than 0 (got -1)" in result.output
    assert "c.yaml: algorithm.scael: unknown key. Did you mean 'scale'?" in result.output


@pytest.mark.parametrize("name, message", [
    ("ualgo_nowhere:MyAlgorithm", "module 'ualgo_nowhere' of algorithm 'ualgo_nowhere:MyAlgorithm' not found: "
                                  "not on PYTHONPATH, nor in {cfg} or {elsewhere}"),
    ("ualgo_mod.sub:MyAlgorithm", "module 'ualgo_mod.sub' of algorithm 'ualgo_mod.sub:MyAlgorithm' not found"),
    ("ualgo_mod:MyAlgo", "algorithm 'ualgo_mod:MyAlgo': module 'ualgo_mod' has no attribute 'MyAlgo'. "
                         "Did you mean 'MyAlgorithm'?"),
    ("ualgo_mod:Zzz", "algorithm 'ualgo_mod:Zzz': module 'ualgo_mod' has no attribute 'Zzz' (its Algorithm "
                      "subclasses: BadModel, MyAlgorithm)"),
    ("ualgo_mod:helper", "algorithm 'ualgo_mod:helper' is a function, not a subclass of "
                         "rlweave.interfaces.algorithm.Algorithm"),
    ("ualgo_mod:NotAnAlgorithm", "algorithm 'ualgo_mod:NotAnAlgorithm' is not a subclass of "
                                 "rlweave.interfaces.algorithm.Algorithm"),
    ("ualgo_mod:Abstract", "algorithm 'ualgo_mod:Abstract' does not implement step()"),
    ("ualgo_mod:BadModel", "algorithm 'ualgo_mod:BadModel' has a config_model that is not a pydantic BaseModel "
                           "subclass or None: <class 'dict'>"),
    ("ualgo_broken:X", "importing 'ualgo_broken' of algorithm 'ualgo_broken:X' failed: "
                       "ZeroDivisionError: division by zero"),
    ("ualgo_needs:X", "importing 'ualgo_needs' of algorithm 'ualgo_needs:X' failed: this run needs "
                      "'rlw_not_installed_anywhere', which is not installed"),
    ("algos/missing.py:X", "file 'algos/missing.py' of algorithm 'algos/missing.py:X' not found (looked for "
                           "{cfg}/algos/missing.py, {elsewhere}/algos/missing.py)"),
    ("ualgo_mod:", "algorithm 'ualgo_mod:' must look like 'module:Class' or 'path/file.py:Class'"),
])
def test_bad_names_are_config_errors(setup, name, message):
    result = validate(setup, {"name": name})
    assert result.exit_code == 2, result.output
    expected = message.format(cfg=setup / "cfg", elsewhere=setup / "elsewhere")
    line = f"invalid config: {setup / 'cfg' / 'c.yaml'}: algorithm.name: {expected}"
    assert result.output.splitlines() == [line], result.output


def test_the_record_loads_the_class_and_says_where_it_was_found(setup, monkeypatch):
    dirs = (str(setup / "cfg"),)
    cls, by_value = import_algorithm("ualgo_mod:MyAlgorithm", dirs)
    assert by_value  # only the config's folder has it: Ray workers must get it by value
    record = UserAlgorithmRecord("ualgo_mod:MyAlgorithm", "s", "ualgo_mod:MyAlgorithm", search_dirs=dirs)
    assert record.load() is cls
    (setup / "elsewhere" / "ualgo_on_path.py").write_text(ALGOS)
    monkeypatch.syspath_prepend(str(setup / "elsewhere"))  # like PYTHONPATH: workers import it themselves
    _, by_value = import_algorithm("ualgo_on_path:MyAlgorithm", dirs)
    assert not by_value
