"""Image checks of a run's data head, before anything starts (part of :mod:`rlweave.config.inputs`).

The run's model is the policy's (``roles.policy.model``, else ``model``). When it is a
vision-language model (:func:`rlweave.data.vision.is_vision_model`), every record of each data
file's head (records already loaded and normalised, :mod:`rlweave.data.vision_records`) is
checked (:func:`rlweave.data.vision_check.record_problem`) with the model's
:class:`~rlweave.data.vision.VisionProcessor` and the run's pixel bounds (``model.vision``), as
the engine and the trainer will see it:

* each image is read (a missing file is already reported by the loader; here: undecodable
  bytes or files);
* the prompt (``prompt``/``query`` text, or the chat messages rendered with the chat template)
  has as many image placeholders as the record has images;
* the prompt with each image's tokens expanded is shorter than :func:`prompt_limit`.

When the model is not a vision-language model, a record with images is an error naming the
field, and so is a ``model.vision`` of its. The roles that share the policy's weights
(``rollout``, ``reference``) must resize images alike: a ``model.vision`` of theirs that differs
from the policy's is an error.

Each problem is ``(dotted key, message)``, the message naming the file, the line or row and
the record's field. Imports transformers, PIL (and torch) only when a vision model is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlweave.config.hub import HubModelError, is_hub_name
from rlweave.config.hub import resolve as resolve_hub

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.inputs import DataHead
    from rlweave.config.resolve import ResolvedPlugins
    from rlweave.config.schema import ModelSection, RunConfig

#: roles that run the policy's weights, so they must resize images as the policy does
SHARED_WEIGHTS_ROLES = ("rollout", "reference")

#: the engines' max_model_len when neither the options nor the model's config.json give one
DEFAULT_MAX_MODEL_LEN = 2048


def _policy_model(cfg: RunConfig) -> tuple[str, ModelSection]:
    role = cfg.roles.get("policy")
    if role is not None and role.model is not None:
        return "roles.policy.model", role.model
    return "model", cfg.model


def _local(value: str | None, revision: str | None, kind: str) -> str | None:
    """A model or tokenizer path as a local directory (a cached hub snapshot), None when none."""
    if not value:
        return None
    if is_hub_name(value):
        try:
            return resolve_hub(value, revision, kind=kind).path
        except HubModelError:
            return None
    return value if Path(value).is_dir() else None


def _vision_dict(sec: ModelSection | None) -> dict[str, Any] | None:
    vision = getattr(sec, "vision", None)
    return vision.model_dump() if vision is not None else None


def _role_issues(cfg: RunConfig, resolved: ResolvedPlugins, key: str, sec: ModelSection) -> list[tuple[str, str]]:
    """Roles sharing the policy's weights whose ``model.vision`` differs from the policy's."""
    roles = resolved.role_names if resolved.algorithm else tuple(cfg.roles)
    want = _vision_dict(sec)
    out = []
    for role in SHARED_WEIGHTS_ROLES:
        own = cfg.roles[role].model if role in roles and role in cfg.roles else None
        if own is None or own is sec or (own.path and own.path != sec.path):
            continue  # the policy's section, or another model
        if _vision_dict(own) != want:
            out.append((f"roles.{role}.model.vision",
                        f"{_vision_dict(own)} differs from {key}.vision ({want}): the {role} role must resize images "
                        "as the policy does, or their image token counts differ; set it equal, or leave it out of "
                        "both and set model.vision"))
    return out


def prompt_limit(cfg: RunConfig, resolved: ResolvedPlugins, model_dir: str) -> tuple[int, str]:
    """``(limit, what it is)``: a prompt's tokens (images expanded) must be fewer than ``limit``.
    An algorithm with ``max_length`` (SFT, reward models): that. Otherwise the rollout engine's
    ``max_model_len`` (a prompt that fills it leaves no room for a response and the engine
    refuses it): ``roles.rollout.options.max_model_len``, else the model's
    ``max_position_embeddings``, else :data:`DEFAULT_MAX_MODEL_LEN`, as the engines choose."""
    max_length = getattr(resolved.algorithm_config, "max_length", None)
    if isinstance(max_length, int):
        return max_length, f"algorithm.max_length ({max_length})"
    options = resolved.role_options.get("rollout") if "rollout" in cfg.roles else None
    value = getattr(options, "max_model_len", None)
    if value is None and "rollout" in cfg.roles and isinstance(cfg.roles["rollout"].options, dict):
        value = cfg.roles["rollout"].options.get("max_model_len")
    if isinstance(value, int):
        return value, f"roles.rollout.options.max_model_len ({value})"
    try:
        data = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        value = data.get("text_config", data).get("max_position_embeddings") or data.get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        value = None
    if isinstance(value, int):
        return value, (f"the engine's max_model_len ({value}: the model's max_position_embeddings; "
                       "roles.rollout.options.max_model_len unset)")
    return DEFAULT_MAX_MODEL_LEN, f"the engine's max_model_len ({DEFAULT_MAX_MODEL_LEN}, its default)"


def vision_issues(cfg: RunConfig, resolved: ResolvedPlugins, heads: dict[str, DataHead]) -> list[tuple[str, str]]:
    """Every image problem of the data heads and of the roles' pixel bounds (module docstring)."""
    key, sec = _policy_model(cfg)
    model_dir = _local(sec.path, sec.revision, "path")
    if model_dir is None:
        return []  # no local model to tell: the model checks report it
    from rlweave.data.vision import is_vision_model

    if not is_vision_model(model_dir):
        unused = [(f"{key}.vision", f"image size bounds for a model ({sec.path}) that is not a vision-language model "
                   "(its config.json has no vision_config): remove them")] if sec.vision is not None else []
        return unused + [(head.key, f"{head.where(i)}: field '{field}': the record has {n} image(s) but the model "
                 f"({sec.path}) is not a vision-language model (its config.json has no vision_config): use a "
                 "vision-language model, or leave the images out")
                for head in heads.values() for i, (_, rec), field, n in _with_images(head)]
    issues = _role_issues(cfg, resolved, key, sec)
    try:
        processor = _processor(sec, model_dir)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a broken directory
        where = f"{key}.vision" if sec.vision is not None else f"{key}.path"
        return issues + [(where, f"cannot load the vision processor of {sec.path}: {type(exc).__name__}: {exc}")]
    limit = prompt_limit(cfg, resolved, model_dir)
    from rlweave.data.vision_check import record_problem

    for head in heads.values():
        for i, (_, rec) in enumerate(head.records):
            problem = record_problem(rec, processor, limit, cfg.data.chat_template, f"{key}.vision")
            if problem:
                issues.append((head.key, f"{head.where(i)}: {problem}"))
    return issues


def _with_images(head: DataHead):
    from rlweave.data.vision_records import image_field

    for i, item in enumerate(head.records):
        images = item[1].get("images")
        if images:
            yield i, item, image_field(item[1]), len(images)


def _processor(sec: ModelSection, model_dir: str):
    from rlweave.data.vision import VisionProcessor

    tokenizer = None
    tok_dir = _local(sec.tokenizer, sec.revision if sec.tokenizer == sec.path else None, "tokenizer")
    if tok_dir is not None and tok_dir != model_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    return VisionProcessor(model_dir, getattr(sec.vision, "min_pixels", None), getattr(sec.vision, "max_pixels", None),
                           tokenizer=tokenizer)
