"""``WeightSync``: the run's weight syncs, one transport per (source, destination) pair.

The runner makes one for the run (from the ``weight_sync`` config section) and hands it to
the algorithm as :attr:`rlweave.interfaces.algorithm.RunContext.weight_sync`; algorithms call
``ctx.weight_sync.sync("policy", "rollout")``. Each pair's transport is built on its first
sync (``auto`` resolved then, from where the two roles' ranks run) and set up then (both
roles are running by that time), reused by every later sync of that pair, and closed by
:meth:`WeightSync.close` at the end of the run. When the runner rebuilds a role
(``run.max_restarts``) it calls :meth:`WeightSync.forget` so the pairs of that role get a
fresh transport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from rlweave.weight_sync.sync import sync_timeout, sync_weights

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.weight_sync.interface import WeightTransport
    from rlweave.weight_sync.section import WeightSyncSection

#: ``weight_sync.transport`` value -> ``module:class`` of the transport
TRANSPORTS = {
    "object_store": "rlweave.weight_sync.object_store:ObjectStoreTransport",
    "broadcast": "rlweave.weight_sync.broadcast:BroadcastTransport",
    "cuda_ipc": "rlweave.weight_sync.cuda_ipc:CudaIpcTransport",
    "in_process": "rlweave.weight_sync.in_process:InProcessTransport",
}
#: what ``auto`` means when the roles cannot be asked where they run (:func:`make_transport`
#: without them): the object store, which works wherever Ray runs. With both roles running,
#: :class:`WeightSync` resolves ``auto`` by :func:`rlweave.weight_sync.auto.resolve_auto`.
AUTO = "object_store"


def make_transport(name: str, timeout_s: float = 900.0) -> "WeightTransport":
    """A new transport for ``weight_sync.transport`` = ``name`` (``auto``: :data:`AUTO`);
    ``timeout_s`` bounds the operations of transports that hold a channel open (the broadcast
    group, the cuda_ipc channel)."""
    import importlib

    target = TRANSPORTS.get(AUTO if name == "auto" else name)
    if target is None:
        raise ValueError(f"weight_sync.transport: unknown transport {name!r}; choose auto or "
                         f"{', '.join(TRANSPORTS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)(timeout_s=timeout_s)


class PendingSync:
    """A sync begun by :meth:`WeightSync.start`; :meth:`result` waits for it (once) and
    returns its stats, raising its errors."""

    def __init__(self, info: dict[str, Any] | None = None, finish: Callable[[], dict[str, Any]] | None = None,
                 stamp: Any = None):
        self._info, self._finish, self._stamp = info, finish, stamp

    def result(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self._finish() if self._finish is not None else {}
            if self._stamp is not None:
                self._stamp.result()
        return self._info


class WeightSync:
    """Weight syncs between the roles in ``roles`` (a live mapping: a rebuilt role's new
    handle is used from then on).

    ``section``: the ``weight_sync`` config section (default: its defaults).
    ``transport_factory(src, dst)``: makes the transport of a pair (default: from
    ``section.transport``, or with ``section.lora: adapter`` the adapter transport, writing under
    ``folder``: :mod:`rlweave.weight_sync.adapter`); tests and embedders pass their own.
    """

    def __init__(self, roles: Mapping[str, Any], section: "WeightSyncSection | None" = None,
                 transport_factory: Callable[[str, str], "WeightTransport"] | None = None,
                 folder: Any = None):
        if section is None:
            from rlweave.weight_sync.section import WeightSyncSection

            section = WeightSyncSection()
        self.roles = roles
        self.bucket_bytes = int(section.bucket_mb * (1 << 20))
        self.timeout_s = section.timeout_s
        name = section.transport
        self.folder = folder
        self._factory = transport_factory or (self._adapter() if section.lora == "adapter" else self._configured(name))
        self._transports: dict[tuple[str, str], "WeightTransport"] = {}

    def _configured(self, name: str) -> Callable[[str, str], "WeightTransport"]:
        def make(src: str, dst: str) -> "WeightTransport":
            timeout_s = sync_timeout(self._handle(dst), self.timeout_s)
            if name == "auto":
                from rlweave.weight_sync.auto import resolve_auto

                return make_transport(resolve_auto(self._handle(src), self._handle(dst), timeout_s), timeout_s)
            return make_transport(name, timeout_s)

        return make

    def _adapter(self) -> Callable[[str, str], "WeightTransport"]:
        def make(src: str, dst: str) -> "WeightTransport":
            from pathlib import Path

            from rlweave.weight_sync.adapter import AdapterTransport

            folder = Path(self.folder) / f"{src}-{dst}" if self.folder is not None else None
            return AdapterTransport(sync_timeout(self._handle(dst), self.timeout_s), folder)

        return make

    def transport(self, src: str, dst: str) -> "WeightTransport":
        """The pair's transport, built and set up on first use."""
        key = (src, dst)
        if key not in self._transports:
            transport = self._factory(src, dst)
            transport.setup(self._handle(src), self._handle(dst))
            self._transports[key] = transport
        return self._transports[key]

    def sync(self, src: str, dst: str, version: int | None = None) -> dict[str, Any]:
        """Copy role ``src``'s current weights into every rank of role ``dst`` (blocking);
        returns the transport's stats (``bytes``, ``tensors``, ``buckets``, ``seconds``,
        ``bytes_per_s``, ...). Errors and timeouts as in :mod:`rlweave.weight_sync.interface`;
        the timeout is ``weight_sync.timeout_s``, else the destination's ``timeouts.sync``.
        ``version``: the policy version of these weights, given to an engine destination
        (``RolloutEngine.set_weight_version``) once they are loaded."""
        return sync_weights(self._handle(src), self._handle(dst), bucket_bytes=self.bucket_bytes,
                            timeout_s=self.timeout_s, transport=self.transport(src, dst), version=version)

    def start(self, src: str, dst: str, version: int | None = None) -> "PendingSync":
        """Begin a sync into ``dst`` without waiting for it (``WeightTransport.begin``): the
        destination's receiving end runs on its control channel, so on an engine with a
        control plane the weights (and ``version``) land between two decoding steps of a
        generate call in flight; on a destination without one they land after the calls sent
        to it before, which the loading may wait behind for the destination's generate timeout
        on top of the sync timeout. A transport without ``begin`` runs the sync to the end
        here. :meth:`PendingSync.result` waits for it."""
        transport = self.transport(src, dst)
        begin = getattr(transport, "begin", None)
        if begin is None:
            return PendingSync(info=self.sync(src, dst, version))
        handle = self._handle(dst)
        timeout_s = sync_timeout(handle, self.timeout_s)
        queued_s = getattr(handle, "timeout_for", lambda _m: (None, None))("generate")[0] or 0.0
        stamps = getattr(transport, "stamps_version", False)
        finish = begin(self._handle(src), handle, self.bucket_bytes, timeout_s, queued_s=float(queued_s),
                       **({"version": version} if stamps else {}))
        stamp = handle.call("set_weight_version", int(version)) if version is not None and not stamps else None
        return PendingSync(finish=finish, stamp=stamp)

    def forget(self, role: str) -> None:
        """Close and drop the transports of every pair that involves ``role`` (rebuilt)."""
        for key in [k for k in self._transports if role in k]:
            self._transports.pop(key).close()

    def close(self) -> None:
        """Close every transport (idempotent)."""
        while self._transports:
            self._transports.popitem()[1].close()

    def _handle(self, role: str) -> Any:
        if role not in self.roles:
            raise KeyError(f"weight sync: no role {role!r} in this run (roles: {', '.join(self.roles)})")
        return self.roles[role]
