"""What a rank receives: its plugin's options as the validated model (validated once, by the
controller), and nothing of how its process is set up (threads, allocator: the Ray layer's)."""

from __future__ import annotations

import dataclasses
import os

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from rlweave.config.schema import RunConfig
from rlweave.interfaces.worker import WorkerContext
from rlweave.scheduler.ray_impl.build import worker_context, _process_settings
from rlweave.scheduler.ray_impl.process import ProcessSettings


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernels: str = "auto"


class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    budget: int = 4096
    inner: Inner = Inner()


@dataclasses.dataclass
class Record:
    config_model: type | None = Opts


def _cfg(**role) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "/m"}, "ray": {"cpu_malloc_reuse": False},
                                     "roles": {"policy": {"backend": "fsdp", **role}}, "algorithm": {"name": "grpo"}})


def test_the_controller_hands_over_the_validated_options_model():
    cfg = _cfg(options={"budget": 64, "inner": {"kernels": "torch"}})
    ctx = worker_context(cfg, "policy", 0, ("127.0.0.1", 1), record=Record())
    assert isinstance(ctx.options, Opts) and ctx.options.budget == 64 and ctx.options.inner.kernels == "torch"
    assert ctx.options_as(Opts) is ctx.options  # not validated again by the worker
    other = worker_context(cfg, "policy", 1, ("127.0.0.1", 1), record=Record())
    assert other.options == ctx.options and other.options is not ctx.options  # one per rank
    # a plugin without an options model gets the section as a dict
    assert worker_context(cfg, "policy", 0, ("127.0.0.1", 1), record=Record(None)).options == {
        "budget": 64, "inner": {"kernels": "torch"}}


def test_a_dict_given_directly_is_validated_by_the_workers_schema():
    given = {"inner": {"kernels": "rlweave"}}
    ctx = WorkerContext(options=given)
    got = ctx.options_as(Opts)
    assert got == Opts(inner=Inner(kernels="rlweave")) and got.budget == 4096  # defaults from the schema
    assert ctx.options is given and given == {"inner": {"kernels": "rlweave"}}  # left as it was
    assert WorkerContext().options_as(Opts) == Opts() and WorkerContext(options=None).options_as(Opts) == Opts()
    with pytest.raises(ValidationError, match="kernel"):
        WorkerContext(options={"inner": {"kernel": "torch"}}).options_as(Opts)
    with pytest.raises(TypeError, match="expected Opts"):
        WorkerContext(role="rollout", options=Inner()).options_as(Opts)


def test_process_settings_come_from_the_config_and_stay_out_of_the_context():
    settings = _process_settings(_cfg(cpu_threads=3), "policy")
    assert settings == ProcessSettings(cpu_threads=3, cpu_malloc_reuse=False)
    names = {f.name for f in dataclasses.fields(WorkerContext)}
    assert not names & {"cpu_threads", "cpu_malloc_reuse"}


#: run in a fresh process, as a rank is: a process that ran vLLM's CPU engine in it (other tests
#: of a pytest worker may) keeps its thread count whatever torch.set_num_threads asks
ACTOR_SETUP = """
import json, os, torch
from rlweave.interfaces.worker import Worker, WorkerContext
from rlweave.scheduler.ray_impl.actor import WorkerActor
from rlweave.scheduler.ray_impl.process import ProcessSettings

class Seen(Worker):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.threads = torch.get_num_threads()
        self.deterministic = torch.are_deterministic_algorithms_enabled()

out = []
for settings in (ProcessSettings(cpu_threads=1, cpu_malloc_reuse=False),
                 ProcessSettings(cpu_threads=None, cpu_malloc_reuse=False),
                 ProcessSettings(cpu_threads=1, cpu_malloc_reuse=False, deterministic=True)):
    actor = WorkerActor(Seen, "policy", 0)
    actor.setup(WorkerContext(world_size=1), "cpu", settings)
    out.append({"applied": actor.applied.cpu_threads, "malloc": actor.applied.cpu_malloc_reuse,
                "seen": actor.worker.threads, "deterministic": actor.worker.deterministic})
print(json.dumps(out))
"""


def test_the_actor_applies_the_settings_before_building_the_worker():
    import json
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # what Ray gives a rank
    proc = subprocess.run([sys.executable, "-c", ACTOR_SETUP], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fixed, derived, deterministic = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fixed == {"applied": 1, "malloc": False, "seen": 1, "deterministic": False}
    assert deterministic["deterministic"] is True  # run.deterministic: on before the worker is built
    assert derived["applied"] == derived["seen"] == max(1, os.cpu_count() or 1) and derived["malloc"] is False
