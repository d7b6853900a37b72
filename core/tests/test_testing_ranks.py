"""``rlweave.testing.helper_modules`` and ``rlweave.testing.ranks``: a test helper loaded from its
file is one module per name, and its functions run on spawned ranks, which load the file again."""

from __future__ import annotations

import sys

import pytest

from rlweave.testing.helper_modules import HELPER_FILE, helper_name, import_helper

HELPER = '''
"""A scenario helper beside some tests."""
MARK = "loaded from its file"


def report(ctx_kw, value):
    return ctx_kw["rank"], ctx_kw["world_size"], __name__, MARK, value
'''


@pytest.fixture
def helper(tmp_path):
    path = tmp_path / "tests" / "demo_scenarios.py"
    path.parent.mkdir()
    path.write_text(HELPER)
    yield path
    sys.modules.pop(helper_name(path), None)


def test_a_helper_loads_once_under_its_folder_names(helper):
    mod = import_helper(helper)
    assert mod.__name__ == f"{helper.parent.parent.name}_tests_demo_scenarios" == helper_name(helper)
    assert getattr(mod, HELPER_FILE) == str(helper.resolve()) and mod.MARK == "loaded from its file"
    assert import_helper(helper) is mod and sys.modules[mod.__name__] is mod


def test_another_module_under_the_name_is_refused_and_a_broken_helper_leaves_no_trace(helper, tmp_path):
    other = tmp_path / "other.py"
    other.write_text("X = 1\n")
    import_helper(helper)
    with pytest.raises(ImportError, match="already"):
        import_helper(other, helper_name(helper))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom"):
        import_helper(broken, "rlweave_test_broken_helper")
    assert "rlweave_test_broken_helper" not in sys.modules
    with pytest.raises(FileNotFoundError):
        import_helper(tmp_path / "missing.py")


def test_spawned_ranks_run_a_function_of_a_helper_loaded_from_its_file(helper):
    pytest.importorskip("torch")
    from rlweave.testing.ranks import run_ranks

    mod = import_helper(helper)  # rank 0's result comes back; a rank that cannot load the file fails the call
    assert run_ranks(mod.report, 2, {"x": 1}, timeout_s=300) == (0, 2, mod.__name__, "loaded from its file", {"x": 1})


BIND_HELPER = '''
def bind(ctx_kw):
    from rlweave.rendezvous import listen_socket

    listen_socket("127.0.0.1", ctx_kw["master_port"]).close()
    return ctx_kw["master_port"]
'''


def test_ranks_start_again_on_another_port_when_theirs_was_taken(tmp_path, monkeypatch):
    """The rendezvous port free when chosen, then taken by another process before rank 0 binds it:
    the ranks start again on a new port."""
    pytest.importorskip("torch")
    from rlweave.rendezvous import listen_socket
    from rlweave.testing import ranks

    path = tmp_path / "tests" / "bind_scenarios.py"
    path.parent.mkdir()
    path.write_text(BIND_HELPER)
    taken = listen_socket("127.0.0.1", 0)  # another process's listener on the first port handed out
    first = taken.getsockname()[1]
    ports = [first]
    real = ranks.free_port
    monkeypatch.setattr(ranks, "free_port", lambda: ports.pop(0) if ports else real())
    try:
        mod = import_helper(path)
        got = ranks.run_ranks(mod.bind, 1, timeout_s=300)
    finally:
        taken.close()
        sys.modules.pop(helper_name(path), None)
    assert not ports and got != first  # the taken port was handed out, and the ranks met on another
