"""Every shipped example config validates with the installed plugins (both passes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlweave.config.loader import load_config
from rlweave.plugins.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*/*.yaml"))


@pytest.mark.skipif(not EXAMPLES, reason="no example configs yet")
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.relative_to(ROOT).as_posix() for p in EXAMPLES])
def test_example_config_is_valid(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for var in ("RLWEAVE_PLUGINS", "RLWEAVE_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    cfg, resolved = load_config(path.relative_to(ROOT), pm=PluginManager())
    assert resolved.algorithm is not None and resolved.algorithm.name == cfg.algorithm.name
    assert set(resolved.role_names) <= set(resolved.roles)
