"""The shipped plugin packages hold no test code: no ``testing*`` module under any plugin's
``src/``. Test scenarios live in the core's ``rlweave.testing`` (what every backend's scenarios
share) or beside the tests that use them (``plugins/<name>/tests/*_scenarios.py``)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_plugin_ships_testing_modules():
    sources = sorted(REPO.glob("plugins/*/src"))
    assert sources, f"no plugin sources under {REPO / 'plugins'}"
    shipped = [str(p.relative_to(REPO)) for src in sources for p in src.rglob("testing*")
               if p.suffix == ".py" or p.is_dir()]
    assert not shipped, f"test code in shipped plugin packages: {shipped}"
