"""The plugin manager of the command line, in one replaceable place.

``rlweave list-plugins``, ``validate`` and ``train`` (:mod:`rlweave.cli`) and the commands of
this package call :func:`plugin_manager` at each use, looked up on this module, so a test or an
embedder that replaces it (``monkeypatch.setattr(rlweave.commands.plugins, "plugin_manager",
lambda: pm)``) changes what all of them see. Imports nothing heavy.
"""

from __future__ import annotations

from typing import Any


def plugin_manager() -> Any:
    """The plugin manager the command line uses: :func:`rlweave.plugins.manager.get_plugin_manager`."""
    from rlweave.plugins.manager import get_plugin_manager

    return get_plugin_manager()
