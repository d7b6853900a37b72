"""Naming an algorithm part in YAML, and resolving the name.

A part is written as a name (``rloo``), a reference to a function of the user's own
(``my_estimators:median_baseline``, imported from ``PYTHONPATH`` or the current directory, or
``path/to/file.py:function``; resolved as every kind's references are,
:func:`rlweave.targets.import_reference`), or a mapping with its options (``{name: gspo, clip_low: 3.0e-4, clip_high: 4.0e-4}``).
:class:`PartSpec` parses the three forms; :func:`resolve` looks the name up among the
installed plugins' records of that kind (built-ins included), validates the options against
the record's ``config_model``, and returns a :class:`ResolvedPart`. An unknown name is an
error listing the choices. Light: no torch.

A ``module:function`` part takes its metadata from attributes of the function where present
(``fn.needs``, ``fn.loss_agg``, as on the records) and its options unvalidated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from pydantic import RootModel, ValidationError, model_validator

from rlweave.plugins.status import KIND_LABELS
from rlweave.targets import absolute_reference


class PartSpec(RootModel[Union[str, dict[str, Any]]]):
    """A part named in YAML: ``name`` or ``{name: ..., <option>: ...}`` (kept as written, so the
    resolved config shows it as the user wrote it; the options are validated by :func:`resolve`)."""

    @model_validator(mode="after")
    def _named(self) -> "PartSpec":
        if isinstance(self.root, dict):
            if not isinstance(self.root.get("name"), str) or not self.root["name"]:
                raise ValueError("a part given as a mapping needs a 'name' (e.g. {name: ppo_clip, clip_high: 0.28})")
        elif not self.root:
            raise ValueError("a part name must not be empty")
        return self

    @property
    def name(self) -> str:
        return self.root if isinstance(self.root, str) else self.root["name"]

    @property
    def options(self) -> dict[str, Any]:
        return {} if isinstance(self.root, str) else {k: v for k, v in self.root.items() if k != "name"}


@dataclass(frozen=True)
class ResolvedPart:
    """A part ready to use: its kind, name, import target, validated options and metadata."""

    kind: str
    name: str
    target: str
    options: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    loss_agg: str | None = None

    def load(self) -> Callable[..., Any]:
        """The tensor function (imported here: call on the controller or a rank)."""
        return _import(self.target, self.kind)


def _import(target: str, kind: str = "part") -> Any:
    """The function ``target`` names, through the references every kind shares
    (:func:`rlweave.plugins.references.user_function`; a module beside the config is found from
    the current directory)."""
    from rlweave.plugins.references import user_function

    return user_function(target, KIND_LABELS.get(kind, kind))


def resolve(kind: str, spec: "PartSpec | str | dict", pm: Any = None) -> ResolvedPart:
    """The part ``spec`` names among the records of ``kind`` (``advantage``, ``policy_loss``,
    ``kl``, ``loss_agg``). Raises ``ValueError`` saying why it cannot be used (unknown name with
    the choices, import failure, bad options)."""
    spec = spec if isinstance(spec, PartSpec) else PartSpec.model_validate(spec)
    label = KIND_LABELS.get(kind, kind)
    if ":" in spec.name:
        fn = _import(spec.name, kind)  # TargetError (a ValueError) says what is wrong
        # a file's absolute path: the ranks that load it may run in another directory
        return ResolvedPart(kind, spec.name, absolute_reference(spec.name), dict(spec.options),
                            tuple(getattr(fn, "needs", ())), getattr(fn, "loss_agg", None))
    if pm is None:
        from rlweave.plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
    from rlweave.plugins.errors import PluginError

    try:
        record = pm.get(kind, spec.name)
    except PluginError as exc:
        raise ValueError(str(exc)) from None
    options = dict(spec.options)
    if record.config_model is not None:
        try:
            options = record.config_model.model_validate(options).model_dump()
        except ValidationError as exc:
            bad = "; ".join(_option_error(e) for e in exc.errors())
            raise ValueError(f"{label} '{spec.name}': bad options: {bad}") from None
    elif options:
        raise ValueError(f"{label} '{spec.name}' takes no options (got {', '.join(sorted(options))})")
    return ResolvedPart(kind, spec.name, record.target, options, tuple(getattr(record, "needs", ())),
                        getattr(record, "loss_agg", None))


def _option_error(err: dict[str, Any]) -> str:
    """One option's validation error: ``key: message`` (the message alone when it concerns several
    options, which it then names)."""
    msg = err["msg"].removeprefix("Value error, ")
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {msg}" if where else msg


def choose_loss_agg(explicit: "PartSpec | None", policy_loss: ResolvedPart, advantage: ResolvedPart,
                    pm: Any = None) -> ResolvedPart:
    """The loss aggregation a run uses: the config's ``loss_agg``, else the policy loss's own
    default, else the estimator's, else ``token_mean``."""
    name = explicit if explicit is not None else (policy_loss.loss_agg or advantage.loss_agg or "token_mean")
    return resolve("loss_agg", name, pm)
