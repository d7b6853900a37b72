"""Chaos runs: ``rlweave train`` in a subprocess whose processes are SIGKILLed at random moments.

A :class:`Plan` (drawn from a seed by :func:`plan`) lists kills, each of a *target*:

* ``rollout`` / ``policy``: a rank of that role (its Ray actor's process, from ``workers.json``);
  the run recovers through ``run.max_restarts``;
* ``reward``: one of the controller's reward worker processes; the reward pool replaces it (the
  call it ran, if any, scores ``reward_runtime.failure_reward``);
* ``controller``: the ``rlweave train`` process itself; :func:`run_with_kills` then starts
  ``rlweave train --resume`` on the same run directory.

When kills happen (the contract of :func:`run_with_kills`): a kill in the *step window* is armed
once the current controller process has logged two steps after the previous kill (after its start
for the first kill; after a rank kill, counted from when ``workers.json`` lists the rebuilt rank),
so it never lands before a process's first steps nor while a recovery is still under way. It fires
``fraction x 2 x period`` seconds later, where ``fraction`` in [0, 1) comes from the seed and
``period`` is the wall time between the last two logged steps: anywhere in the next step or two,
whatever phase that is (generation, rewards, training, weight sync, the checkpoint save). A kill
*in recovery* (``Kill.in_recovery``: one that follows a rank kill, drawn with probability
``in_recovery`` by :func:`plan`) is armed by the run's next ``worker lost`` line instead and fires
``fraction x`` :data:`RECOVERY_WINDOW_S` seconds later: while the lost role is rebuilt, the
checkpoint loads or the weights are synced again (or in the first step after, when the recovery
was quicker). A rank kill aimed at a role whose new rank is not listed yet waits for it. A kill due
once the run has logged its last step is not made (HF export and shutdown are not in the window)
and is reported as such. The seed fixes the targets, the ranks, the windows and the fractions; the
moments follow the run's own timing, so a replay (same seed) hits the same targets in the same
order at similar, not identical, points.

After the run, :func:`exactly_once`, :func:`staleness_violations` and :func:`damaged_checkpoints`
check what a chaos run must keep: every drawn prompt trained exactly once, the staleness bound,
checkpoints that verify. :func:`run_with_kills` itself checks that no process of a killed
controller, nor of the whole run, outlives it.

Stdlib and psutil only; nothing here imports torch or Ray.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlweave.testing.runs import RLWEAVE, alive, descendants, kill, metrics_rows, workers

#: replays a chaos test's schedule (tests read it; ``bench/reliability.py --chaos --seed`` sets it)
SEED_ENV = "RLWEAVE_CHAOS_SEED"
TARGETS = ("rollout", "policy", "reward", "controller")
#: targets the run recovers from through ``run.max_restarts`` (a restart each)
RESTARTED = ("rollout", "policy")
#: a kill made during a recovery fires within this many seconds of the recovery's start
RECOVERY_WINDOW_S = 3.0
#: seconds a killed controller's processes (Ray's among them) get to end on their own
CONTROLLER_GRACE_S = 15.0
#: Ray's agents of a node whose raylet died without a SIGTERM report that to the GCS (gone with the
#: controller) with a fixed 60 s timeout before they exit (``ray._private.process_watcher``)
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
RAY_AGENT_GRACE_S = 75.0


@dataclass(frozen=True)
class Kill:
    """One planned kill: ``target`` (see :data:`TARGETS`), ``pick`` in [0, 1) choosing the rank or
    reward worker among those alive, ``fraction`` in [0, 1) of the wait once armed, and whether it
    is made during the previous kill's recovery (``in_recovery``; see the module docstring)."""

    target: str
    pick: float
    fraction: float
    in_recovery: bool = False

    def __str__(self) -> str:
        where = ", in recovery" if self.in_recovery else ""
        return f"{self.target}(pick {self.pick:.2f}, at {self.fraction:.2f}{where})"


@dataclass(frozen=True)
class Plan:
    """The kills of one chaos run, in order, and the seed they were drawn from."""

    seed: int
    kills: tuple[Kill, ...]

    def __str__(self) -> str:
        return f"seed {self.seed}: " + ", ".join(map(str, self.kills))

    def count(self, *targets: str) -> int:
        """How many kills aim at one of ``targets``."""
        return sum(k.target in targets for k in self.kills)


