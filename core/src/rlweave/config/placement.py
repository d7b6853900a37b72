"""Placement check: do the roles of a run fit their resource pools?

Pure Python (no torch, no Ray), so ``rlweave train`` rejects a placement before anything
starts. The scheduler lays roles out with the same rules (:func:`pool_layout`), so what
passes here is what Ray is asked for.

Rules:

* every role names a pool in ``resources.pools``;
* a colocation group (``resources.colocate.<i>``) names configured roles, each once, all in
  the same pool, and a role is in at most one group;
* capacity: inside a pool each *slot* takes devices side by side; a lone role is a slot
  of ``devices``, a colocation group is one slot of the largest ``devices`` of its
  members (they share those devices and take turns); the slots must fit in
  ``nodes x devices_per_node``;
* parallel sizes: when ``roles.<r>.parallel`` is given, every size is >= 1; with ``dp``
  the product of the sizes equals ``roles.<r>.devices`` (``dp * tp * pp == devices``),
  without it the product divides ``devices`` and the quotient is the data-parallel size
  (``devices: 4, parallel: {tp: 2}`` is two replicas of two devices); sizes in
  :data:`WITHIN_DP` (expert parallelism, ``ep``) split the data-parallel replicas instead of
  adding devices: they are left out of the product and must divide the data-parallel size;
  when the selected plugin's record is known, every key is one the plugin supports;
* ranks spanning devices: when the plugin's record says one rank spans some parallel sizes
  (``EngineRecord.rank_spans``, e.g. a vLLM replica spans ``tp`` devices), the devices of
  one rank (:func:`devices_per_rank`) must sit on one node: that number must not exceed,
  and must divide, the pool's ``devices_per_node``, and the role's slot must start on a
  multiple of it inside its node, so no rank straddles two nodes.

Only the roles the algorithm needs (``role_names``) are placed; other configured roles
are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.schema import RunConfig


#: parallel sizes that split the data-parallel replicas rather than multiply devices: ``ep``
#: (expert parallelism: ``ep`` replicas of the dense layers each hold 1/ep of the experts)
WITHIN_DP = ("ep",)


@dataclass(frozen=True)
class Slot:
    """Devices taken side by side in a pool: one lone role, or one colocation group."""

    roles: tuple[str, ...]
    devices: int
    offset: int  # first device (bundle) index inside the pool

    @property
    def colocated(self) -> bool:
        return len(self.roles) > 1


@dataclass
class PoolLayout:
    """The slots of one pool, in the order they take devices."""

    name: str
    capacity: int
    slots: list[Slot] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(s.devices for s in self.slots)

    def slot_of(self, role: str) -> Slot:
        for s in self.slots:
            if role in s.roles:
                return s
        raise KeyError(f"role {role!r} has no slot in pool {self.name!r}")


def _groups_by_role(cfg: "RunConfig") -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for group in cfg.resources.colocate:
        for r in group:
            out.setdefault(r, tuple(group))
    return out


def pool_layout(cfg: "RunConfig", role_names: Sequence[str]) -> dict[str, PoolLayout]:
    """Slots per pool for ``role_names`` (roles in the order given; a colocation group takes
    its slot where its first needed member appears). Assumes :func:`check_placement`
    passed; only needed roles count, also inside colocation groups."""
    needed = [r for r in dict.fromkeys(role_names) if r in cfg.roles]
    groups = _groups_by_role(cfg)
    layouts: dict[str, PoolLayout] = {}
    done: set[str] = set()
    for role in needed:
        if role in done:
            continue
        members = tuple(r for r in groups.get(role, (role,)) if r in needed)
        done.update(members)
        pool_name = cfg.roles[role].pool
        pool = cfg.resources.pools.get(pool_name)
        capacity = pool.nodes * pool.devices_per_node if pool is not None else 0
        layout = layouts.setdefault(pool_name, PoolLayout(pool_name, capacity))
        devices = max(cfg.roles[r].devices for r in members)
        layout.slots.append(Slot(members, devices, layout.used))
    return layouts


def devices_per_rank(parallel: Mapping[str, int], spans: Sequence[str] = ()) -> int:
    """Devices one rank takes: the product of the sizes in ``parallel`` named by ``spans``
    (a plugin record's ``rank_spans``); 1 when it spans none."""
    n = 1
    for key in spans:
        n *= max(1, int(parallel.get(key, 1)))
    return n


def spans_of(record: Any) -> tuple[str, ...]:
    """The parallel sizes one rank of a plugin spans (its record's ``rank_spans``; none for
    records without the field, or no record)."""
    return tuple(getattr(record, "rank_spans", ()) or ())


def rank_parallel(parallel: Mapping[str, int], spans: Sequence[str] = ()) -> dict[str, int]:
    """The parallel sizes *between* ranks: ``parallel`` without the sizes a rank spans
    (what the role's handle dispatches over; ``{tp: 2}`` spanned by a rank leaves ``{}``,
    so every rank is one data-parallel replica)."""
    return {k: v for k, v in parallel.items() if k not in spans}


def _parallel_errors(role: str, section: Any, supported: Sequence[str] | None) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    par = dict(section.parallel)
    if not par:
        return errors
    path = f"roles.{role}.parallel"
    for key, size in par.items():
        if size < 1:
            errors.append((f"{path}.{key}", f"parallel size {key}={size} must be >= 1"))
        if supported is not None and key not in supported:
            choices = ", ".join(supported) if supported else "none"
            errors.append((f"{path}.{key}", f"role {role!r}: the selected plugin does not support parallel size "
                           f"{key!r} (supported: {choices})"))
    product = 1
    for key, size in par.items():
        product *= max(1, size) if key not in WITHIN_DP else 1
    arith = " * ".join(f"{k} {v}" for k, v in par.items() if k not in WITHIN_DP) or "1"
    dp = par.get("dp") or (section.devices // product if product and not section.devices % product else None)
    for key in WITHIN_DP:
        if key in par and par[key] >= 1 and dp and dp % par[key]:
            errors.append((f"{path}.{key}", f"role {role!r}: {key}={par[key]} must divide the data-parallel size "
                           f"{dp} ({key} splits the data-parallel replicas: it takes no devices of its own)"))
    if "dp" in par and product != section.devices:
        errors.append((path, f"role {role!r}: {arith} = {product}, but roles.{role}.devices is {section.devices} "
                       "(the product of the parallel sizes must equal devices)"))
    elif "dp" not in par and section.devices % product:
        errors.append((path, f"role {role!r}: {arith} = {product} does not divide roles.{role}.devices "
                       f"({section.devices}); devices must be a multiple of it (the quotient is the number of "
                       "data-parallel replicas)"))
    return errors


def _span_errors(cfg: "RunConfig", role: str, span: int, layout: PoolLayout) -> list[tuple[str, str]]:
    """A rank of ``role`` spanning ``span`` devices must fit on one node of its pool."""
    name = cfg.roles[role].pool
    pool = cfg.resources.pools[name]
    per_node = pool.devices_per_node
    path = f"roles.{role}.parallel"
    where = f"role {role!r}: one rank spans {span} devices ({path})"
    if span > per_node:
        return [(path, f"{where}, but a node of pool {name!r} has only {per_node} "
                 f"(resources.pools.{name}.devices_per_node); a rank's devices must be on one node")]
    if pool.nodes > 1 and per_node % span:
        return [(path, f"{where}, which does not divide resources.pools.{name}.devices_per_node ({per_node}): "
                 f"with {pool.nodes} nodes some rank would straddle two nodes")]
    offset = layout.slot_of(role).offset
    if pool.nodes > 1 and (offset % per_node) % span:
        return [(path, f"{where}, but its devices start at device {offset} of pool {name!r} ({per_node} per node), "
                 f"not on a multiple of {span}: some rank would straddle two nodes; list the role earlier in its "
                 "pool or give it a pool of its own")]
    return []


def check_placement(
    cfg: "RunConfig",
    role_names: Sequence[str],
    supported_parallel: Mapping[str, Sequence[str]] | None = None,
    rank_spans: Mapping[str, Sequence[str]] | None = None,
) -> list[tuple[str, str]]:
    """Every placement problem of ``role_names`` as ``(dotted path, message)``; empty when
    the placement fits.

    ``supported_parallel`` (optional) maps a role to the parallel keys its selected plugin
    supports (``BackendRecord.parallel`` / ``EngineRecord.parallel``); ``rank_spans``
    (optional) maps a role to the parallel keys one of its ranks spans
    (``EngineRecord.rank_spans``).
    """
    errors: list[tuple[str, str]] = []
    needed = list(dict.fromkeys(role_names))
    pools = cfg.resources.pools
    pool_names = ", ".join(sorted(pools)) or "none"

    for role in needed:
        if role not in cfg.roles:
            errors.append((f"roles.{role}", f"the algorithm needs role {role!r} but it is not configured "
                           f"(needed roles: {', '.join(needed)})"))

    for role, section in cfg.roles.items():
        if role in needed and section.pool not in pools:
            errors.append((f"roles.{role}.pool", f"unknown pool {section.pool!r} (defined pools: {pool_names})"))

    seen_in_group: dict[str, int] = {}
    for i, group in enumerate(cfg.resources.colocate):
        path = f"resources.colocate.{i}"
        if len(group) < 2:
            errors.append((path, f"a colocation group needs at least two roles, got {group}"))
        for r in group:
            if r not in cfg.roles:
                errors.append((path, f"unknown role {r!r} (configured roles: {', '.join(cfg.roles) or 'none'})"))
        dups = sorted({r for r in group if group.count(r) > 1})
        if dups:
            errors.append((path, f"role(s) {', '.join(dups)} listed twice in one colocation group"))
        for r in dict.fromkeys(group):
            if r in seen_in_group:
                errors.append((path, f"role {r!r} is already in resources.colocate.{seen_in_group[r]}; "
                               "a role belongs to at most one colocation group"))
            else:
                seen_in_group[r] = i
        known = [r for r in dict.fromkeys(group) if r in cfg.roles]
        in_pools = {r: cfg.roles[r].pool for r in known}
        if len(set(in_pools.values())) > 1:
            where = ", ".join(f"{r} in {p!r}" for r, p in in_pools.items())
            errors.append((path, f"colocated roles must share one pool: {where}"))

    for role in needed:
        if role in cfg.roles:
            sup = None if supported_parallel is None else supported_parallel.get(role)
            errors.extend(_parallel_errors(role, cfg.roles[role], sup))

    if errors:  # capacity arithmetic only makes sense on a consistent layout
        return errors

    layouts = pool_layout(cfg, needed)
    for role, spans in (rank_spans or {}).items():
        span = devices_per_rank(cfg.roles[role].parallel, spans) if role in needed and role in cfg.roles else 1
        if span > 1:
            errors.extend(_span_errors(cfg, role, span, layouts[cfg.roles[role].pool]))

    for name, layout in layouts.items():
        if layout.used <= layout.capacity:
            continue
        pool = pools[name]
        terms = []
        for s in layout.slots:
            if s.colocated:
                inner = ", ".join(f"{r} {cfg.roles[r].devices}" for r in s.roles)
                terms.append(f"[{inner} colocated] {s.devices}")
            else:
                terms.append(f"{s.roles[0]} {s.devices}")
        note = "" if any(s.colocated for s in layout.slots) else " (no colocation)"
        node_word = "node" if pool.nodes == 1 else "nodes"
        errors.append((
            f"resources.pools.{name}",
            f"pool {name!r} has {pool.nodes} {node_word} x {pool.devices_per_node} devices = {layout.capacity}; "
            f"needs {' + '.join(terms)} = {layout.used}{note}",
        ))
    return errors


def required_devices(cfg: "RunConfig", role_names: Sequence[str], device: str = "gpu") -> int:
    """Devices the placement of ``role_names`` takes from pools of kind ``device``
    (what a local cluster must declare, e.g. as virtual GPUs)."""
    return sum(
        layout.used
        for name, layout in pool_layout(cfg, role_names).items()
        if name in cfg.resources.pools and cfg.resources.pools[name].device == device
    )


class PlacementError(ValueError):
    """The placement of a run's roles does not fit; ``errors`` holds ``(dotted path, message)``."""

    def __init__(self, errors: Sequence[tuple[str, str]]):
        self.errors = list(errors)
        lines = "\n".join(f"  {path}: {msg}" for path, msg in self.errors)
        super().__init__(f"placement does not fit ({len(self.errors)} problem(s)):\n{lines}")
