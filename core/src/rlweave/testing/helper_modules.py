"""Load a test helper module from its file, so that spawned ranks can load it too.

Tests run with ``--import-mode=importlib``: a ``tests/`` folder is not on ``sys.path``, so a
helper beside the tests (``plugins/backend_fsdp/tests/moe_scenarios.py``) cannot be imported by
name. :func:`import_helper` loads it from its path under a stable module name, registers it in
``sys.modules`` and marks it with its file; :func:`rlweave.testing.ranks.run_ranks` sends a
marked module's functions to spawned ranks by (name, file), and each rank loads the file again
under the same name. ``"<module name>:<attribute>"`` targets into a helper (a kernel object for a
worker context, say) resolve in a rank once that rank has loaded the helper.

Loading is idempotent: the same file under the same name returns the module already loaded; a
different module already registered under that name is an error (rename the helper).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

#: attribute a helper module loaded by :func:`import_helper` carries: its file (a string)
HELPER_FILE = "__helper_file__"


def helper_name(path: str | Path) -> str:
    """The module name :func:`import_helper` gives ``path`` by default: its two parent folders
    and its stem, joined by ``_`` (``plugins/backend_fsdp/tests/moe_scenarios.py`` ->
    ``backend_fsdp_tests_moe_scenarios``), the same in every process."""
    p = Path(path).resolve()
    return re.sub(r"\W", "_", "_".join((p.parent.parent.name, p.parent.name, p.stem)))


def import_helper(path: str | Path, name: str | None = None) -> ModuleType:
    """The module of the Python file ``path``, loaded (once) under ``name`` (default
    :func:`helper_name`) and registered in ``sys.modules``.

    Raises ``FileNotFoundError`` when ``path`` does not exist, ``ImportError`` when another
    module is registered under ``name``, and whatever executing the file raises (the name is
    then unregistered)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"test helper {path} does not exist")
    name = name or helper_name(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, HELPER_FILE, None) == str(path):
            return loaded
        raise ImportError(f"cannot load test helper {path} as {name!r}: that name is already "
                          f"{getattr(loaded, '__file__', None) or loaded!r}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    setattr(module, HELPER_FILE, str(path))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
