"""Hub model names in ``model.path``: resolved through the local Hugging Face cache, never downloaded.

A model or tokenizer path that is not a local directory and reads like a hub name
(``org/name``: one slash, no ``./`` or ``/`` in front) is looked up in the Hugging Face cache
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) with
``huggingface_hub.snapshot_download(local_files_only=True)``: the cached snapshot of
``model.revision`` (a branch, tag or commit hash; default ``main``). Nothing is fetched from
the network; a model that is not cached is an error saying how to get it
(``hf download NAME``). ``model.revision`` also applies to ``model.tokenizer`` when that names
the same repository.

* :func:`resolve` -> :class:`HubModel` (name, requested revision, commit hash, snapshot path)
  or :class:`HubModelError`;
* :func:`model_entries` lists every model/tokenizer path of a config with its dotted key;
* :func:`localize` returns a copy of a config whose hub names are replaced by their snapshot
  directories (what workers load), and :func:`resolved_models` what ``plugins.json`` records.

Imports ``huggingface_hub`` only when a hub name is met; never torch or ray.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")

#: files that show a cached snapshot holds the part a path is used for
_NEEDED = {"path": ("config.json",), "tokenizer": ("tokenizer_config.json", "tokenizer.json")}


class HubModelError(ValueError):
    """A hub name that cannot be resolved from the cache (the message says what to do);
    ``key`` is the dotted config key when known."""

    key: str = ""


@dataclass(frozen=True)
class HubModel:
    """A hub name resolved from the cache."""

    name: str
    revision: str | None  # as configured (None: main)
    commit: str  # the cached snapshot's commit hash
    path: str  # the snapshot directory


def looks_like_repo_id(value: str) -> bool:
    """Whether ``value`` reads like ``org/name`` (and could be a hub name)."""
    return bool(_REPO_ID.match(value)) and ".." not in value and not value.endswith(".git")


def is_hub_name(value: str | None) -> bool:
    """A configured path that is not a local file or directory and reads like ``org/name``."""
    return bool(value) and not Path(value).exists() and looks_like_repo_id(value)


def cache_dir() -> str:
    """The Hugging Face hub cache this process reads (from the environment at call time)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    try:
        from huggingface_hub import constants

        return constants.HF_HUB_CACHE
    except ImportError:
        return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def _how_to_get(name: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (f"for a hub model, download it first with `hf download {name}{rev}` (older huggingface_hub: "
            f"`huggingface-cli download {name}{rev}`); nothing is downloaded during a run")


def resolve(name: str, revision: str | None = None, kind: str = "path") -> HubModel:
    """The cached snapshot of hub model ``name`` at ``revision``; ``kind`` (``"path"`` or
    ``"tokenizer"``) says which files the snapshot must hold. Raises :class:`HubModelError`."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise HubModelError(f"'{name}' is not a local directory; reading it as a hub name needs the huggingface_hub "
                            "package: pip install huggingface_hub") from None
    cache = cache_dir()
    at = f" at revision '{revision}'" if revision else ""
    try:
        snapshot = snapshot_download(name, revision=revision, cache_dir=cache, local_files_only=True)
    except LocalEntryNotFoundError:
        raise HubModelError(f"'{name}' is neither a local directory nor a hub model{at} in the Hugging Face cache "
                            f"({cache}): {_how_to_get(name, revision)}") from None
    except Exception as exc:  # noqa: BLE001 - e.g. an invalid repo id or revision
        raise HubModelError(f"'{name}'{at} cannot be read from the Hugging Face cache ({cache}): "
                            f"{type(exc).__name__}: {exc}") from None
    snap = Path(snapshot)
    needed = _NEEDED.get(kind, ())
    if needed and not any((snap / f).is_file() for f in needed):
        raise HubModelError(f"the cached snapshot of '{name}'{at} ({snap}) has no {' or '.join(needed)}: only part "
                            f"of the model was downloaded; {_how_to_get(name, revision)}")
    return HubModel(name=name, revision=revision, commit=snap.name, path=str(snap))


def model_entries(cfg: Any, roles: list[str] | None = None) -> list[tuple[str, Any]]:
    """``(dotted key, model section)`` of ``model`` and of ``roles.<r>.model`` for ``roles``
    (default: every configured role) that are set."""
    names = list(cfg.roles) if roles is None else [r for r in roles if r in cfg.roles]
    out = [("model", cfg.model)]
    out += [(f"roles.{r}.model", cfg.roles[r].model) for r in names if cfg.roles[r].model is not None]
    return out


def section_targets(section: Any) -> list[tuple[str, str, str | None]]:
    """``(field, value, revision)`` for ``path`` and ``tokenizer`` of a model section;
    ``revision`` applies to the tokenizer only when it names the same repository. It is read
    only for hub names (a local directory has no revision)."""
    out = []
    for field in ("path", "tokenizer"):
        value = getattr(section, field, None)
        if value:
            pinned = is_hub_name(value) and (field == "path" or value == section.path)
            out.append((field, value, section.revision if pinned else None))
    return out


def localize(cfg: Any, roles: list[str] | None = None) -> tuple[Any, dict[str, HubModel]]:
    """``cfg`` with every hub name replaced by its cached snapshot directory (a copy; ``cfg``
    itself when it names no hub model), and ``{dotted key: HubModel}`` of those replaced.
    Raises :class:`HubModelError` with its ``key``."""
    found: dict[str, HubModel] = {}
    for key, section in model_entries(cfg, roles):
        for field, value, rev in section_targets(section):
            if not is_hub_name(value):
                continue
            try:
                found[f"{key}.{field}"] = resolve(value, rev, kind=field)
            except HubModelError as exc:
                exc.key = f"{key}.{field}"
                raise
    if not found:
        return cfg, found
    out = cfg.model_copy(deep=True)
    for key, section in model_entries(out, roles):
        for field in ("path", "tokenizer"):
            if f"{key}.{field}" in found:
                setattr(section, field, found[f"{key}.{field}"].path)
    return out, found


def resolved_models(cfg: Any) -> dict[str, dict[str, Any]]:
    """What ``plugins.json`` records under ``models``: ``{dotted key: {name, revision, commit,
    path}}`` for each hub name of ``cfg`` (empty when there are none). Unresolvable names are
    left out (validation has reported them already)."""
    try:
        return {key: asdict(hub) for key, hub in localize(cfg)[1].items()}
    except HubModelError:
        return {}
