"""The run loop behind ``rlweave train``: one validated config in, one finished run out.

Order of work (see :func:`run`)::

    resolve plugins -> run dir, seeds, tokenizer, data, rewards -> start Ray (none with
    run.scheduler: in_process) -> build the roles the algorithm asks for ->
    algorithm(config, ctx) -> [resume: load the latest complete checkpoint] -> setup ->
    eval before -> steps (status line, metrics, checkpoints, periodic eval) -> eval after
    -> final checkpoint + HF export -> plot -> shut everything down (also on errors and SIGTERM)

Checkpoints (``<run_dir>/checkpoints/step_XXXXXX``, atomic via
:class:`~rlweave.runner.checkpoint.CheckpointManager`) hold every trained role's own
checkpoint (model, optimizer, LR schedule, worker RNG) in ``roles/<role>/`` plus
``state.json`` (step, algorithm state, data position) and ``rng.json`` (controller RNGs,
:mod:`rlweave.runner.rng`); nothing in a checkpoint is a pickle, and nothing is unpickled on
load. Their ``COMPLETE`` marker lists every file with its checksum. ``resume=True`` continues
from the newest complete checkpoint that verifies (newer damaged ones are skipped with a
warning naming the files; :class:`~rlweave.runner.checkpoint.CheckpointError` when none
verifies, or when a file is not in the expected form, e.g. a pickle); a run killed mid-save
loses at most the steps since the previous one.

Failures: every role call waits at most its ``roles.<role>.timeouts`` entry; a dead or hung
rank ends the run with an error naming role, rank and method (after every process is shut
down; the last complete checkpoint is untouched). With ``run.max_restarts`` > 0 the run
recovers from such a *lost* worker (see :mod:`rlweave.runner.recovery`) instead: the lost
roles are rebuilt, every trained role, the algorithm, the data position and the controller
RNGs go back to the newest complete checkpoint (one is written at step 0 for this), weights
are synced again, and the run continues from there, so no prompt is skipped or trained on
twice. ``<run_dir>/workers.json`` lists every rank's process (role, rank, pid, node). User or plugin
code that fails inside the run (an environment's ``step``, a reward failing too often) ends it with
one error naming it, its key and the record, its traceback appended to ``<run_dir>/logs/errors.log``
(:mod:`rlweave.runner.error_log`).
"""

from __future__ import annotations

import logging
import os
import random
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rlweave.config.schema import RunConfig
from rlweave.runner import rng
from rlweave.runner.error_log import LOGGED, write_error_log
from rlweave.scheduler.trace import STEPS, TRACE
from rlweave.scheduler.worker_log import VERBOSE_ENV
from rlweave.runner.checkpoint import CheckpointManager, write_json
from rlweave.runner.metrics import MetricsLogger
from rlweave.runner.console import run_console
from rlweave.runner.progress import Progress, format_status
from rlweave.runner.signals import RunInterrupted, Signals  # noqa: F401 - RunInterrupted: part of this API

log = logging.getLogger("rlweave.runner")

#: status line: (label, metrics key)
STATUS_FIELDS = (
    ("reward", "reward/mean"),
    ("kl", "kl"),
    ("loss", "loss"),
    ("len", "response_len/mean"),
)
#: seconds to wait before publishing a checkpoint (tests kill the run inside this window)
CHECKPOINT_DELAY_ENV = "RLWEAVE_CHECKPOINT_DELAY_S"
#: panels of the PNG plot, when present in the metrics
PLOT_KEYS = ("reward/mean", "eval/accuracy", "loss", "kl", "response_len/mean", "entropy")


def _seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed the controller; with ``deterministic`` (``run.deterministic``) also turn on torch's
    deterministic algorithms here, where in-process workers run (Ray ranks turn them on in
    :func:`rlweave.scheduler.ray_impl.process.apply`)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        from rlweave.scheduler.ray_impl.process import use_deterministic_algorithms

        use_deterministic_algorithms()


