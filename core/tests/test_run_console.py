"""The run's console (rlweave.runner.console): rlweave's own warnings once each, other libraries'
records in ``logs/controller.log`` (their errors on the console unless known harmless), all
of it put back as it was afterwards."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest

from rlweave.runner.console import run_console


@pytest.fixture
def library_logger():
    """A logger like vLLM's or DeepSpeed's: its own handler to stderr, not propagating."""
    lg = logging.getLogger("vllm")
    own = logging.StreamHandler(sys.stderr)
    saved = (list(lg.handlers), lg.propagate, lg.level)
    lg.handlers, lg.propagate = [own], False
    yield lg, own
    lg.handlers, lg.propagate, lg.level = saved[0], saved[1], saved[2]


def test_console_shows_rlweave_once_and_other_libraries_only_when_it_matters(tmp_path, capsys, library_logger):
    lg, own = library_logger
    root_level = logging.getLogger().level
    with run_console(tmp_path, verbose=False) as console:
        ours = logging.getLogger("rlweave.runner")
        ours.warning("the gap jumped")
        ours.warning("the gap jumped")
        ours.info("an info line of ours")
        lg.info("Automatically detected platform cpu.")
        lg.warning("RotaryEmbedding: Failed to load weights")
        lg.error("RotaryEmbedding: Failed to load weights")  # harmless even at ERROR
        lg.error("engine core died")
        with warnings.catch_warnings():  # outside pytest's own recording of warnings, as in a run
            warnings.simplefilter("always")
            warnings.showwarning = logging._showwarning  # what captureWarnings installed
            warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
        assert own not in lg.handlers and lg.propagate
    err = capsys.readouterr().err
    assert err.splitlines() == ["the gap jumped", "engine core died"]
    log = (tmp_path / "logs" / "controller.log").read_text()
    for line in ("an info line of ours", "Automatically detected platform cpu.", "RotaryEmbedding",
                 "engine core died", "a library's deprecation"):
        assert line in log, line
    assert console.filter.hidden == 3  # the library's warning lines the console did not show
    # everything as it was
    assert own in lg.handlers and not lg.propagate and logging.getLogger().level == root_level
    assert not any(getattr(h, "baseFilename", "").endswith("controller.log") for h in logging.getLogger().handlers)


def test_verbose_shows_everything(tmp_path, capsys, library_logger):
    lg, _ = library_logger
    with run_console(tmp_path, verbose=True):
        lg.info("Automatically detected platform cpu.")
        lg.warning("RotaryEmbedding: Failed to load weights")
    err = capsys.readouterr().err
    assert "Automatically detected platform cpu." in err and "RotaryEmbedding" in err


def test_hugging_face_progress_bars_are_off_during_the_run_only(tmp_path):
    tf_logging = pytest.importorskip("transformers.utils.logging")
    assert tf_logging.is_progress_bar_enabled()
    with run_console(tmp_path):
        assert not tf_logging.is_progress_bar_enabled()
    assert tf_logging.is_progress_bar_enabled()
    with run_console(tmp_path, verbose=True):
        assert tf_logging.is_progress_bar_enabled()