def plan(seed: int, kills: int, targets: tuple[str, ...] = TARGETS, in_recovery: float = 0.3) -> Plan:
    """``kills`` kills drawn from ``random.Random(seed)``: the targets go through a shuffled
    ``targets`` first (so up to ``len(targets)`` kills hit as many different targets), then are
    drawn one by one; each kill draws its ``pick`` and ``fraction``, and one that follows a rank
    kill is made while that recovery is under way with probability ``in_recovery``."""
    rng = random.Random(seed)
    order = list(targets)
    rng.shuffle(order)
    out: list[Kill] = []
    for i in range(kills):
        target = order[i] if i < len(order) else rng.choice(targets)
        pick, fraction, window = rng.random(), rng.random(), rng.random()
        out.append(Kill(target, pick, fraction, bool(out) and out[-1].target in RESTARTED and window < in_recovery))
    return Plan(seed, tuple(out))


def seed_from_env(default: int | None = None) -> int:
    """The seed in :data:`SEED_ENV`, else ``default``, else a fresh random one."""
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        return int(text)
    return default if default is not None else random.SystemRandom().randrange(1, 2**31)


@dataclass
class Made:
    """A kill that was made: its plan entry, the pid killed, the newest step the run had logged,
    the seconds it waited once armed and when it was made."""

    kill: Kill
    pid: int
    logged_step: int
    waited_s: float
    at_s: float  #: seconds since the chaos run started

    def __str__(self) -> str:
        return (f"{self.kill.target} pid {self.pid} after step {self.logged_step} (+{self.waited_s:.2f} s; "
                f"at {self.at_s:.1f} s)")


@dataclass
class ChaosResult:
    """What :func:`run_with_kills` saw: the kills made (in order), the ones not made (the run ended
    first), ``restarts`` (the runs' ``worker lost`` lines), ``resumes`` (``--resume`` starts),
    the steps each process or recovery went on from (``continued_from``), every invocation's exit
    code and output, the processes left by killed controllers (``controller_leftovers``, killed)
    and at the end (``leftovers``, killed), Ray's agents not waited for (``ray_agents_ended``, see
    :func:`run_with_kills`), and the wall time."""

    plan: Plan
    made: list[Made] = field(default_factory=list)
    not_made: list[Kill] = field(default_factory=list)
    restarts: int = 0
    resumes: int = 0
    continued_from: list[int] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    controller_leftovers: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    ray_agents_ended: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    events: list[str] = field(default_factory=list)  #: what happened when (seconds since the start)

    def story(self) -> str:
        """The plan and what happened, for test output and failure messages (replay: set
        :data:`SEED_ENV` to the seed)."""
        lines = [f"chaos plan {self.plan} (replay: {SEED_ENV}={self.plan.seed})"]
        lines += [f"  kill {i + 1}: {m}" for i, m in enumerate(self.made)]
        lines += [f"  not made (the run ended first): {k}" for k in self.not_made]
        lines += [f"  {e}" for e in self.events]
        if self.ray_agents_ended:
            lines.append(f"  Ray agents of killed controllers ended here, not waited for: {len(self.ray_agents_ended)}")
        lines.append(f"  restarts {self.restarts}, resumes {self.resumes}, continued from steps "
                     f"{self.continued_from}, exit codes {self.exit_codes}, {self.wall_s:.0f} s")
        return "\n".join(lines)


def _describe(pid: int) -> str:
    import psutil

    try:
        p = psutil.Process(pid)
        return f"pid {pid} {p.name()!r}: {' '.join(p.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {pid}"


def reward_workers(controller: int) -> list[int]:
    """pids of the reward worker processes of the controller ``controller`` (its children started
    by multiprocessing's spawn method), sorted."""
    import psutil

    out = []
    try:
        children = psutil.Process(controller).children()
    except psutil.Error:
        return []
    for p in children:
        try:
            if "multiprocessing.spawn" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            pass
    return sorted(out)


def _victim(kill_: Kill, controller: int, run_dir: Path) -> int | None:
    """The pid ``kill_`` is aimed at, or None when there is none right now; never a process that
    is not the controller or one of its descendants."""
    if kill_.target == "controller":
        return controller
    if kill_.target == "reward":
        pids = reward_workers(controller)
    else:
        pids = [r.get("pid") for r in workers(run_dir).get(kill_.target, [])]
    pids = [p for p in pids if p]
    if not pids:
        return None
    pid = pids[int(kill_.pick * len(pids))]
    return pid if pid in descendants(controller) and alive({pid}) else None


