"""The run loop behind ``rlweave train``: one validated config in, one finished run out.

Order of work (see :func:`run`)::

    resolve plugins -> run dir, seeds, tokenizer, data -> start Ray -> build the roles the
    algorithm asks for -> rewards -> algorithm(config, ctx) -> [resume: load the latest
    complete checkpoint] -> setup -> eval before -> steps (status line, metrics,
    checkpoints, periodic eval) -> eval after -> final checkpoint + HF export -> plot
    -> shut everything down (also on errors and SIGTERM)

Checkpoints (``<run_dir>/checkpoints/step_XXXXXX``, atomic via
:class:`~rlweave.runner.checkpoint.CheckpointManager`) hold every trained role's own
checkpoint (model, optimizer, LR schedule, worker RNG) in ``roles/<role>/`` plus
``state.json`` (step, algorithm state, data position) and ``rng.pkl`` (controller RNGs).
``resume=True`` continues from the newest complete one; a run killed mid-save loses at most
the steps since the previous one.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from rlweave.config.schema import RunConfig
from rlweave.runner.checkpoint import CheckpointManager, read_json, write_json

log = logging.getLogger("rlweave.runner")

#: status line: (label, metrics key)
STATUS_FIELDS = (
    ("reward", "reward/mean"),
    ("acc", "eval/accuracy"),
    ("kl", "kl"),
    ("loss", "loss"),
    ("len", "response_len/mean"),
)
#: seconds to wait before publishing a checkpoint (tests kill the run inside this window)
CHECKPOINT_DELAY_ENV = "RLWEAVE_CHECKPOINT_DELAY_S"
#: panels of the PNG plot, when present in the metrics
PLOT_KEYS = ("reward/mean", "eval/accuracy", "loss", "kl", "response_len/mean", "entropy")


class RunInterrupted(RuntimeError):
    """The run got SIGTERM/SIGINT (``signum``); everything is shut down as this propagates."""

    def __init__(self, message: str, signum: int = 0):
        super().__init__(message)
        self.signum = signum


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


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


def _trained_roles(cfg: RunConfig, roles: list[str]) -> list[str]:
    """Roles with their own checkpoints: training backends with an optimizer."""
    return [r for r in roles if r != "rollout" and cfg.roles[r].backend is not None and cfg.roles[r].optim is not None]


def _timings(metrics: dict[str, Any]) -> dict[str, float]:
    return {k.split("/", 1)[1]: float(v) for k, v in metrics.items()
            if k.startswith("time/") and isinstance(v, (int, float))}


class _Signals:
    """Turn SIGTERM (and SIGINT) into an exception so the ``finally`` clean-up runs.

    ``ray.init`` installs its own SIGTERM handler in the driver, so the run calls
    :meth:`reinstall` once Ray is up."""

    active: "_Signals | None" = None

    def __init__(self) -> None:
        self.old: dict[int, Any] = {}

    @staticmethod
    def _handler(signum, frame):  # noqa: ARG004
        raise RunInterrupted(f"received signal {signal.Signals(signum).name}; shutting down", signum)

    def __enter__(self) -> "_Signals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave signals alone
                pass
        _Signals.active = self
        return self

    def reinstall(self) -> None:
        """Take SIGTERM/SIGINT back from whatever replaced our handler (Ray does)."""
        for sig in self.old:
            signal.signal(sig, self._handler)

    def __exit__(self, *exc: object) -> None:
        _Signals.active = None
        for sig, old in self.old.items():
            signal.signal(sig, old)


def run(cfg: RunConfig, config_path: str | os.PathLike[str] | None = None,
        run_dir: str | os.PathLike[str] | None = None, resume: bool = False) -> dict[str, Any]:
    """Run the training described by ``cfg`` (already validated, both passes).

    Args:
        cfg: the run config.
        config_path: the YAML it came from (shown in messages; may be None).
        run_dir: where everything goes (default ``<run.output_dir>/<run.name>``).
        resume: continue from the newest complete checkpoint in ``run_dir`` (a fresh start
            when there is none).

    Returns a summary: ``run_dir``, ``steps``, ``resumed_from``, ``eval_before``,
    ``eval_after`` (metric dicts or None), ``hf_path``, ``metrics_path``, ``plot_path``,
    ``wall_s``; the same is written to ``<run_dir>/summary.json``.
    """
    with _Signals():
        return _Run(cfg, config_path, run_dir, resume).execute()


class _Run:
    def __init__(self, cfg: RunConfig, config_path, run_dir, resume: bool):
        self.cfg = cfg
        self.source = str(config_path) if config_path else "<config>"
        self.run_dir = Path(run_dir) if run_dir else Path(cfg.run.output_dir) / cfg.run.name
        self.resume = resume
        self.roles: dict[str, Any] = {}
        self.rewards = None
        self.metrics = None
        self.progress = None
        self.ray_started = False

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
        with open(tmp / "rng.pkl", "wb") as f:
            pickle.dump(_rng_state(), f)
        delay = float(os.environ.get(CHECKPOINT_DELAY_ENV, "0") or 0)
        if delay > 0:  # fault injection for tests: a window in which the save is half done
            time.sleep(delay)
        path = self.ckpt.commit(tmp, step)
        self.say(f"checkpoint: {path}")
        return path

    def _load(self, path: Path) -> int:
        state = read_json(path / "state.json")
        missing = [r for r in self.trained if not (path / "roles" / r).is_dir()]
        if missing:
            raise RuntimeError(f"checkpoint {path} has no state for role(s) {', '.join(missing)}")
        futs = [self.roles[r].load_checkpoint(str(path / "roles" / r)) for r in self.trained]
        for f in futs:
            f.result()
        self.algo.load_state_dict(state.get("algorithm") or {})
        if self.data_iter is not None and state.get("data") is not None:
            self.data_iter.load_state_dict(state["data"])
        with open(path / "rng.pkl", "rb") as f:
            _set_rng_state(pickle.load(f))
        return int(state["step"])

    def _evaluate(self, label: str) -> dict[str, float] | None:
        if not self.eval_records:
            return None
        t0 = time.perf_counter()
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
        try:
            return self._execute(t_start)
        finally:
            self._shutdown()

    def _execute(self, t_start: float) -> dict[str, Any]:
        from rlweave.config.resolve import resolve_plugins
        from rlweave.interfaces.algorithm import RunContext
        from rlweave.runner.data import DataIterator, JsonlDataset
        from rlweave.runner.metrics import MetricsLogger
        from rlweave.runner.progress import Progress, format_status

        cfg = self.cfg
        resolved = resolve_plugins(cfg, source=self.source)
        role_names = list(resolved.role_names)
        self.trained = _trained_roles(cfg, role_names)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg.run.keep_last)
        latest = self.ckpt.latest() if self.resume else None
        if self.resume and latest is None:
            log.warning("--resume: no complete checkpoint in %s; starting from step 0", self.ckpt.root)
        if latest is None:  # a fresh start: outputs of an earlier run in this directory go
            stale = [p for p in (self.run_dir / "metrics.jsonl", self.run_dir / "tensorboard", self.run_dir / "hf",
                                 self.run_dir / "summary.json") if p.exists()] + [p for _, p in self.ckpt.complete()]
            if stale:
                log.warning("fresh run in %s: removing outputs of an earlier run (use --resume to continue it)",
                            self.run_dir)
            for p in stale:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        _seed_everything(cfg.run.seed)

        tokenizer = _load_tokenizer(cfg)
        self.data_iter = None
        if cfg.data.train:
            train = JsonlDataset(cfg.data.train)
            self.data_iter = DataIterator(train, cfg.data.batch_size, seed=cfg.run.seed, shuffle=cfg.data.shuffle)
        self.eval_records = JsonlDataset(cfg.data.eval).head(cfg.data.eval_size) if cfg.data.eval else []

        if cfg.rewards:  # before any worker starts: a bad reward fails fast
            from rlweave.rewards import RewardSet

            records = {e.name: r for e, r in zip(cfg.rewards, resolved.rewards) if r is not None}
            self.rewards = RewardSet(cfg.rewards, cfg.reward_runtime, plugin_manager=records)

        from rlweave.config.placement import required_devices
        from rlweave.scheduler import build_roles, start_ray

        start_ray(cfg.ray, required_devices(cfg, role_names))
        self.ray_started = True
        if _Signals.active is not None:
            _Signals.active.reinstall()
        algo_cls = resolved.algorithm.load()
        algo_cfg = resolved.algorithm_config if resolved.algorithm_config is not None else cfg.algorithm
        # optimizer steps of the whole run per trained role: the length of a cosine schedule
        totals = {r: cfg.run.total_steps * algo_cls.optimizer_steps_per_step(algo_cfg, r)
                  for r in role_names if cfg.roles[r].optim is not None}
        self.roles = build_roles(cfg, {r: resolved.roles[r] for r in role_names}, role_names,
                                 optimizer_total_steps=totals)

        ctx = RunContext(roles=self.roles, tokenizer=tokenizer, run_dir=self.run_dir, config=cfg,
                         rewards=self.rewards, seed=cfg.run.seed)
        if self.data_iter is not None:
            ctx.extra["next_records"] = self.data_iter.next_batch
        self.algo = algo_cls(algo_cfg, ctx)

        start = 0
        if latest is not None:
            start = self._load(latest)
            self.say(f"resumed from {latest} (step {start})")
        self.algo.setup()

        total = cfg.run.total_steps
        self.metrics = MetricsLogger(self.run_dir, start_step=start if latest is not None else None)
        self.progress = Progress(total, desc=cfg.run.name, initial=start)
        eval_before = None
        if start == 0:
            eval_before = self._evaluate("before")
            if eval_before:
                self.metrics.log(0, eval_before)
        if start >= total:
            self.say(f"nothing to do: checkpoint step {start} >= run.total_steps {total}")
        if self.data_iter is None and start < total:
            raise ValueError(f"{self.source}: data.train is required to train")

        eval_after = None
        last_saved = start if latest is not None else -1
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            records = self.data_iter.next_batch()
            m = dict(self.algo.step([dict(r) for r in records]))
            m["time/step"] = time.perf_counter() - t0
            if step == total or (cfg.run.eval_every and step % cfg.run.eval_every == 0):
                ev = self._evaluate("after" if step == total else f"at step {step}")
                if ev:
                    m.update(ev)
                    if step == total:
                        eval_after = ev
            self.metrics.log(step, m)
            line = None
            if step % cfg.run.log_every == 0 or step == total:
                times = _timings(m)
                times.pop("step", None)
                line = format_status(step, total, m, {**times, "total": m["time/step"]}, fields=STATUS_FIELDS)
            self.progress.update(step, line)
            if cfg.run.save_every and step % cfg.run.save_every == 0:
                self._save(step)
                last_saved = step
        self.progress.close()
        self.progress = None

        if total > start and last_saved != total:
            self._save(total)
        hf_path = None
        if cfg.run.save_hf and "policy" in self.roles:
            hf_path = self.run_dir / "hf"
            self.roles["policy"].save_hf(str(hf_path)).result()
            tokenizer.save_pretrained(str(hf_path))
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
        summary = {
            "run_dir": str(self.run_dir),
            "steps": total,
            "resumed_from": start if latest is not None else None,
            "eval_before": eval_before,
            "eval_after": eval_after,
            "hf_path": str(hf_path) if hf_path else None,
            "metrics_path": str(self.run_dir / "metrics.jsonl"),
            "plot_path": str(plot_path) if plot_path else None,
            "wall_s": round(time.perf_counter() - t_start, 2),
        }
        write_json(self.run_dir / "summary.json", summary)
        return summary

    def _shutdown(self) -> None:
        """Stop rewards, roles and Ray; never raises (the original error wins)."""
        for closer in (
            lambda: self.progress.close() if self.progress is not None else None,
            lambda: self.metrics.close() if self.metrics is not None else None,
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
        if self.ray_started:
            try:
                from rlweave.scheduler import shutdown_ray

                shutdown_ray()
            except Exception as exc:  # noqa: BLE001
                log.warning("shutdown of Ray: %s", exc)
