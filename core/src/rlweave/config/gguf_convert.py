"""Converting GGUF model inputs into cached Hugging Face directories (see :mod:`rlweave.config.gguf`).

* :func:`converted_dir` returns the Hugging Face directory of one GGUF file: the cached
  conversion when there is one (one line says so), else a new conversion (a status line before,
  one with its time after);
* :func:`localize_gguf` returns a copy of a run config whose GGUF paths name their converted
  directories, what the controller does before any worker starts.

A conversion loads the file with transformers (``from_pretrained(dir, gguf_file=name)``: every
tensor dequantized), saves the model with ``save_pretrained`` (float32; float16 or bfloat16 when
every matrix of the file is stored in that type), and the tokenizer transformers builds from the
file's metadata with its chat template. It is written to a temporary folder of the cache and
renamed into place when complete, so an interrupted conversion leaves no entry, and two runs
converting the same file at once end with one. A cache folder of the hash that is not a finished
conversion of ours is never overwritten: it is an error naming it.

torch and transformers are imported when a conversion runs, not before.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlweave.config.gguf import (FORMAT, RECORD, GgufError, GgufInfo, cache_root, cached_conversion, check_gguf,
                                 entry_dir, file_sha256, gguf_file, read_record)
from rlweave.config.hub import model_entries

#: the float ggml types a matrix may keep when every matrix of the file uses it
_KEEP_FLOAT = {"F16": "float16", "BF16": "bfloat16"}


def _save_dtype(info: GgufInfo) -> str:
    matrices = set(info.tensor_types) - {"F32"}  # norms and biases are float32 in every file
    if len(matrices) == 1 and next(iter(matrices)) in _KEEP_FLOAT:
        return _KEEP_FLOAT[next(iter(matrices))]
    return "float32"


def _write_hf(src: Path, out: Path, info: GgufInfo) -> None:
    """Load ``src`` with transformers and save it as a plain Hugging Face directory ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(src.parent), src.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for files it cannot map
        raise GgufError(f"'{src}': transformers cannot load this GGUF ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    dtype = getattr(torch, _save_dtype(info))
    # a plain model of the same config, without the GGUF loader's quantizer: what save_pretrained writes
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            try:
                delattr(config, attr)
            except AttributeError:
                pass
    config.dtype = dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = {k: v.detach().to(dtype) for k, v in loaded.state_dict().items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out))
    del loaded, model, state
    if info.has_tokenizer:
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except Exception as exc:  # noqa: BLE001
            raise GgufError(f"'{src}': transformers cannot build the tokenizer this GGUF describes "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        tokenizer.save_pretrained(str(out))


def converted_dir(src: str | os.PathLike[str], say: Callable[[str], None] = print) -> Path:
    """The Hugging Face directory of GGUF file ``src`` (cached or converted now; see the module
    docstring). Raises :class:`~rlweave.config.gguf.GgufError` naming the file or cache folder."""
    src = Path(src)
    try:
        sha = file_sha256(src)
    except OSError as exc:
        raise GgufError(f"'{src}' cannot be read: {exc.strerror or exc}") from None
    hit = cached_conversion(sha)
    if hit is not None:
        say(f"GGUF {src}: using the cached conversion {hit}")
        return hit
    info = check_gguf(src)
    entry = entry_dir(sha)
    if entry.exists():
        raise GgufError(f"'{src}': its cache folder {entry} exists but is not a finished conversion of this file; "
                        "it is left as it is: remove it (or set RLWEAVE_CACHE to another folder)")
    entry.parent.mkdir(parents=True, exist_ok=True)
    size = src.stat().st_size / 2**20
    say(f"GGUF {src} ({size:.1f} MiB, {info.architecture}, {'/'.join(info.tensor_types)}): converting to a "
        f"Hugging Face directory in {entry} (once; later runs reuse it)")
    t0 = time.perf_counter()
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_hf(src, tmp / "hf", info)
        took = time.perf_counter() - t0
        record = {"format": FORMAT, "source": str(src.resolve()), "size": src.stat().st_size, "sha256": sha,
                  "architecture": info.architecture, "tensor_types": list(info.tensor_types),
                  "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(took, 2),
                  "versions": _versions()}
        (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        try:
            tmp.rename(entry)
        except OSError:  # another process finished the same conversion first
            if cached_conversion(sha) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"GGUF {src}: converted in {time.perf_counter() - t0:.1f}s to {entry / 'hf'}")
    return entry / "hf"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "gguf", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def gguf_targets(cfg: Any, roles: list[str] | None = None) -> list[tuple[str, Path]]:
    """``(dotted key, GGUF file)`` of every model or tokenizer path of ``cfg`` that names a GGUF.
    Raises :class:`GgufError` (with ``key``) for a directory of several GGUF files."""
    out = []
    for key, section in model_entries(cfg, roles):
        for field in ("path", "tokenizer"):
            try:
                found = gguf_file(getattr(section, field, None))
            except GgufError as exc:
                exc.key = f"{key}.{field}"
                raise
            if found is not None:
                out.append((f"{key}.{field}", found))
    return out


def localize_gguf(cfg: Any, say: Callable[[str], None] = print) -> tuple[Any, dict[str, Path]]:
    """``cfg`` with every GGUF path replaced by its converted directory (a copy; ``cfg`` itself
    when it names no GGUF), and ``{dotted key: converted directory}``. Each file is converted at
    most once. Raises :class:`GgufError` with its ``key``."""
    targets = gguf_targets(cfg)
    if not targets:
        return cfg, {}
    done: dict[Path, Path] = {}
    found: dict[str, Path] = {}
    for key, src in targets:
        real = src.resolve()
        if real not in done:
            try:
                done[real] = converted_dir(src, say)
            except GgufError as exc:
                exc.key = key
                raise
        found[key] = done[real]
    out = cfg.model_copy(deep=True)
    for key, section in model_entries(out):
        for field in ("path", "tokenizer"):
            if f"{key}.{field}" in found:
                setattr(section, field, str(found[f"{key}.{field}"]))
    return out, found


__all__ = ["cache_root", "converted_dir", "gguf_targets", "localize_gguf", "read_record"]
