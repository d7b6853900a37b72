"""Pass two of config validation: the selected plugins and their own sections.

Given a :class:`~rlweave.config.schema.RunConfig` that passed pass one (or was repaired after
it failed, see :mod:`rlweave.config.loader`), this

* resolves ``algorithm.name`` (a plugin's name, or ``module:Class`` of a local Algorithm subclass:
  :mod:`rlweave.plugins.user_algorithm`), ``run.mode`` (a run-mode plugin), the rollout of an algorithm
  that samples through one (``rollout.name``, :mod:`rlweave.config.rollout`), every
  ``roles.<r>.backend`` / ``.engine``, every
  ``rewards[].name`` and every enabled ``kernels.<name>`` / ``roles.<r>.kernels.<name>`` through the plugin manager
  (unknown names get the choices, their distributions and a "did you mean"; a record whose
  ``probe()`` says it cannot run here is refused with that reason). A reference to the user's own
  code in place of a plugin (``module:Name``, ``path/file.py:Name``) is imported through the one
  resolver every kind shares (:func:`rlweave.targets.import_reference`, via
  :mod:`rlweave.plugins.references`): what is wrong with it is one issue at its key;
* runs the selected rollout's ``check`` on its settings (``RolloutRecord.check``: the multi-turn
  rollout resolves ``algorithm.multi_turn.env`` and validates its arguments, each problem at its
  own key);
* validates the algorithm's own keys, ``rollout.args``, each ``roles.<r>.options`` and each reward's
  ``args`` against the record's ``config_model`` and writes the result (defaults filled,
  keys as the model reads them) back into the config, so the resolved config shows every
  setting. Unknown keys are errors at every depth whatever the model's own ``extra``
  setting (:mod:`rlweave.config.strict`);
* checks the roles the algorithm needs (``record.roles(algorithm_config)``) are present
  with a backend (trained/scoring roles) or an engine (``rollout``), and that their
  ``parallel`` sizes are ones the plugin understands;
* runs each selected backend's ``check`` (``BackendRecord.check``: what only the backend knows to
  refuse, such as a sequence-parallel size the model's heads do not split into);
* checks that every kernel switched on reaches a role whose backend uses it (:mod:`rlweave.config.kernels`);
* checks ``required_plugins`` against installed distribution versions;
* runs ``rlweave.config.placement.check_placement`` over the roles, with the ranks' device spans of the
  selected plugins (a vLLM replica spans ``tp`` devices);
* checks ``rollout.replay`` (the dump fits this model, tokenizer, algorithm and seed; sync mode) and
  drops the rollout role it does not start, and names every setting ``run.deterministic`` cannot
  hold with (:mod:`rlweave.config.replay`);
* with ``run.scheduler: in_process``, checks what it refuses (:mod:`rlweave.config.in_process`:
  one rank per role, no restarts, an in-process weight transport).

Every problem becomes a :class:`~rlweave.config.errors.ConfigIssue`; nothing heavy is imported
(except what the module of an algorithm named by import path imports itself).
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel

from rlweave.config.errors import ConfigError, ConfigIssue
from rlweave.config.schema import ROLE_NAMES, AlgorithmSection, RunConfig
from rlweave.config.strict import validate_section
from rlweave.plugins.errors import PluginError
from rlweave.plugins.manager import PluginManager
from rlweave.plugins.types import (AlgorithmRecord, KernelRecord, PluginRecord, RewardRecord, RolloutRecord,
                                   RunModeRecord)
from rlweave.plugins.references import user_function
from rlweave.plugins.user_algorithm import is_import_path, search_dirs, user_algorithm_record
from rlweave.targets import TargetError, is_reference

ROLLOUT_ROLE = "rollout"
#: roles no algorithm trains, and why (an ``optim`` there is ignored, with a warning)
NEVER_TRAINED = {ROLLOUT_ROLE: "it generates with the policy's weights", "reference": "it is the frozen policy"}


@dataclass
class ResolvedPlugins:
    """The records a run uses, found and validated by pass two.

    Attributes:
        algorithm: the selected algorithm record.
        algorithm_config: its validated config (``None`` when it has no config model).
        run_mode: the record of ``run.mode``.
        rollout: the rollout an algorithm that samples through one uses (``None`` otherwise).
        rollout_args: its validated ``rollout.args`` (``None``: no model, or the multi-turn rollout).
        role_names: roles the algorithm needs, in its order.
        roles: configured role -> its backend or engine record.
        views: needed roles served by another role's ranks instead of their own, role -> source
            role (``{"reference": "policy"}``: the policy with its LoRA adapters disabled,
            :mod:`rlweave.config.lora`); they are not in ``role_names``.
        role_options: configured role -> validated options model (``None``: no model).
        rewards: per ``rewards[]`` entry, the record (``None`` for a ``module:function``).
        reward_args: per entry, the validated args model (``None``: no model).
        kernels: enabled kernel name -> record.
        role_kernels: configured role -> names of the kernels its ranks receive.
        warnings: things that are allowed but probably unintended (printed by the CLI).
    """

    algorithm: AlgorithmRecord | None = None
    algorithm_config: BaseModel | None = None
    run_mode: RunModeRecord | None = None
    rollout: RolloutRecord | None = None
    rollout_args: BaseModel | None = None
    role_names: tuple[str, ...] = ()
    roles: dict[str, PluginRecord] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    role_options: dict[str, BaseModel | None] = field(default_factory=dict)
    rewards: list[RewardRecord | None] = field(default_factory=list)
    reward_args: list[BaseModel | None] = field(default_factory=list)
    kernels: dict[str, KernelRecord] = field(default_factory=dict)
    role_kernels: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class _Pass:
    """Collects issues while resolving one config (one instance per validation)."""

    def __init__(self, cfg: RunConfig, pm: PluginManager, source: str,
                 skip: Callable[[str], bool] = lambda path: False) -> None:
        self.cfg, self.pm, self.source, self.skip = cfg, pm, source, skip
        self.issues: list[ConfigIssue] = []
        self.out = ResolvedPlugins()

    def issue(self, path: str, message: str) -> None:
        self.issues.append(ConfigIssue(self.source, path, message))

    def get(self, kind: str, name: str, path: str) -> Any:
        """The selected record, or None (with an issue, unless ``path`` is skipped)."""
        if self.skip(path):
            return None
        try:
            return self.pm.get(kind, name)
        except PluginError as exc:
            self.issue(path, str(exc))
            return None

    def section(self, record: PluginRecord, data: dict[str, Any], path: str) -> BaseModel | None:
        """Validate a plugin's own section; every unknown key is an error (all of them when
        the plugin has no model). Returns the model, or None when its values are invalid."""
        if record.config_model is None:
            for key in data:
                self.issue(f"{path}.{key}", f"unknown key: {record.kind} '{record.name}' takes no options")
            return None
        parsed, problems = validate_section(record.config_model, data, path)
        for key, message in problems:
            self.issue(key, message)
        return parsed

    # ------------------------------------------------------------------ parts
    def algorithm(self) -> None:
        section = self.cfg.algorithm
        record = self.user_algorithm(section.name) if is_import_path(section.name) else \
            self.get("algorithm", section.name, "algorithm.name")
        if record is None:
            return
        self.out.algorithm = record
        extra = dict(section.model_extra or {})
        model = record.config_model
        if model is not None and "name" in model.model_fields:
            extra["name"] = section.name
        parsed = self.section(record, extra, "algorithm")
        if parsed is None and model is not None:
            return
        self.out.algorithm_config = parsed
        if parsed is not None:
            dumped = {k: v for k, v in parsed.model_dump(mode="json", by_alias=True).items() if k != "name"}
            self.cfg.algorithm = AlgorithmSection(name=section.name, reference=section.reference, **dumped)
        if record.rollout:
            self.rollout(parsed if parsed is not None else section)
        elif self.cfg.rollout.name or self.cfg.rollout.args:
            key = "rollout.name" if self.cfg.rollout.name else "rollout.args"
            self.issue(key, f"algorithm '{record.name}' does not sample through a rollout; remove {key}")
        self.run_mode(record, parsed if parsed is not None else section)
        try:
            self.out.role_names = tuple(record.roles(parsed if parsed is not None else section))
        except Exception as exc:  # a plugin bug: say whose
            self.issue("algorithm", f"algorithm '{record.name}' failed to list its roles: {type(exc).__name__}: {exc}")

    def rollout(self, algo_config: Any) -> None:
        """The rollout of an algorithm that samples through one (:mod:`rlweave.config.rollout`) and
        its ``rollout.args``."""
        from rlweave.config.rollout import FROM_MULTI_TURN, rollout_name, setting_problems

        name = rollout_name(self.cfg, algo_config)
        for path, message in setting_problems(self.cfg, algo_config):
            self.issue(path, message)
        record = self.get("rollout", name, "rollout.name")
        if record is None:
            return
        self.out.rollout = record
        settings = getattr(algo_config, "multi_turn", None)
        if name not in FROM_MULTI_TURN:
            settings = self.out.rollout_args = self.section(record, dict(self.cfg.rollout.args), "rollout.args")
            if self.out.rollout_args is not None:
                self.cfg.rollout.args = self.out.rollout_args.model_dump(mode="json", by_alias=True)
        if settings is None and (name in FROM_MULTI_TURN or record.config_model is not None):
            return  # invalid: reported above
        try:
            problems = list(record.check(self.cfg, settings, self.pm))
        except Exception as exc:  # a plugin bug: say whose
            self.issue("rollout.name", f"rollout '{name}' failed to check its settings: {type(exc).__name__}: {exc}")
            return
        for path, message in problems:
            self.issue(path, message)

    def run_mode(self, record: AlgorithmRecord, algo_config: Any) -> None:
        """``run.mode`` (a run-mode plugin) and ``rollout.partial`` must be ones the algorithm (as
        configured) and its rollout implement, and the mode's own checks must pass
        (:attr:`RunModeRecord.check`: e.g. the modes that overlap generation with training need
        the rollout role on devices of its own)."""
        mode = self.cfg.run.mode
        modes, partial = getattr(record, "run_modes", ("sync",)), getattr(record, "partial_rollout", False)
        try:
            modes = tuple(modes(algo_config) if callable(modes) else modes)
            partial = bool(partial(algo_config) if callable(partial) else partial)
        except Exception as exc:  # a plugin bug: say whose
            self.issue("algorithm", f"algorithm '{record.name}' failed to list its run modes: {type(exc).__name__}: {exc}")
            return
        mode_record = self.get("run_mode", mode, "run.mode")
        if mode_record is None:
            return
        self.out.run_mode = mode_record
        rollout = self.out.rollout
        if mode not in modes:
            self.issue("run.mode", f"algorithm '{record.name}' as configured runs in mode(s) {', '.join(modes)}, "
                       f"not {mode!r}")
        elif rollout is not None and mode not in rollout.run_modes:
            self.issue("run.mode", f"rollout '{rollout.name}' runs in mode(s) {', '.join(rollout.run_modes)}, "
                       f"not {mode!r}")
        if self.cfg.rollout.partial is not None:
            if not partial:
                self.issue("rollout.partial", f"algorithm '{record.name}' as configured does not implement partial "
                           "rollout; remove rollout.partial")
            elif rollout is not None and not rollout.partial:
                self.issue("rollout.partial", f"rollout '{rollout.name}' cannot cut its trajectories and continue "
                           "them; partial rollout needs the single_turn or multi_turn rollout")
        try:
            problems = list(mode_record.check(self.cfg, rollout))
        except Exception as exc:  # a plugin bug: say whose
            self.issue("run.mode", f"run mode '{mode}' failed to check the config: {type(exc).__name__}: {exc}")
            return
        for path, message in problems:
            self.issue(path, message)

    def user_algorithm(self, name: str) -> AlgorithmRecord | None:
        """The record of an algorithm named by import path (``module:Class``), or None with an issue."""
        if self.skip("algorithm.name"):
            return None
        try:
            return user_algorithm_record(name, search_dirs(self.source))
        except PluginError as exc:
            self.issue("algorithm.name", str(exc))
            return None

    def reference(self) -> None:
        """``algorithm.reference``: a needed reference role served by the policy with its adapters
        disabled is dropped from ``role_names`` and kept in ``views``."""
        from rlweave.config.lora import REFERENCE, reference_from_policy

        use, problems, warnings = reference_from_policy(self.cfg, self.out.role_names)
        for path, message in problems:
            self.issue(path, message)
        self.out.warnings += warnings
        if use:
            self.out.role_names = tuple(r for r in self.out.role_names if r != REFERENCE)
            self.out.views[REFERENCE] = "policy"

    def replay(self) -> None:
        """``rollout.replay``: the dump must fit this run (:mod:`rlweave.config.replay`); the rollout
        role is then not started (a ``roles.rollout`` section is validated, and left unused)."""
        if not self.cfg.rollout.replay:
            return
        from rlweave.config.replay import replay_problems

        algo = self.out.algorithm
        if algo is not None and not algo.rollout:
            self.issue("rollout.replay", f"algorithm '{algo.name}' does not sample through a rollout: nothing to "
                                         "replay")
            return
        for path, message in replay_problems(self.cfg, algo.name if algo else self.cfg.algorithm.name):
            self.issue(path, message)
        self.out.role_names = tuple(r for r in self.out.role_names if r != ROLLOUT_ROLE)

    def determinism(self) -> None:
        """``run.deterministic``: every setting that cannot be bitwise reproducible, by key."""
        from rlweave.config.replay import determinism_problems

        engine = None if self.cfg.rollout.replay else self.out.roles.get(ROLLOUT_ROLE)
        for path, message in determinism_problems(self.cfg, engine):
            self.issue(path, message)

    def router_replay(self) -> None:
        """``algorithm.router_replay``: an MoE policy on a backend that replays, an engine that records (r3)."""
        from rlweave.config.router_replay import router_replay_problems

        started = not self.cfg.rollout.replay
        for path, message in router_replay_problems(self.cfg, self.out.algorithm_config, self.out.roles, started):
            self.issue(path, message)

    def vision(self) -> None:
        """A vision-language model: roles whose backend or engine takes it, and what carries no images yet."""
        from rlweave.config.vision import vision_problems

        for path, message in vision_problems(self.cfg, self.out.algorithm_config, self.out.roles):
            self.issue(path, message)

    def lora(self) -> None:
        from rlweave.config.lora import adapter_sync_problems, lora_problems

        for path, message in lora_problems(self.cfg, self.out.roles, NEVER_TRAINED):
            self.issue(path, message)
        for path, message in adapter_sync_problems(self.cfg, self.out.roles):
            self.issue(path, message)

    def roles(self) -> None:
        needed = self.out.role_names
        algo = self.out.algorithm.name if self.out.algorithm else self.cfg.algorithm.name
        for role in needed:
            if role not in self.cfg.roles:
                what = "an engine" if role == ROLLOUT_ROLE else "a backend"
                self.issue(f"roles.{role}", f"missing: algorithm '{algo}' needs role '{role}' (with {what}); "
                                            f"it needs roles: {', '.join(needed)}")
        known = set(ROLE_NAMES) | set(needed)
        for role, section in self.cfg.roles.items():
            path = f"roles.{role}"
            if role not in known:
                close = difflib.get_close_matches(role, sorted(known), n=1, cutoff=0.6)
                self.issue(path, f"unknown role '{role}'; roles are: {', '.join(sorted(known))}"
                                 + (f". Did you mean '{close[0]}'?" if close else ""))
                continue
            if role == ROLLOUT_ROLE and self.cfg.rollout.replay:
                self.out.warnings.append(f"{path}: not started: rollout.replay feeds the steps")
            elif self.out.algorithm is not None and role not in needed and role not in self.out.views:
                self.out.warnings.append(f"{path}: role '{role}' is not used by algorithm '{algo}'")
            if section.optim is not None and role in NEVER_TRAINED:
                self.out.warnings.append(f"{path}.optim: ignored: the {role} role never trains "
                                         f"({NEVER_TRAINED[role]}); remove it")
            kind, key, other = ("engine", "engine", "backend") if role == ROLLOUT_ROLE else ("backend", "backend", "engine")
            if getattr(section, other) is not None:
                self.issue(f"{path}.{other}", f"role '{role}' takes {'an engine' if key == 'engine' else 'a backend'}"
                                              f" ({path}.{key}), not {'an' if other == 'engine' else 'a'} {other}")
            name = getattr(section, key)
            if name is None:
                label = "inference engine" if kind == "engine" else "training backend"
                self.issue(f"{path}.{key}", f"role '{role}' needs a {label}; choose one of: "
                                            f"{', '.join(self.pm.names(kind)) or '(none installed)'}")
                continue
            record = self.get(kind, name, f"{path}.{key}")
            if record is None:
                continue
            self.out.roles[role] = record
            options = self.section(record, section.options, f"{path}.options")
            self.out.role_options[role] = options
            if options is not None:
                section.options = options.model_dump(mode="json", by_alias=True)
            supported = tuple(getattr(record, "parallel", ()))
            for dim in section.parallel:
                if dim not in supported:
                    self.issue(f"{path}.parallel.{dim}", f"{kind} '{name}' does not support '{dim}' parallelism; "
                                                         f"it supports: {', '.join(supported) or 'none'}")
            check = getattr(record, "check", None)
            if check is not None and options is not None:
                model = section.model if section.model is not None else self.cfg.model
                try:
                    for key, message in check(role, section, model):
                        self.issue(key, message)
                except Exception as exc:  # a plugin bug: say whose
                    self.issue(path, f"{kind} '{name}' failed to check role '{role}': {type(exc).__name__}: {exc}")

    def rewards(self) -> None:
        for i, entry in enumerate(self.cfg.rewards):
            path = f"rewards.{i}"
            if is_reference(entry.name):
                if not self.skip(f"{path}.name"):
                    try:
                        user_function(entry.name, "reward")
                    except TargetError as exc:
                        self.issue(f"{path}.name", str(exc))
                self.out.rewards.append(None)
                self.out.reward_args.append(None)
                continue
            record = self.get("reward", entry.name, f"{path}.name")
            self.out.rewards.append(record)
            args = None
            if record is not None:  # no config model: the reward takes no args, so any key is an error
                args = self.section(record, entry.args, f"{path}.args")
                if args is not None:
                    entry.args = args.model_dump(mode="json", by_alias=True)
            self.out.reward_args.append(args)

    def kernels(self) -> None:
        from rlweave.config.kernels import kernel_problems, role_kernels

        named = {name: f"kernels.{name}" for name, on in self.cfg.kernels.items() if on}  # where each is switched on
        for role, section in self.cfg.roles.items():
            for name, on in section.kernels.items():
                if on:
                    named.setdefault(name, f"roles.{role}.kernels.{name}")
        found = {name: self.get("kernel", name, path) for name, path in named.items()}
        known = {name for name, record in found.items() if record is not None}
        for role, record in self.out.roles.items():
            self.out.role_kernels[role] = [n for n in role_kernels(self.cfg, role, record) if n in known]
        for name in sorted({n for names in self.out.role_kernels.values() for n in names}):
            self.out.kernels[name] = found[name]
        for path, message in kernel_problems(self.cfg, self.out.roles, known):
            self.issue(path, message)

    def required(self) -> None:
        for i, text in enumerate(self.cfg.required_plugins):
            path = f"required_plugins.{i}"
            try:
                req = Requirement(text)
            except InvalidRequirement as exc:
                self.issue(path, f"'{text}' is not a valid requirement: {str(exc).splitlines()[0]}")
                continue
            try:
                version = md.version(req.name)
            except md.PackageNotFoundError:
                installed = ", ".join(f"{d} {v}" for d, v in sorted(self.pm.distributions().items()))
                self.issue(path, f"required plugin '{text}' is not installed (installed plugins: {installed or 'none'})")
                continue
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                self.issue(path, f"required plugin '{text}' is not satisfied: {req.name} {version} is installed")

    def placement(self) -> None:
        try:
            from rlweave.config.placement import check_placement, spans_of
        except ImportError:
            return
        names = [r for r in (self.out.role_names or tuple(self.cfg.roles)) if r in self.cfg.roles]
        spans = {r: spans_of(rec) for r, rec in self.out.roles.items()}
        try:
            problems = check_placement(self.cfg, names, rank_spans=spans)
        except Exception as exc:
            self.issue("resources", f"placement check failed: {type(exc).__name__}: {exc}")
            return
        for path, message in problems:
            self.issue(path, message)

    def scheduler(self) -> None:
        """What ``run.scheduler: in_process`` refuses (:mod:`rlweave.config.in_process`)."""
        try:
            from rlweave.config.in_process import in_process_problems
            from rlweave.config.placement import spans_of
        except ImportError:  # a test replaced the placement rules
            return
        names = [r for r in (self.out.role_names or tuple(self.cfg.roles)) if r in self.cfg.roles]
        spans = {r: spans_of(rec) for r, rec in self.out.roles.items()}
        for path, message in in_process_problems(self.cfg, names, spans):
            self.issue(path, message)


def collect_plugin_issues(cfg: RunConfig, pm: PluginManager, source: str,
                          skip: Callable[[str], bool] = lambda path: False) -> tuple[ResolvedPlugins, list[ConfigIssue]]:
    """Run pass two and return what was resolved plus every issue (none raised).

    ``skip(path)`` is true for selections (``algorithm.name``, ``roles.<r>.backend``...) whose
    value pass one rejected: they are left unresolved without an issue of their own.
    """
    run = _Pass(cfg, pm, source, skip)
    run.required()
    run.algorithm()
    run.reference()
    run.replay()
    run.roles()
    run.determinism()
    run.router_replay()
    run.vision()
    run.lora()
    run.rewards()
    run.kernels()
    run.placement()
    run.scheduler()
    return run.out, run.issues


def resolve_plugins(cfg: RunConfig, pm: PluginManager | None = None, source: str = "<config>") -> ResolvedPlugins:
    """Pass two for an already-validated config; raises :class:`ConfigError` listing all issues.

    The runner can call this on the ``RunConfig`` it receives to get the selected records.
    """
    if pm is None:
        from rlweave.plugins.manager import get_plugin_manager

        pm = get_plugin_manager()
    resolved, issues = collect_plugin_issues(cfg, pm, source)
    if issues:
        raise ConfigError(issues)
    return resolved
