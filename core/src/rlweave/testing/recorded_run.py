"""Run :func:`rlweave.runner.loop.run` with every rank in this process and the config recorded.

For config mutation tests (:mod:`rlweave.testing.config_reach`): the real run loop, role
builder, worker actor wrapper, workers, algorithm and reward set run unchanged; only Ray is
replaced by this process, so the config's reads on the worker side land in the same log as
the controller's, and no cluster has to start. What is replaced, inside :func:`recorded_run`:

* ``ray.remote(WorkerActor)`` -> :class:`rlweave.scheduler.ray_impl.actor.WorkerActor` objects
  here, and the Ray worker group -> :class:`InProcessGroup` (calls run at submission, one rank
  after another: every role must have world size 1, or be an engine, whose ranks never talk
  to each other). The actor methods that ask Ray where they run (``address``, ``placement``)
  are answered with this process's;
* Ray itself: ``start_ray``/``shutdown_ray`` do nothing (the ``ray`` section is read by
  ``start_ray`` alone; test it on its own), a pool's placement group is not reserved (the
  pool's layout, device and strategy are still read by the role builder), and the object
  store of the weight sync holds each bucket in this process (``ray.put``/``ray.get`` are the
  identity);
* the worker context (:func:`rlweave.scheduler.ray_impl.build.worker_context`) is built by the real
  function, then its ``options`` become a view at ``roles.<role>.options`` (a recording dict
  for a plugin without an options model) and its ``seed``, ``world_size`` and ``parallel`` are
  logged as ``run.seed``, ``roles.<role>.devices`` and ``roles.<role>.parallel``; its ``model``
  (``model_dump()`` of a view) and ``optim`` (a view) record already. The rank's process
  settings (:func:`rlweave.scheduler.ray_impl.build._process_settings`) log ``cpu_threads`` and
  ``cpu_malloc_reuse`` as ``roles.<role>.cpu_threads`` and ``ray.cpu_malloc_reuse`` when the
  actor applies them;
* role handles keep recording the ``timeouts`` they copy; plugin option models named in
  ``option_models`` are built as views (:meth:`Recorder.model_factory`); after a worker is
  built, plain-dict copies of recorded dicts it keeps are recorded too
  (:meth:`Recorder.adopt_copies`);
* plugin resolution runs in the ``resolve`` phase (the algorithm record's ``roles()`` sees its
  config as a view) and returns the algorithm's config as a view at ``algorithm``;
* reward ``args`` are logged when a reward call binds them to a named parameter of the reward
  function (the calls run in sandboxed subprocesses, out of the recorder's reach; a key that
  only lands in the function's ``**kwargs`` is not read).

Everything is restored on exit, including this process's torch threads and environment.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

from pydantic import BaseModel

from rlweave.scheduler.local import SyncWorkerGroup
from rlweave.scheduler.handle import RoleHandle
from rlweave.testing.config_reach import AttrView, ModelView, Recorder, RecordingDict
from rlweave.worker_errors import RemoteFailure, WorkerError

#: methods after which a worker's copies of recorded dicts are adopted
_BUILD_METHODS = ("setup", "init_model", "init_engine")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _value(result: Any) -> Any:
    """What a worker call returned, without the actor's timing (:class:`~rlweave.scheduler.trace.Timed`)."""
    from rlweave.scheduler.trace import Timed

    return result.value if isinstance(result, Timed) else result


