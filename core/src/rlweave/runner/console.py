"""The run's console: rlweave's own lines for the user, the rest of the controller's output in
``<run_dir>/logs/controller.log``.

While :func:`run_console` is active (the whole of ``rlweave train``'s run):

* every log record of the controller process goes to ``logs/controller.log`` (time, logger,
  level, message; Python warnings too, through :func:`logging.captureWarnings`);
* the console (standard error) shows rlweave's own warnings and errors, each message once, and
  other libraries' records only from level ERROR up, except the :data:`HARMLESS` ones (known
  third-party messages that do not affect the run);
* the loggers of the libraries in :data:`THIRD_PARTY` lose the console handlers they install
  for themselves and pass their records to the handlers above instead (:meth:`RunConsole.tame`,
  applied again after the workers start, when more of them are imported);
* the progress bars of Hugging Face libraries (``Loading weights``...) are off.

With ``verbose`` (``rlweave train --verbose``, ``RLWEAVE_VERBOSE=1``) the console shows every
record from level INFO up, the harmless ones included, and the progress bars stay on.

On exit every logger, handler, level and setting is put back as it was, so a run inside a
longer-lived process (tests, notebooks) leaves it unchanged. Standard library only.
"""

from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: the file of the run directory holding the controller's log records
CONTROLLER_LOG = "controller.log"
#: libraries whose loggers install console handlers of their own (taken over while a run lasts)
THIRD_PARTY = ("DeepSpeed", "deepspeed", "transformers", "vllm", "ray", "torch", "accelerate", "datasets",
               "huggingface_hub", "urllib3", "filelock", "httpx", "matplotlib", "PIL", "tensorboard", "wandb")
#: third-party messages that look alarming but do not affect a run: never on the console
#: without ``--verbose`` (they stay in the log files)
HARMLESS = tuple(re.compile(p) for p in (
    r"Setting accelerator to CPU",                      # DeepSpeed on a machine without GPU
    r"RotaryEmbedding: Failed to load weights",        # vLLM: rotary buffers are not weights
    r"Chat template warmup failed",                     # vLLM: no tokenizer in a token-id engine
    r"Tokenizer not available",
    r"torch_dtype.* is deprecated",                     # transformers: the old name of dtype
))


def is_harmless(message: str) -> bool:
    """Whether ``message`` is one of the :data:`HARMLESS` third-party messages."""
    return any(p.search(message) for p in HARMLESS)


def _ours(record: logging.LogRecord) -> bool:
    return record.name == "rlweave" or record.name.startswith("rlweave.")


class _ConsoleFilter(logging.Filter):
    """What reaches the console (see the module docstring); rlweave's messages once each."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose
        self.seen: set[tuple[str, str]] = set()
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbose:
            return record.levelno >= logging.INFO
        if _ours(record):
            key = (record.name, record.getMessage())
            if record.levelno < logging.WARNING or key in self.seen:
                return False
            self.seen.add(key)
            return True
        shown = record.levelno >= logging.ERROR and not is_harmless(record.getMessage())
        if not shown and record.levelno >= logging.WARNING:
            self.hidden += 1
        return shown


class RunConsole:
    """The state :func:`run_console` changed, to put back; :meth:`tame` takes over third-party
    loggers (again, after more libraries were imported)."""

    def __init__(self, log_file: Path, verbose: bool) -> None:
        self.log_file = log_file
        self.verbose = verbose
        self.filter = _ConsoleFilter(verbose)
        self._loggers: dict[str, tuple[list[logging.Handler], bool]] = {}
        self._bars: list[tuple[object, str]] = []

    def tame(self) -> None:
        """Route the already imported :data:`THIRD_PARTY` loggers through the run's handlers
        (their own console handlers removed) and, unless verbose, turn off the Hugging Face
        progress bars. Idempotent."""
        for name in THIRD_PARTY:
            if name in self._loggers or not _imported(name):
                continue
            lg = logging.getLogger(name)
            own = [h for h in lg.handlers if _is_console(h)]
            self._loggers[name] = (own, lg.propagate)
            for h in own:
                lg.removeHandler(h)
            lg.propagate = True
        if not self.verbose:
            self._bars_off()

    def _bars_off(self) -> None:
        done = {mod for mod, _ in self._bars}
        hub = sys.modules.get("huggingface_hub.utils")
        if hub is not None and hub not in done and not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
            self._bars.append((hub, "hub"))
        tf = sys.modules.get("transformers.utils.logging")
        if tf is not None and tf not in done and tf.is_progress_bar_enabled():
            tf.disable_progress_bar()
            self._bars.append((tf, "transformers"))

    def restore(self) -> None:
        """Give the third-party loggers their handlers back and turn the bars on again."""
        for name, (own, propagate) in self._loggers.items():
            lg = logging.getLogger(name)
            for h in own:
                lg.addHandler(h)
            lg.propagate = propagate
        self._loggers.clear()
        for mod, kind in self._bars:
            if kind == "hub":
                mod.enable_progress_bars()
            else:
                mod.enable_progress_bar()
        self._bars.clear()


def _imported(name: str) -> bool:
    return name in sys.modules or name in logging.Logger.manager.loggerDict


def _is_console(handler: logging.Handler) -> bool:
    """A handler a library installed to print: a stream handler that is not a file's (nor a
    test runner's capture)."""
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and not type(handler).__module__.startswith("_pytest"))


@contextmanager
def run_console(run_dir: str | Path, verbose: bool = False) -> Iterator[RunConsole]:
    """The run's console and ``<run_dir>/logs/controller.log`` (module docstring), for the
    duration of the ``with`` block; everything changed is put back on exit."""
    log_file = Path(run_dir) / "logs" / CONTROLLER_LOG
    log_file.parent.mkdir(parents=True, exist_ok=True)
    console = RunConsole(log_file, verbose)
    root = logging.getLogger()
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    to_console = logging.StreamHandler(sys.stderr)
    to_console.addFilter(console.filter)
    to_console.setFormatter(logging.Formatter("%(message)s"))
    level, captured = root.level, logging.getLogger("py.warnings").propagate
    root.addHandler(to_file)
    root.addHandler(to_console)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    console.tame()
    try:
        yield console
    finally:
        logging.captureWarnings(False)
        logging.getLogger("py.warnings").propagate = captured
        console.restore()
        root.removeHandler(to_console)
        root.removeHandler(to_file)
        root.setLevel(level)
        to_file.close()
