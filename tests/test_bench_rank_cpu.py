"""bench/rank_cpu.py: a role's on-CPU seconds per step, read from real processes between two step
counts of a run directory laid out as ``rlweave train`` writes it (``workers.json``, ``metrics.jsonl``)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_rank_cpu_t", ROOT / "bench" / "rank_cpu.py")
rank_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rank_cpu)

#: reads a number of CPU seconds per line, spends them on the CPU, answers "done"
BURNER = ("import sys, time\n"
          "for line in sys.stdin:\n"
          "    t0 = time.process_time()\n"
          "    while time.process_time() - t0 < float(line):\n"
          "        pass\n"
          "    print('done', flush=True)\n")


def log_steps(run_dir: Path, n: int) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for _ in range(n):
            f.write(json.dumps({"step": 0, "time/step": 1.0}) + "\n")
            f.write(json.dumps({"eval/reward_mean": 0.5}) + "\n")  # not a step's line


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(*cmd: str) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def burn(p: subprocess.Popen, seconds: float) -> None:
    p.stdin.write(f"{seconds}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"


def test_a_role_is_charged_the_cpu_its_rank_spent_between_the_window_steps(tmp_path, procs):
    policy = procs(sys.executable, "-c", BURNER)
    rollout = procs(sys.executable, "-c", BURNER)
    controller = procs(sys.executable, "-c", "import sys; sys.stdin.read()")
    (tmp_path / "workers.json").write_text(json.dumps({
        "policy": [{"rank": 0, "pid": policy.pid}], "rollout": [{"rank": 0, "pid": rollout.pid}]}))
    window = rank_cpu.StepWindowCPU(tmp_path, controller.pid, first_step=2, last_step=4)
    burn(policy, 0.3)  # before the window: not counted
    log_steps(tmp_path, 2)
    window.poll()
    assert window.result() is None  # one end only
    burn(policy, 0.4)
    burn(rollout, 0.1)
    log_steps(tmp_path, 2)
    window.poll()
    burn(policy, 0.3)  # after the window: not counted
    window.poll()
    got = window.result()
    assert set(got) == {"policy", "rollout", "controller"}
    assert 0.19 <= got["policy"] <= 0.3, got  # 0.4 s over 2 steps
    assert 0.04 <= got["rollout"] <= 0.1, got
    assert got["controller"] < 0.05, got


def test_a_role_whose_ranks_are_gone_at_the_end_has_no_figure(tmp_path, procs):
    policy = procs(sys.executable, "-c", BURNER)
    controller = procs(sys.executable, "-c", "import sys; sys.stdin.read()")
    (tmp_path / "workers.json").write_text(json.dumps({"policy": [{"rank": 0, "pid": policy.pid}]}))
    window = rank_cpu.StepWindowCPU(tmp_path, controller.pid, first_step=1, last_step=2)
    window.poll()  # no step logged yet: nothing read
    log_steps(tmp_path, 1)
    window.poll()
    policy.kill()
    policy.wait()
    log_steps(tmp_path, 1)
    window.poll()
    got = window.result()
    assert got["policy"] is None and got["controller"] is not None


def test_roles_in_one_process_are_not_split(tmp_path, procs):
    shared = procs(sys.executable, "-c", BURNER)  # every role in the controller (run.scheduler: in_process)
    (tmp_path / "workers.json").write_text(json.dumps({
        "policy": [{"rank": 0, "pid": shared.pid}], "rollout": [{"rank": 0, "pid": shared.pid}]}))
    window = rank_cpu.StepWindowCPU(tmp_path, shared.pid, first_step=1, last_step=2)
    log_steps(tmp_path, 1)
    window.poll()
    burn(shared, 0.1)
    log_steps(tmp_path, 1)
    window.poll()
    assert window.result() == {"policy": None, "rollout": None, "controller": None}


def test_the_window_must_span_a_step():
    with pytest.raises(ValueError, match="last_step"):
        rank_cpu.StepWindowCPU(Path("."), 1, first_step=3, last_step=3)