def _rows_since(run_dir: Path, since: float) -> list[dict]:
    return [r for r in metrics_rows(run_dir) if r.get("step", 0) >= 1 and r.get("time", 0) > since]


def _period(rows: list[dict]) -> float:
    """Wall seconds of one step: between the last two rows."""
    return max(0.05, rows[-1]["time"] - rows[-2]["time"])


_CONTINUED = (re.compile(r"worker lost \(.*continuing from step_(\d+)"), re.compile(r"resumed from .*\(step (\d+)\)"))


def run_with_kills(config: str | os.PathLike[str], run_dir: str | os.PathLike[str], chaos: Plan, total_steps: int,
                   env: dict[str, str], cwd: str | os.PathLike[str] | None = None, timeout: float = 600,
                   log: Any = None, wait_for_ray_agents: bool = True) -> ChaosResult:
    """Train ``config`` into ``run_dir`` (``rlweave train CONFIG --run-dir RUN_DIR``), making the
    kills of ``chaos`` as the module docstring says, and after each controller kill start
    ``rlweave train CONFIG --resume --run-dir RUN_DIR``, until an invocation exits.

    Returns when one exits on its own (0 or not: the caller checks ``exit_codes``). The processes
    of a killed controller must end within :data:`CONTROLLER_GRACE_S`, Ray's agents among them
    within :data:`RAY_AGENT_GRACE_S` (checked at the end, the resumed run going on meanwhile);
    those left are killed and listed in ``controller_leftovers``. With ``wait_for_ray_agents``
    False the agents are not waited for: those still alive at the end are killed and listed in
    ``ray_agents_ended`` (a shorter run that checks everything else). The processes of the whole run
    must end within 10 s of its end (``leftovers``, killed too). ``log(line)`` (default: print)
    reports each kill as it is made. Raises ``AssertionError`` (after killing everything it
    started) past ``timeout`` seconds in all."""
    run_dir = Path(run_dir)
    say = log or (lambda line: print(line, flush=True))
    result = ChaosResult(chaos)
    pending = list(chaos.kills)
    seen_all: set[int] = set()
    agents_until: list[tuple[float, set[int]]] = []
    t_start = time.monotonic()
    deadline = t_start + timeout
    invocation = 0

    def note(what: str) -> None:
        result.events.append(f"{time.monotonic() - t_start:6.1f} s {what}")

    while True:
        args = ["train", str(config), "--run-dir", str(run_dir)] + (["--resume"] if invocation else [])
        out_path = run_dir.parent / f"{run_dir.name}.chaos-{invocation}.log"
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(RLWEAVE + args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        note(f"rlweave {' '.join(args[:1] + args[3:])} (pid {proc.pid})")
        seen: set[int] = set()
        # how the next kill arms: ("steps", since) two steps logged after `since`; ("recovery", n) the
        # run's n+1-th "worker lost" line; None: armed, it fires at fire_at
        arm: tuple[str, float] | None = ("steps", time.time())
        gate: tuple[str, int] | None = None  # (role, pid) killed: no step-window kill until it is rebuilt
        fire_at = delay = 0.0
        killed_controller = False
        try:
            while proc.poll() is None:
                seen |= descendants(proc.pid)
                if time.monotonic() > deadline:
                    raise AssertionError(f"the chaos run did not finish within {timeout:.0f} s\n{result.story()}")
                if gate is not None and gate[1] not in [r.get("pid") for r in workers(run_dir).get(gate[0], [])]:
                    note(f"{gate[0]} rebuilt")
                    gate = None
                    if arm is not None and arm[0] == "steps":
                        arm = ("steps", time.time())
                if pending and arm is not None:
                    if arm[0] == "steps" and gate is None:
                        rows = _rows_since(run_dir, arm[1])
                        if len(rows) >= 2:
                            delay = pending[0].fraction * 2 * _period(rows)
                            note(f"kill {len(result.made) + 1} armed after step {rows[-1]['step']}, fires in "
                                 f"{delay:.2f} s")
                            fire_at, arm = time.time() + delay, None
                    elif arm[0] == "recovery" and _lost_lines(out_path) > arm[1]:
                        delay = pending[0].fraction * RECOVERY_WINDOW_S
                        note(f"kill {len(result.made) + 1} armed by the recovery, fires in {delay:.2f} s")
                        fire_at, arm = time.time() + delay, None
                if pending and arm is None and time.time() >= fire_at:
                    logged = max((r["step"] for r in metrics_rows(run_dir)), default=0)
                    if logged >= total_steps:  # the run is past its last step: no kill window left
                        result.not_made += pending
                        pending = []
                    else:
                        pid = _victim(pending[0], proc.pid, run_dir)
                        if pid is not None:
                            os.kill(pid, signal.SIGKILL)
                            k = pending.pop(0)
                            result.made.append(Made(k, pid, logged, delay, time.monotonic() - t_start))
                            say(f"chaos kill {len(result.made)}/{len(chaos.kills)}: {result.made[-1]}")
                            note(f"kill {len(result.made)}: {result.made[-1]}")
                            if k.target == "controller":
                                killed_controller = True
                                break
                            if k.target in RESTARTED:
                                gate = (k.target, pid)
                            if pending and pending[0].in_recovery and k.target in RESTARTED:
                                arm = ("recovery", _lost_lines(out_path))
                            else:
                                arm = ("steps", time.time())
                time.sleep(0.05)
            rc = proc.wait(timeout=60)
        except BaseException:
            kill(seen | {proc.pid})
            proc.wait(timeout=30)
            raise
        seen_all |= seen
        result.exit_codes.append(rc)
        note(f"exit code {rc}")
        text = out_path.read_text(encoding="utf-8", errors="replace")
        result.outputs.append(text)
        out_path.unlink(missing_ok=True)
        result.restarts += sum("worker lost (" in line for line in text.splitlines())
        for line in text.splitlines():
            for pattern in _CONTINUED:
                m = pattern.search(line)
                if m:
                    result.continued_from.append(int(m.group(1)))
        if not killed_controller:
            break
        agents = _ray_agents(seen)  # checked at the end, by their own deadline (they take 60 s)
        agents_until.append((time.monotonic() + RAY_AGENT_GRACE_S, agents))
        left = _wait_gone(seen - agents, CONTROLLER_GRACE_S)
        result.controller_leftovers += [_describe(p) for p in left]
        kill(left)
        result.resumes += 1
        invocation += 1
    result.not_made += pending
    for until, agents in agents_until:
        left = _wait_gone(agents, until - time.monotonic() if wait_for_ray_agents else 0.0)
        (result.controller_leftovers if wait_for_ray_agents else result.ray_agents_ended).extend(map(_describe, left))
        kill(left)
        seen_all -= agents
    if agents_until:
        note("Ray's agents of killed controllers gone" + ("" if wait_for_ray_agents else " (ended here)"))
    left = _wait_gone(seen_all, 10.0)
    result.leftovers = [_describe(p) for p in left]
    kill(left)
    result.wall_s = time.monotonic() - t_start
    return result


def _lost_lines(out_path: Path) -> int:
    try:
        return out_path.read_text(encoding="utf-8", errors="replace").count("worker lost (")
    except OSError:
        return 0


def _ray_agents(pids: set[int]) -> set[int]:
    import psutil

    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).name() in RAY_AGENTS:
                out.add(pid)
        except psutil.Error:
            pass
    return out