class InProcessGroup(SyncWorkerGroup):
    """:class:`WorkerActor` objects in this process; each call runs at submission with the
    recorder's role set to this group's role."""

    def __init__(self, name: str, actors: list[Any], recorder: Recorder):
        self.name, self.actors, self.world_size, self.recorder = name, actors, len(actors), recorder

    def _run(self, actor: Any, method: str, args: tuple, kwargs: dict, on_actor: bool, fn: Any = None) -> Any:
        if fn is not None:
            return _value(actor.apply(method, fn, tuple(args), dict(kwargs)))
        if on_actor and method == "address":
            return "127.0.0.1", _free_port()
        if on_actor and method == "placement":
            return {"pid": os.getpid(), "node_ip": "127.0.0.1"}
        if on_actor:
            return getattr(actor, method)(*args, **kwargs)
        return _value(actor.call(method, tuple(args), dict(kwargs)))

    def submit(self, method: str, ranks, rank_args, on_actor: bool = False, fn: Any = None,
               control: bool = False) -> list:
        out = []
        for rank, (args, kwargs) in zip(ranks, rank_args):
            actor = self.actors[rank]
            with self.recorder.as_role(self.name):
                try:
                    out.append((True, self._run(actor, method, args, kwargs, on_actor, fn)))
                except RemoteFailure as f:
                    out.append((False, WorkerError(self.name, rank, f.method, f"{f.exc_type}: {f.message}",
                                                   f.traceback, f.exc, lost=f.lost)))
                except Exception as exc:  # noqa: BLE001 - actor-level methods that do not wrap
                    out.append((False, WorkerError(self.name, rank, method, f"{type(exc).__name__}: {exc}", "", exc)))
            if method in _BUILD_METHODS and actor.worker is not None:
                self.recorder.adopt_copies(actor.worker)
        return out


class _LocalActorClass:
    """Stands in for ``ray.remote(WorkerActor)``: ``.options(...).remote(cls, role, rank, log_file)``
    (the rank's output stays this process's: ``log_file`` is not used)."""

    def options(self, **_: Any) -> _LocalActorClass:
        return self

    def remote(self, worker_cls: type, role: str, rank: int, log_file: str | None = None) -> Any:  # noqa: ARG002
        from rlweave.scheduler.ray_impl.actor import WorkerActor

        return WorkerActor(worker_cls, role, rank)


def _recording_handle(recorder: Recorder) -> type:
    class RecordedHandle(RoleHandle):
        def __init__(self, name, group, parallel=None, on_close=None, timeouts=None):
            super().__init__(name, group, parallel, on_close, timeouts)
            if isinstance(timeouts, RecordingDict):
                self.timeouts = RecordingDict(self.timeouts, timeouts.path, recorder)

    return RecordedHandle


def context_paths(role: str) -> dict[str, str]:
    """Worker-context attribute -> the config key it carries."""
    return {"seed": "run.seed", "world_size": f"roles.{role}.devices", "parallel": f"roles.{role}.parallel"}


def recorded_context(ctx: Any, role: str, recorder: Recorder) -> Any:
    """``ctx`` (a real worker context) with its options recorded (see the module docstring)."""
    path = f"roles.{role}.options"
    if isinstance(ctx.options, BaseModel):
        ctx.options = ModelView(ctx.options, path, recorder)
    else:
        ctx.options = recorder.dumped(dict(ctx.options or {}), path)
    return AttrView(ctx, context_paths(role), recorder)


def recorded_settings(settings: Any, role: str, recorder: Recorder) -> Any:
    """A rank's process settings with their reads logged under their config paths."""
    paths = {"cpu_threads": f"roles.{role}.cpu_threads", "cpu_malloc_reuse": "ray.cpu_malloc_reuse"}
    return AttrView(settings, paths, recorder)


class _RecordedPlugins:
    """A plugin manager whose algorithm records see their config as a view in ``roles()``."""

    def __init__(self, pm: Any, recorder: Recorder):
        self._pm, self._recorder = pm, recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pm, name)

    def get(self, kind: str, name: str, where: str | None = None) -> Any:
        record = self._pm.get(kind, name, where)
        if kind != "algorithm":
            return record
        roles, recorder = record.roles, self._recorder

        def recorded_roles(cfg: Any) -> Any:
            if type(cfg) is not ModelView and isinstance(cfg, BaseModel):
                cfg = ModelView(cfg, "algorithm", recorder)
            return roles(cfg)

        return dataclasses.replace(record, roles=recorded_roles)