def _model_section(cfg: RunConfig, role: str = "policy"):
    sec = cfg.roles.get(role)
    return sec.model if sec is not None and sec.model is not None else cfg.model


def _load_tokenizer(cfg: RunConfig):
    from transformers import AutoTokenizer

    m = _model_section(cfg)
    path = m.tokenizer or m.path
    if not path:
        raise ValueError("config: model.path (or model.tokenizer) is required: the tokenizer is read from it")
    if not Path(path).exists():
        raise FileNotFoundError(f"config: model path {path!r} does not exist (build it first, e.g. examples/arith)")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=m.trust_remote_code)


def _load_vision(cfg: RunConfig, tokenizer: Any) -> Any:
    """The run's :class:`~rlweave.data.vision.VisionProcessor` when its model is a vision-language
    model (pixel bounds from ``model.vision``), else None."""
    from rlweave.data.vision import VisionProcessor

    m = _model_section(cfg)
    return VisionProcessor.for_model(m.path, m.vision, tokenizer) if m.path else None


def _trained_roles(cfg: RunConfig, roles: list[str]) -> list[str]:
    """Roles with their own checkpoints: training backends with an optimizer (never the
    rollout or the reference, whose ``optim`` validation warns about and ignores)."""
    from rlweave.config.resolve import NEVER_TRAINED

    return [r for r in roles if r not in NEVER_TRAINED and cfg.roles[r].backend is not None
            and cfg.roles[r].optim is not None]