def _wait_gone(pids: set[int], grace_s: float) -> set[int]:
    end = time.monotonic() + grace_s
    left = alive(pids)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = alive(left)
    return left


# ----------------------------------------------------------------------------- checks after a run
def queued_ids(pipeline: dict) -> list[str]:
    """Ids of the records a checkpoint's pipeline state holds drawn but not trained: a rollout
    queue's groups (``groups[].record``) or an episode pipeline's record batches (``records``)."""
    ids = [g["record"]["id"] for g in pipeline.get("groups", [])]
    ids += [r["id"] for batch in pipeline.get("records", []) for r in batch]
    return ids


def drawn_records(train: str | os.PathLike[str], data_state: dict) -> list[tuple[int, str]]:
    """``(epoch, id)`` of every record the data iterator handed out up to ``data_state``, in order
    (the order rebuilt from its seed)."""
    from rlweave.data.records import load_records
    from rlweave.runner.data import DataIterator

    it = DataIterator(load_records(Path(train)), 1, seed=data_state["seed"], shuffle=data_state["shuffle"])
    out = []
    for _ in range(data_state["epoch"] * data_state["size"] + data_state["position"]):
        record = it.next_batch()[0]
        out.append((it.epoch, record["id"]))
    return out


def drawn_ids(train: str | os.PathLike[str], data_state: dict) -> list[str]:
    """Ids of the records the data iterator handed out up to ``data_state`` (first epoch only)."""
    if data_state["epoch"] != 0:
        raise ValueError(f"expected the run to stay in its first epoch, got {data_state}")
    return [i for _, i in drawn_records(train, data_state)]