def _reward_arg_reads(recorder: Recorder, entries: list[Any]) -> None:
    """Log each ``args`` key of each reward entry that binds to a named parameter of its function."""
    import inspect

    from rlweave.plugins.manager import get_plugin_manager
    from rlweave.rewards.loader import load_reward_fn

    records = {p.record.name: p.record for p in get_plugin_manager().providers("reward")}
    for entry in entries:
        args = entry.args
        if not isinstance(args, RecordingDict) or not len(args):
            continue
        params = inspect.signature(load_reward_fn(entry.name, records)).parameters
        for key in dict.keys(args):
            p = params.get(key)
            if p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                recorder.read(f"{args.path}.{key}", dict.__getitem__(args, key))


@contextmanager
def recorded_run(recorder: Recorder, option_models: Mapping[str, str] = {}) -> Iterator[None]:
    """Inside, :func:`rlweave.runner.loop.run` given a :class:`ModelView` of its config runs every
    rank here and logs reads to ``recorder`` (see the module docstring). ``option_models``:
    worker module -> the name of an option model it builds itself from a copy of a section,
    e.g. ``{"some_plugin.worker": "ItsConfig"}`` (options a worker takes from ``ctx.options``
    record already). Ray must not be running."""
    import ray
    import torch

    from rlweave.config import resolve
    from rlweave.rewards import reward_set
    from rlweave.scheduler.ray_impl import build, cluster
    from rlweave.scheduler.ray_impl.pools import PoolPlacement

    if ray.is_initialized():
        raise RuntimeError("recorded_run replaces Ray in this process; shut the running Ray down first")

    real_resolve = resolve.resolve_plugins
    real_context = build.worker_context
    real_settings = build._process_settings
    real_score = reward_set.RewardSet.score

    def resolve_plugins(cfg, pm=None, source="<config>"):
        if pm is None:
            from rlweave.plugins.manager import get_plugin_manager

            pm = get_plugin_manager()
        with recorder.in_phase("resolve"):
            out = real_resolve(cfg, _RecordedPlugins(pm, recorder), source)
        if out.algorithm_config is not None:
            out.algorithm_config = ModelView(out.algorithm_config, "algorithm", recorder)
        return out

    def worker_context(cfg, role, rank, addr, total_steps=None, record=None, kernel_records=None):
        with recorder.paused():
            ctx = real_context(cfg, role, rank, addr, total_steps, record, kernel_records)
        return recorded_context(ctx, role, recorder)

    def _process_settings(cfg, role):
        with recorder.paused():
            settings = real_settings(cfg, role)
        return recorded_settings(settings, role, recorder)

    def score(self, samples):
        _reward_arg_reads(recorder, self.entries)
        return real_score(self, samples)

    threads, env = torch.get_num_threads(), dict(os.environ)
    with ExitStack() as stack:

        def patch(target: Any, name: str, value: Any) -> None:
            stack.enter_context(mock.patch.object(target, name, value))

        patch(resolve, "resolve_plugins", resolve_plugins)
        patch(build, "worker_context", worker_context)
        patch(build, "_process_settings", _process_settings)
        patch(build, "remote_actor_class", lambda *_a, **_k: _LocalActorClass())
        patch(build, "RayWorkerGroup", lambda name, actors, **_k: InProcessGroup(name, actors, recorder))
        patch(build, "RoleHandle", _recording_handle(recorder))
        patch(cluster, "start_ray", lambda *a, **k: None)
        patch(cluster, "shutdown_ray", lambda *a, **k: None)
        patch(build, "create_pool", lambda layout, device, strategy, *a, **k: PoolPlacement(layout, device, None))
        patch(ray, "put", lambda value, **_: value)
        patch(ray, "get", lambda ref, **_: ref)
        patch(reward_set.RewardSet, "score", score)
        for module, name in option_models.items():
            mod = importlib.import_module(module)
            patch(mod, name, recorder.model_factory(getattr(mod, name)))
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            os.environ.clear()
            os.environ.update(env)
