"""The Python environment of the GPU check on a machine without network (standard library only).

A lent GPU machine has torch, transformers, triton, pytest and a few more, but not what
rlweave's core imports beside them (pydantic, xxhash, typer, rich...) nor megatron-core, and
its Python cannot reach a package index. Their wheels are fetched beforehand on a machine that
can (``download``) into a folder that travels with the working tree (``.whl/``, ignored by git),
and on the GPU machine ``site`` lays out one folder to put first on ``PYTHONPATH``:

* every wheel of the folder whose distribution is missing here, or installed at a lower version
  than the wheel's, unpacked (what ``pip install --no-deps --target`` does, without pip);
* the metadata of rlweave's core and of every plugin (``<name>-<version>.dist-info`` with
  ``METADATA`` and ``entry_points.txt`` from each ``pyproject.toml``), so that plugin discovery
  (entry points of ``rlweave.plugins``) finds the packages whose sources sit on ``PYTHONPATH``
  (``core/src``, ``plugins/*/src``) without installing them.

    python3 scripts/gpu_check/offline_env.py download .whl       # a machine with a package index
    python3 scripts/gpu_check/offline_env.py site SITE --wheels .whl   # the GPU machine
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: what the GPU machine's Python lacks: the core's own imports and the command line's (fetched
#: with what they require), pinned as in constraints-cpu.txt
WHEELS = ("pydantic==2.14.3", "xxhash", "typer==0.29.2", "click", "rich==15.0.0", "psutil==7.2.2")
#: fetched without what they require (torch, numpy: there already): megatron-core for the megatron backend
WHEELS_ALONE = ("megatron-core==0.16.1",)
#: the GPU machine's interpreter and platform, for ``pip download``
TARGET = ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--platform", "manylinux_2_17_x86_64",
          "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> tuple[str, str]:
    """``(canonical distribution name, version)`` from a wheel's file name."""
    parts = path.name[:-len(".whl")].split("-")
    if len(parts) < 5:
        raise ValueError(f"{path.name}: not a wheel file name (name-version-python-abi-platform.whl)")
    return canonical(parts[0]), parts[1]


def _older(installed: str, carried: str) -> bool:
    try:
        from packaging.version import Version
    except ImportError:  # without packaging, only a different version string can be told apart
        return False
    return Version(installed) < Version(carried)


def unpack_wheels(wheels: Path, site: Path) -> list[str]:
    """Unpack into ``site`` each wheel of ``wheels`` whose distribution this Python lacks or has
    at a lower version; returns ``name version (why)`` per wheel, used or not."""
    done = []
    for path in sorted(wheels.glob("*.whl")):
        name, version = wheel_name_version(path)
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            installed = None
        if installed is not None and not _older(installed, version):
            done.append(f"{name} {version} (not used: {installed} installed)")
            continue
        with zipfile.ZipFile(path) as whl:
            whl.extractall(site)
        for data in site.glob("*.data"):  # purelib/platlib parts of a wheel belong beside the others
            for sub in ("purelib", "platlib"):
                for item in (data / sub).glob("*") if (data / sub).is_dir() else ():
                    shutil.move(str(item), str(site / item.name))
            shutil.rmtree(data)
        done.append(f"{name} {version} ({'over ' + installed if installed else 'was missing'})")
    return done


def _toml(path: Path) -> dict:
    import tomllib  # Python 3.11+

    return tomllib.loads(path.read_text(encoding="utf-8"))


def write_metadata(project_dir: Path, site: Path) -> str:
    """``<name>-<version>.dist-info`` of the package in ``project_dir`` (its ``pyproject.toml``)
    in ``site``; returns the distribution name."""
    project = _toml(project_dir / "pyproject.toml")["project"]
    name, version = project["name"], project["version"]
    info = site / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {req}" for req in project.get("dependencies", [])]
    (info / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for group, eps in groups.items())
    (info / "entry_points.txt").write_text(text, encoding="utf-8")
    (info / "INSTALLER").write_text("rlweave-gpu-check\n", encoding="utf-8")
    return name


def source_dirs(repo: Path = REPO) -> list[Path]:
    """The ``src`` folders of the core and of every plugin: what goes on ``PYTHONPATH``."""
    return [repo / "core" / "src"] + sorted(p for p in (repo / "plugins").glob("*/src") if p.is_dir())


def build_site(site: Path, wheels: Path | None, repo: Path = REPO) -> list[str]:
    """Lay out ``site`` (see the module docstring); returns one line per wheel and package."""
    site.mkdir(parents=True, exist_ok=True)
    lines = unpack_wheels(wheels, site) if wheels is not None and wheels.is_dir() else []
    for src in source_dirs(repo):
        lines.append(f"{write_metadata(src.parent, site)} (from {src.parent.relative_to(repo)}, not installed)")
    return lines


def download(dest: Path) -> int:
    """``pip download`` :data:`WHEELS` (with what they require) and :data:`WHEELS_ALONE` for the
    GPU machine's Python into ``dest`` (about 8 MB)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", *TARGET, "-d", str(dest)]
    return subprocess.call(pip + list(WHEELS)) or subprocess.call(pip + ["--no-deps", *WHEELS_ALONE])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch the wheels the GPU machine lacks (needs a package index)")
    d.add_argument("dest", type=Path)
    s = sub.add_parser("site", help="lay out the folder to put first on PYTHONPATH")
    s.add_argument("site", type=Path)
    s.add_argument("--wheels", type=Path, default=None, help="folder of carried wheels (missing: none)")
    args = ap.parse_args(argv)
    if args.cmd == "download":
        return download(args.dest)
    for line in build_site(args.site, args.wheels):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