@dataclass(frozen=True)
class Trained:
    """Prompts as a final checkpoint accounts for them, each as ``(epoch, id)``: ``drawn`` from
    the data, ``queued`` (drawn, not trained: the newest draws of the ids its queue holds),
    ``trained`` (prompt -> times), ``expected`` (the steps' prompts), with the algorithm's
    ``steps_done`` and ``samples_seen``."""

    drawn: list[tuple[int, str]]
    queued: list[tuple[int, str]]
    strays: list[str]  #: ids queued but never drawn (an impossible state)
    trained: Counter
    expected: int
    steps_done: int
    samples_seen: int

    @property
    def twice(self) -> list[tuple[int, str]]:
        """Prompts trained more than once in their epoch."""
        return sorted(k for k, n in self.trained.items() if n > 1)

    @property
    def lost(self) -> int:
        """Prompts of the steps not accounted for (expected minus trained)."""
        return max(0, self.expected - sum(self.trained.values()))


def exactly_once(run_dir: str | os.PathLike[str], train: str | os.PathLike[str], steps: int,
                 prompts: int) -> Trained:
    """What the final checkpoint (``step_<steps>``) of ``run_dir`` says was trained, with the data
    order rebuilt from its saved seed: every drawn record is trained or queued, never both, and
    ``steps x prompts`` were trained, each once in its epoch, when nothing was lost or trained twice."""
    state = json.loads((Path(run_dir) / "checkpoints" / f"step_{steps:06d}" / "state.json").read_text())
    algo = state["algorithm"]
    drawn = drawn_records(train, state["data"])
    left = list(drawn)
    queued, strays = [], []
    for rid in queued_ids(algo.get("pipeline") or {}):
        at = next((n for n in range(len(left) - 1, -1, -1) if left[n][1] == rid), None)
        if at is None:
            strays.append(rid)
        else:
            queued.append(left.pop(at))
    return Trained(drawn, queued, sorted(strays), Counter(left), steps * prompts, algo.get("steps_done", -1),
                   algo.get("samples_seen", -1))


def staleness_violations(run_dir: str | os.PathLike[str], bound: int) -> list[tuple[int, float]]:
    """``(step, staleness/max)`` of every logged step past ``bound`` (a step without the metric
    counts as 0: it trained on its own version)."""
    return [(r["step"], r.get("staleness/max") or 0.0) for r in metrics_rows(run_dir)
            if r.get("step", 0) >= 1 and (r.get("staleness/max") or 0.0) > bound]


def damaged_checkpoints(run_dir: str | os.PathLike[str]) -> list[str]:
    """Problems of the run's checkpoints: any that does not verify (checksums) or whose
    ``state.json`` / ``rng.json`` does not read, and any incomplete one (``.tmp-``, ``.trash-``,
    ``step_*`` without a marker) left behind."""
    from rlweave.runner.checkpoint import CheckpointManager, complete_checkpoints, read_state_json

    root = Path(run_dir) / "checkpoints"
    out = []
    done = complete_checkpoints(root)
    if not done:
        out.append(f"no complete checkpoint in {root}")
    for _, path in done:
        out += [f"{path.name}: {p}" for p in CheckpointManager.verify(path)]
        for name in ("state.json", "rng.json"):
            try:
                read_state_json(path / name)
            except Exception as exc:  # noqa: BLE001 - reported
                out.append(f"{path.name}/{name}: {exc}")
    complete = {p.name for _, p in done}
    out += [f"incomplete checkpoint left: {p.name}" for p in root.iterdir() if p.is_dir() and p.name not in complete]
    return out


#: a multi-turn environment module for test runs (write it where the run imports from): ``Echo``
#: answers "1" to every model turn; its episodes end at ``max_turns``
ECHO_ENV = '''
from rlweave.interfaces.environment import Environment, EnvStep


class Echo(Environment):
    """Answers "1" to every model turn; the episode ends at max_turns."""

    def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        return EnvStep(messages=[{"role": "tool", "content": "1"}])
'''