def _timings(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's phases for the status line: ``time/<phase>`` (parts of a phase,
    ``time/<phase>/<part>``, stay in the metrics only)."""
    return {k[5:]: float(v) for k, v in metrics.items()
            if k.startswith("time/") and "/" not in k[5:] and isinstance(v, (int, float))}


def run(cfg: RunConfig, config_path: str | os.PathLike[str] | None = None,
        run_dir: str | os.PathLike[str] | None = None, resume: bool | str = False,
        overwrite: bool = False) -> dict[str, Any]:
    """Run the training described by ``cfg`` (already validated, both passes).

    Args:
        cfg: the run config.
        config_path: the YAML it came from (shown in messages; may be None).
        run_dir: where everything goes (default ``<run.output_dir>/<run.name>``).
        resume: ``True``: continue from the newest complete checkpoint in ``run_dir``; when
            there is none, the first line printed says so and the run starts from step 0.
            ``"required"``: the same, but no complete checkpoint raises
            :class:`~rlweave.runner.previous_run.RunDirError`. ``False``: a fresh start.
        overwrite: when ``run_dir`` already holds a run, rename it to the sibling
            ``<name>.replaced-<UTC time>`` (never deleted) and start fresh; with ``resume``
            it raises ``RunDirError``.

    A fresh start never deletes or overwrites an earlier run: when ``run_dir`` holds one
    (complete checkpoints past step 0, metrics of trained steps, ``hf/``, ``summary.json``)
    and ``overwrite`` is False, ``RunDirError`` says what is there, before anything is written
    or any worker starts. See :mod:`rlweave.runner.previous_run` for the whole rule.

    Returns a summary: ``run_dir``, ``steps``, ``resumed_from``, ``restarts`` (lost workers
    recovered from, see ``run.max_restarts``), ``eval_before``, ``eval_after`` (metric dicts or
    None), ``hf_path``, ``metrics_path``, ``plot_path``, ``wall_s``; the same is written to
    ``<run_dir>/summary.json``.
    """
    with Signals():
        return _Run(cfg, config_path, run_dir, resume, overwrite).execute()


class _Run:
    def __init__(self, cfg: RunConfig, config_path, run_dir, resume: bool | str, overwrite: bool = False):
        self.cfg = cfg
        self.source = str(config_path) if config_path else "<config>"
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.run.output_dir) / cfg.run.name
        self.resume = resume
        self.overwrite = overwrite
        self.roles: dict[str, Any] = {}
        self.builder = None
        self.ctx = None
        self.algo = None
        self.rewards = None
        self.metrics = None
        self.progress = None
        self.ray_started = False
        self.restarts = 0
        self.console = None  # rlweave.runner.console.RunConsole, once the run directory is claimed
        self._exit = ExitStack()

    # --------------------------------------------------------------- helpers
    def say(self, line: str) -> None:
        if self.progress is not None:
            self.progress.write(line)
        else:
            print(line, flush=True)

    def _save(self, step: int) -> Path:
        tmp = self.ckpt.begin(step)
        futs = []
        for role in self.trained:
            d = tmp / "roles" / role
            d.mkdir(parents=True, exist_ok=True)
            futs.append(self.roles[role].save_checkpoint(str(d)))
        for f in futs:
            f.result()
        write_json(tmp / "state.json", {
            "step": step,
            "algorithm": self.algo.state_dict(),
            "data": self.data_iter.state_dict() if self.data_iter is not None else None,
            "roles": self.trained,
        })
        write_json(tmp / "rng.json", rng.to_json(rng.get_state()))
        delay = float(os.environ.get(CHECKPOINT_DELAY_ENV, "0") or 0)
        if delay > 0:  # fault injection for tests: a window in which the save is half done
            time.sleep(delay)
        path = self.ckpt.commit(tmp, step)
        self.say(f"checkpoint: {path}")
        return path

    def _load(self, path: Path) -> int:
        """Load checkpoint ``path`` (verified by :meth:`CheckpointManager.resumable`) into every
        trained role, the algorithm, the data position and the controller RNGs; returns its step.
        The controller's files are read as JSON and checked before any role loads; a file in
        another form (a pickle included: never unpickled) or a role refusing its state raises
        :class:`~rlweave.runner.checkpoint.CheckpointError` naming the file."""
        from rlweave.runner.checkpoint import CheckpointError, read_state_json, refuse_pickle
        from rlweave.worker_errors import WorkerError

        state = read_state_json(path / "state.json")
        if not isinstance(state, dict) or type(state.get("step")) is not int:
            raise CheckpointError(f"checkpoint file {path / 'state.json'} has no integer \"step\"")
        if not (path / "rng.json").exists() and (path / "rng.pkl").exists():
            raise refuse_pickle(path / "rng.pkl", "the controller's RNG state")
        try:
            rng_state = rng.from_json(read_state_json(path / "rng.json"), source=str(path / "rng.json"))
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        missing = [r for r in self.trained if not (path / "roles" / r).is_dir()]
        if missing:
            raise CheckpointError(f"checkpoint {path} has no state for role(s) {', '.join(missing)}")
        futs = [(r, self.roles[r].load_checkpoint(str(path / "roles" / r))) for r in self.trained]
        for role, f in futs:
            try:
                f.result()
            except WorkerError as exc:
                if isinstance(exc.cause, CheckpointError):
                    raise CheckpointError(f"role {role!r} rank {exc.rank}: {exc.cause}") from None
                raise
        self.algo.load_state_dict(state.get("algorithm") or {})
        if self.data_iter is not None and state.get("data") is not None:
            self.data_iter.load_state_dict(state["data"])
        try:
            rng.set_state(rng_state)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint file {path / 'rng.json'}: {exc}") from None
        return state["step"]

    def _evaluate(self, label: str) -> dict[str, float] | None:
        if not self.eval_records:
            return None
        t0 = time.perf_counter()
        with TRACE.phase("eval"):
            m = self.algo.evaluate(self.eval_records)
        if not m:
            return None
        out = {f"eval/{k}": float(v) for k, v in m.items() if isinstance(v, (int, float))}
        acc = out.get("eval/accuracy")
        acc_s = f"accuracy {acc * 100:.1f}%" if acc is not None else ", ".join(f"{k} {v:.4g}" for k, v in out.items())
        took = time.perf_counter() - t0
        self.say(f"eval {label}: {acc_s} on {len(self.eval_records)} held-out records ({took:.1f}s)")
        return out

    # ------------------------------------------------------------------ main
    def execute(self) -> dict[str, Any]:
        t_start = time.perf_counter()
        failure: BaseException | None = None
        TRACE.start()
        if not self.cfg.run.trace:  # empty, and nothing recorded
            TRACE.stop()
        try:
            return self._execute(t_start)
        except BaseException as exc:
            failure = exc
            if isinstance(exc, LOGGED):  # its traceback to <run_dir>/logs/errors.log, named in its line
                write_error_log(self.run_dir, exc)
            raise
        finally:
            TRACE.stop()
            if failure is not None:  # what ran until the failure, for a look at where it stopped
                self._write_trace()
            try:
                self._shutdown(failure)
            finally:
                self._exit.close()  # the console as it was before the run

    def _execute(self, t_start: float) -> dict[str, Any]:
        self._prepare()
        self._start()
        start = self._restore()
        self._trace_start = start
        total = self.cfg.run.total_steps
        self.progress = Progress(total, desc=self.cfg.run.name, initial=start)
        eval_before = None
        try:
            self.algo.setup()
            if start == 0:
                eval_before = self._evaluate("before")
                if eval_before:
                    self.metrics.log(0, eval_before)
        except Exception as exc:  # noqa: BLE001 - a worker lost before the first step is recovered from too
            start = self._recover(exc)
        self.progress.rewind(start)  # the time left is measured from the first step on
        if start >= total:
            self.say(f"nothing to do: checkpoint step {start} >= run.total_steps {total}")
        if self.data_iter is None and start < total:
            raise ValueError(f"{self.source}: data.train is required to train")
        eval_after = self._train(start)
        return self._finish(start, eval_before, eval_after, t_start)

    def _prepare(self) -> None:
        """Everything before Ray: plugins, run directory, seeds, tokenizer, data, rewards."""
        from rlweave.config.errors import ConfigError, ConfigIssue
        from rlweave.config.gguf import GgufError
        from rlweave.config.gguf_convert import localize_gguf
        from rlweave.config.hub import HubModelError, localize
        from rlweave.config.resolve import resolve_plugins
        from rlweave.config.rundir import record_gguf
        from rlweave.runner.data import DataIterator, open_data

        try:  # hub names -> their snapshot directories in the Hugging Face cache
            self.cfg = localize(self.cfg)[0]
        except HubModelError as exc:
            raise ConfigError([ConfigIssue(self.source, exc.key, str(exc))]) from None
        try:  # GGUF files -> their converted directories (rlweave.config.gguf), once, before any worker
            self.cfg, gguf_models = localize_gguf(self.cfg, say=self.say)
        except GgufError as exc:
            raise ConfigError([ConfigIssue(self.source, exc.key, str(exc))]) from None
        cfg = self.cfg
        self.resolved = resolve_plugins(cfg, source=self.source)
        self.role_names = list(self.resolved.role_names)
        self.trained = _trained_roles(cfg, self.role_names)
        self._prepare_run_dir()
        self.console = self._exit.enter_context(run_console(self.run_dir, os.environ.get(VERBOSE_ENV) == "1"))
        record_gguf(self.run_dir, gguf_models)
        _seed_everything(cfg.run.seed, cfg.run.deterministic)

        self.tokenizer = _load_tokenizer(cfg)
        self.vision = _load_vision(cfg, self.tokenizer)
        self.data_iter = None
        train, evals = open_data(cfg.data, self.tokenizer, self.source)
        if train is not None:
            self.data_iter = DataIterator(train, cfg.data.batch_size, seed=cfg.run.seed, shuffle=cfg.data.shuffle)
        self.eval_records = evals.head(cfg.data.eval_size) if evals is not None else []

        if cfg.rewards:  # before any worker starts: a bad reward fails fast
            from rlweave.rewards import RewardSet

            records = {e.name: r for e, r in zip(cfg.rewards, self.resolved.rewards) if r is not None}
            self.rewards = RewardSet(cfg.rewards, cfg.reward_runtime, plugin_manager=records)

    def _prepare_run_dir(self) -> None:
        """The run directory and its checkpoints; ``self.latest``: the checkpoint to resume from.
        An earlier run is never deleted: :func:`~rlweave.runner.previous_run.claim_run_dir`
        refuses, or (``overwrite``) moves it aside, before anything here is written."""
        from rlweave.runner.previous_run import PYTHON_WORDS, RunDirError, claim_run_dir

        named = self.run_dir == Path(self.cfg.run.output_dir) / self.cfg.run.name
        previous = claim_run_dir(self.run_dir, self.resume, self.overwrite, say=self.say, words=PYTHON_WORDS,
                                 new_run_hint=None if named else (lambda p: f"run_dir={str(p)!r}"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=self.cfg.run.keep_last)
        self.latest = self.ckpt.resumable() if self.resume else None
        if self.resume and self.latest is None and previous.last_checkpoint is not None:
            raise RunDirError(f"nothing to resume: none of the complete checkpoints in {self.ckpt.root} (steps "
                              f"{', '.join(map(str, previous.checkpoints))}) can be loaded; the run there is left as "
                              "it is")

    def _builder_class(self) -> type:
        """The role builder of ``run.scheduler``: Ray's (started or joined here), or the
        in-process one (:mod:`rlweave.scheduler.in_process`; Ray is not imported)."""
        if self.cfg.run.scheduler == "in_process":
            from rlweave.scheduler.in_process import InProcessRoleBuilder

            return InProcessRoleBuilder
        from rlweave.config.placement import required_devices
        from rlweave.scheduler import RoleBuilder, start_ray

        start_ray(self.cfg.ray, required_devices(self.cfg, self.role_names))
        self.ray_started = True
        if Signals.active is not None:
            Signals.active.reinstall()
        return RoleBuilder

    def _start(self) -> None:
        """Ray (unless ``run.scheduler`` is in_process), the roles and the algorithm."""
        from rlweave.interfaces.algorithm import RunContext
        from rlweave.runner.shared_fs import check_shared_run_dir
        from rlweave.scheduler.views import AdaptersDisabled
        from rlweave.weight_sync.service import WeightSync

        cfg, resolved = self.cfg, self.resolved
        builder_cls = self._builder_class()
        self.algo_cls = resolved.algorithm.load()
        self.algo_cfg = resolved.algorithm_config if resolved.algorithm_config is not None else cfg.algorithm
        # optimizer steps of the whole run per trained role: the length of a cosine schedule
        totals = {r: cfg.run.total_steps * self.algo_cls.optimizer_steps_per_step(self.algo_cfg, r)
                  for r in self.role_names if cfg.roles[r].optim is not None}
        self.builder = builder_cls(cfg, {r: resolved.roles[r] for r in self.role_names}, self.role_names,
                                   optimizer_total_steps=totals, kernel_records=resolved.kernels)
        if hasattr(self.builder, "run_dir") and os.environ.get(VERBOSE_ENV) != "1":
            self.builder.run_dir = self.run_dir  # each rank's own output: <run_dir>/logs/<role>-<rank>.log
        self.console.tame()  # progress bars off before the roles load (in this process with in_process)
        self.roles.update(self.builder.build())
        self.console.tame()  # the loggers of what building the roles imported
        self._write_workers()
        check_shared_run_dir(self.run_dir, self.roles)
        for role, source in resolved.views.items():  # e.g. the reference as the policy with adapters off
            self.roles[role] = AdaptersDisabled(self.roles, role, source)
        self.ctx = RunContext(roles=self.roles, tokenizer=self.tokenizer, run_dir=self.run_dir, config=cfg,
                              rewards=self.rewards, seed=cfg.run.seed,
                              weight_sync=WeightSync(self.roles, cfg.weight_sync, folder=self.run_dir / "weight_sync"),
                              next_records=self.data_iter.next_batch if self.data_iter is not None else None,
                              vision=self.vision)
        self.algo = self.algo_cls(self.algo_cfg, self.ctx)

    def _write_workers(self) -> None:
        """``workers.json``: role -> per-rank ``{rank, pid, node_ip, node_id}`` (``node_id`` is Ray's: nodes
        of one machine share an address), ``device`` where the scheduler reports it (in process:
        ``cuda`` or ``cpu``) and ``stack_fd`` where the rank's stacks are read (Ray; ``rlweave
        stacks``), for operators and tests."""
        rows: dict[str, list[dict[str, Any]]] = {}
        from rlweave.scheduler.views import is_view

        for role, handle in self.roles.items():
            if is_view(handle):
                continue
            ranks = list(range(handle.world_size))
            info = handle.submit_ranks("placement", ranks, [((), {})] * len(ranks), list, on_actor=True).result(
                timeout=60)
            rows[role] = [{"rank": r, "pid": i.get("pid"), "node_ip": i.get("node_ip"), "node_id": i.get("node_id"),
                           **({"device": i["device"]} if "device" in i else {}),
                           **({"stack_fd": i["stack_fd"]} if i.get("stack_fd") is not None else {})}
                          for r, i in zip(ranks, info)]
        write_json(self.run_dir / "workers.json", rows)

    def _restore(self) -> int:
        """Load the checkpoint to resume from (or, with ``max_restarts``, write step 0's); the
        algorithm's ``setup`` follows in :meth:`_execute`, where a lost worker is recovered from."""
        start = 0
        if self.latest is not None:
            start = self._load(self.latest)
            self.say(f"resumed from {self.latest} (step {start})")
        self.metrics = MetricsLogger(self.run_dir, start_step=start if self.latest is not None else None,
                                     config=self.cfg)
        if self.latest is None and self.cfg.run.max_restarts > 0 and self.cfg.run.total_steps > 0:
            self._save(0)  # the state a recovery before the first checkpoint goes back to
        return start

    def _train(self, start: int) -> dict[str, float] | None:
        """Steps ``start+1 .. total``; returns the final evaluation. A lost worker is
        recovered from (``run.max_restarts``) by going back to the newest complete checkpoint."""
        cfg = self.cfg
        total = cfg.run.total_steps
        eval_after = None
        step = start + 1
        while step <= total:
            try:
                eval_after = self._step(step) or eval_after
            except Exception as exc:  # noqa: BLE001 - re-raised unless it is a recoverable lost worker
                step = self._recover(exc) + 1
                continue
            step += 1
        self.progress.close()
        self.progress = None
        return eval_after

    def _step(self, step: int) -> dict[str, float] | None:
        """One step with its evaluation, metrics row, status line and checkpoint; returns the
        final evaluation at the last step."""
        cfg = self.cfg
        total = cfg.run.total_steps
        t0 = time.perf_counter()
        TRACE.step = step
        records = self.data_iter.next_batch()
        with TRACE.phase("step", row=STEPS):
            m = dict(self.algo.step([dict(r) for r in records]))
        m["time/step"] = time.perf_counter() - t0
        eval_after = None
        evaluating = step == total or bool(cfg.run.eval_every and step % cfg.run.eval_every == 0)
        saving = step == total or bool(cfg.run.save_every and step % cfg.run.save_every == 0)
        line = None  # the step's line, then its evaluation's
        if step % cfg.run.log_every == 0 or step == total:
            times = _timings(m)
            times.pop("step", None)
            line = format_status(step, total, m, {**times, "total": m["time/step"]}, fields=STATUS_FIELDS,
                                 eta_s=self.progress.eta(step) if step < total else None)
        self.progress.update(step, line)
        if evaluating or saving:  # every update landed, background errors raised, before either
            self.algo.drain()
        if evaluating:
            ev = self._evaluate("after" if step == total else f"at step {step}")
            if ev:
                m.update(ev)
                if step == total:
                    eval_after = ev
        if self.restarts:
            m["restarts"] = float(self.restarts)
        self.metrics.log(step, m)
        if saving:
            self._save(step)
        return eval_after

    def _recover(self, exc: Exception) -> int:
        """Rebuild the roles ``exc`` lost and go back to the newest complete checkpoint;
        returns its step. A worker lost during the recovery itself (while roles are rebuilt,
        the checkpoint loads or the weights are synced again) starts it again, as another
        restart. Re-raises ``exc``, or the recovery's own failure, when it is not a lost worker,
        no restart is left or there is no complete checkpoint."""
        from rlweave.runner.recovery import lost_roles

        while True:
            lost = lost_roles(exc, self.role_names)
            if not lost or self.restarts >= self.cfg.run.max_restarts:
                raise exc
            latest = self.ckpt.resumable()
            if latest is None:
                raise exc
            self.restarts += 1
            why = "; ".join(f"{role}: {reason}" for role, reason in lost.items())
            self.say(f"worker lost ({why}); restart {self.restarts} of {self.cfg.run.max_restarts}: rebuilding "
                     f"{', '.join(lost)} and continuing from {latest.name}")
            try:
                return self._restart(list(lost), latest)
            except Exception as again:  # noqa: BLE001 - recovered from in turn when it is a lost worker
                exc = again

    def _restart(self, lost: list[str], latest: Path) -> int:
        """One recovery (see :meth:`_recover`): the ``lost`` roles rebuilt, the algorithm of the
        failed step retired and a new one loaded from ``latest`` and set up; returns its step."""
        for role in lost:
            self.ctx.weight_sync.forget(role)
            self.roles[role] = self.builder.rebuild(role)
        self._write_workers()
        self._retire_algorithm()
        self.algo = self.algo_cls(self.algo_cfg, self.ctx)
        start = self._load(latest)
        self.metrics.close()
        self.metrics = MetricsLogger(self.run_dir, start_step=start, config=self.cfg)
        self.algo.setup()
        self.progress.rewind(start)
        return start

    def _retire_algorithm(self) -> None:
        """Stop the algorithm of a failed step before a new one takes over: generation it still
        has on a live engine aborted, its background threads, environments and tool workers
        closed. Its errors (calls on the lost ranks) are expected and only logged; the lost
        roles are rebuilt first, so nothing waits on a dead or hung rank."""
        old, self.algo = self.algo, None
        if old is None:
            return
        for what, call in (("draining", lambda: old.drain(abort=True)), ("closing", old.close)):
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - the failed step's own errors
                log.info("recovery: %s the failed step's algorithm: %s: %s", what, type(exc).__name__, exc)

    def _finish(self, start: int, eval_before, eval_after, t_start: float) -> dict[str, Any]:
        """HF export, plot and summary of a run whose steps are done."""
        cfg = self.cfg
        total = cfg.run.total_steps
        hf_path = None
        if cfg.run.save_hf and "policy" in self.roles:
            hf_path = self.run_dir / "hf"
            self.roles["policy"].save_hf(str(hf_path)).result()
            self.tokenizer.save_pretrained(str(hf_path))
            self.say(f"Hugging Face checkpoint: {hf_path}")
        self.metrics.close()
        plot_path = None
        try:
            from rlweave.runner.metrics import read_metrics
            from rlweave.runner.plot import plot_metrics

            rows = read_metrics(self.run_dir / "metrics.jsonl")
            keys = [k for k in PLOT_KEYS if any(k in r for r in rows)]
            if keys:
                plot_path = plot_metrics(self.run_dir / "metrics.jsonl", self.run_dir / "metrics.png", keys,
                                         title=cfg.run.name)
        except Exception as exc:  # noqa: BLE001 - a missing plot must not fail a finished run
            log.warning("could not draw the metrics plot: %s", exc)
        TRACE.stop()
        trace_path, timeline_path = self._write_trace()
        if timeline_path is not None:
            self.say(f"timeline: {timeline_path} (trace for ui.perfetto.dev: {trace_path})")
        if self.console.filter.hidden:
            self.say(f"{self.console.filter.hidden} warning(s) of other libraries: {self.console.log_file}")
        summary = {
            "run_dir": str(self.run_dir),
            "steps": total,
            "resumed_from": start if self.latest is not None else None,
            "restarts": self.restarts,
            "eval_before": eval_before,
            "eval_after": eval_after,
            "hf_path": str(hf_path) if hf_path else None,
            "metrics_path": str(self.run_dir / "metrics.jsonl"),
            "plot_path": str(plot_path) if plot_path else None,
            "trace_path": str(trace_path) if trace_path else None,
            "timeline_path": str(timeline_path) if timeline_path else None,
            "wall_s": round(time.perf_counter() - t_start, 2),
        }
        write_json(self.run_dir / "summary.json", summary)
        return summary

    def _write_trace(self) -> tuple[Path | None, Path | None]:
        """``trace.json`` (Chrome/Perfetto) and ``timeline.png`` of what the run recorded
        (:mod:`rlweave.scheduler.trace`); a run resumed from step N writes
        ``trace.from-step-N.json`` and ``timeline.from-step-N.png``, leaving the earlier ones.
        Never raises (a missing picture must not fail a run)."""
        run_dir = getattr(self, "run_dir", None)
        if run_dir is None or not TRACE.spans():
            return None, None
        start = getattr(self, "_trace_start", 0)
        suffix = f".from-step-{start}" if start else ""
        trace_path = timeline_path = None
        try:
            trace_path = TRACE.write(run_dir / f"trace{suffix}.json")
            from rlweave.runner.timeline import draw_timeline

            timeline_path = draw_timeline(TRACE.spans(), run_dir / f"timeline{suffix}.png", title=self.cfg.run.name)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not write the run's timeline: %s", exc)
        return trace_path, timeline_path

    def _shutdown(self, failure: BaseException | None = None) -> None:
        """Stop rewards, roles and Ray; never raises (the original error wins). Roles that
        ``failure`` lost (dead or hung ranks) are ended at once: they would not answer; with
        none lost the algorithm is drained first (generation in flight aborted)."""
        if failure is not None and self.roles:
            from rlweave.runner.recovery import lost_roles

            lost = lost_roles(failure, list(self.roles))
            for role in lost:
                try:
                    self.roles[role].kill()
                except Exception as exc:  # noqa: BLE001
                    log.warning("shutdown of role %s: %s", role, exc)
            if not lost and self.algo is not None:
                try:
                    self.algo.drain(abort=True)
                except Exception as exc:  # noqa: BLE001 - the run's own error is the one reported
                    log.warning("shutdown: draining the algorithm: %s", exc)
        for closer in (
            lambda: self.algo.close() if self.algo is not None else None,
            lambda: self.ctx.weight_sync.close() if self.ctx is not None else None,
            lambda: self.progress.close() if self.progress is not None else None,
            lambda: self.metrics.close(failed=failure is not None) if self.metrics is not None else None,
            lambda: self.rewards.close() if self.rewards is not None else None,
        ):
            try:
                closer()
            except Exception as exc:  # noqa: BLE001
                log.warning("shutdown: %s", exc)
        for name, handle in reversed(list(self.roles.items())):
            try:
                handle.shutdown()
            except Exception as exc:  # noqa: BLE001
                log.warning("shutdown of role %s: %s", name, exc)
        if self.builder is not None:
            try:
                self.builder.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("shutdown of the placement groups: %s", exc)
        if self.ray_started:
            try:
                from rlweave.scheduler import shutdown_ray

                shutdown_ray()
            except Exception as exc:  # noqa: BLE001
                log.warning("shutdown of Ray: %s", exc)
