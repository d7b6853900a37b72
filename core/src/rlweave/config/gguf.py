"""GGUF files as model inputs: found, checked and cached here; converted by :mod:`rlweave.config.gguf_convert`.

A model path (``model.path``, ``model.tokenizer``, ``roles.<r>.model.*``, and the model argument
of ``rlweave generate`` / ``eval`` / ``export``) may name a ``.gguf`` file, or a directory that
holds exactly one ``.gguf`` file and no ``config.json``. Before any worker starts, the controller
converts it once into a Hugging Face directory (weights dequantized, tokenizer and chat template
kept) and every role loads that directory; workers never see the GGUF.

The cache (:func:`cache_root`) is ``$RLWEAVE_CACHE/gguf`` when ``RLWEAVE_CACHE`` is set, else
``$XDG_CACHE_HOME/rlweave/gguf``, else ``~/.cache/rlweave/gguf``. Each conversion is the folder
``<cache>/<first 16 hex digits of the file's sha256>/`` holding ``hf/`` (the model) and
``source.json`` (:data:`RECORD`: the file's path, size and full sha256, the versions that
converted it). A file with the same content is never converted twice; a changed file has
another hash and gets a conversion of its own. Nothing is ever written beside the GGUF file.

* :func:`gguf_file` says whether a path names a GGUF (and which file);
* :func:`check_gguf` reads the header: a file transformers cannot read (not a GGUF, an
  architecture or tensor type it has no support for) is a one-line problem naming the file;
* :func:`cached_conversion` finds a finished conversion of the file in the cache.

Imports ``gguf`` (numpy) only when a GGUF is met; never torch or transformers' models.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".gguf"
#: the record beside each converted model in the cache
RECORD = "source.json"
#: what ``source.json`` says it is, so a folder of the cache is known to be one of ours
FORMAT = "rlweave-gguf-conversion/1"


class GgufError(ValueError):
    """A GGUF input that cannot be used; the message names the file and what is wrong.
    ``key`` is the dotted config key when known."""

    key: str = ""


@dataclass(frozen=True)
class GgufInfo:
    """What the header of a GGUF file says."""

    path: Path
    architecture: str
    tensor_types: tuple[str, ...]  # ggml type names of its tensors, e.g. ("F32", "Q4_1")
    has_tokenizer: bool
    has_chat_template: bool


def gguf_file(path: str | os.PathLike[str] | None) -> Path | None:
    """The GGUF file ``path`` names: ``path`` itself when it is an existing ``*.gguf`` file, the
    one ``*.gguf`` inside a directory without ``config.json``; None when ``path`` names no GGUF.
    Raises :class:`GgufError` for a directory holding several ``.gguf`` files and no ``config.json``."""
    if not path:
        return None
    p = Path(path)
    if p.is_file():
        return p if p.suffix.lower() == SUFFIX else None
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() == SUFFIX)
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise GgufError(f"'{p}' holds {len(found)} .gguf files ({names}) and no config.json: name the file to use")
    return found[0] if found else None


def cache_root() -> Path:
    """Where conversions are kept (read from the environment at call time; see the module docstring)."""
    if os.environ.get("RLWEAVE_CACHE"):
        return Path(os.environ["RLWEAVE_CACHE"]).expanduser() / "gguf"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlweave" / "gguf"


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 of the file's content (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def entry_dir(sha256: str) -> Path:
    """The cache folder of a file with this content hash."""
    return cache_root() / sha256[:16]


def read_record(entry: Path) -> dict | None:
    """``entry/source.json`` when it is a record of ours, else None."""
    try:
        record = json.loads((entry / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def cached_conversion(sha256: str) -> Path | None:
    """The converted Hugging Face directory of the file with content ``sha256``, when the cache
    holds a finished conversion of it (its record names the same full hash), else None."""
    entry = entry_dir(sha256)
    record = read_record(entry)
    if record is None or record.get("sha256") != sha256 or not (entry / "hf" / "config.json").is_file():
        return None
    return entry / "hf"


def _architectures(arch: str) -> set[str]:
    """GGUF architectures transformers can load: its legacy loader's config mapping, and (only
    looked at when ``arch`` is not in that one, as it imports torch) its newer loader's."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    names = set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"}
    # llama.cpp spells some architectures differently from transformers' model types
    names |= {n.replace("_", "") for n in names} | {n.replace("_", "-") for n in names}
    if arch in names:
        return names
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:  # older transformers: one loader only
        return names
    return names | set(GGUF_ARCHS)


def check_gguf(path: Path) -> GgufInfo:
    """Read the header of GGUF file ``path`` and check transformers can convert it: a readable
    GGUF, an architecture transformers supports, and tensor types it can dequantize (one row
    of every type present is dequantized). Raises :class:`GgufError` naming the file."""
    try:
        import numpy as np
        from gguf import GGUFReader, GGMLQuantizationType, dequantize
    except ImportError:
        raise GgufError(f"'{path}' is a GGUF file; reading it needs the gguf package: pip install gguf") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file fails in many ways
        raise GgufError(f"'{path}' is not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def field(name: str):
        f = reader.fields.get(name)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufError(f"'{path}' is not a usable GGUF model: its header names no general.architecture")
    supported = _architectures(arch)
    if arch not in supported:
        raise GgufError(f"'{path}': GGUF architecture '{arch}' cannot be converted by the installed transformers "
                        f"(it reads: {', '.join(sorted(supported))})")
    if not reader.tensors:
        raise GgufError(f"'{path}' holds no tensors")
    first: dict[int, object] = {}
    for t in reader.tensors:
        first.setdefault(int(t.tensor_type), t)
    names = []
    for type_id, t in first.items():
        try:
            name = GGMLQuantizationType(type_id).name
        except ValueError:
            raise GgufError(f"'{path}': tensor '{t.name}' has an unknown ggml type {type_id}") from None
        names.append(name)
        try:
            row = np.asarray(t.data).reshape(-1, t.data.shape[-1])[:1] if t.data.ndim > 1 else np.asarray(t.data)
            dequantize(row, GGMLQuantizationType(type_id))
        except NotImplementedError:
            raise GgufError(f"'{path}': tensor '{t.name}' is stored as {name}, which the gguf package cannot "
                            "dequantize; use a file in another quantisation") from None
        except Exception as exc:  # noqa: BLE001
            raise GgufError(f"'{path}': tensor '{t.name}' ({name}) cannot be read ({type(exc).__name__}: "
                            f"{exc})") from None
    return GgufInfo(path=path, architecture=arch, tensor_types=tuple(sorted(names)),
                    has_tokenizer=field("tokenizer.ggml.model") is not None,
                    has_chat_template=field("tokenizer.chat_template") is not None)
