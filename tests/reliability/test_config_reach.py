"""Every config key reaches its consumer (mutation test).

A key that validation accepts but no code reads, or that code reads under another name and
falls back to a default, silently does nothing. Here every key of the core schema and of
every installed plugin (backend/engine options, algorithm settings, reward args) is set to a
valid non-default value in one of the runs of ``config_reach_variants.yaml``; each run records
every read of its config (:mod:`rlweave.testing.config_reach`), and a key passes when code
read it and got the mutated value (:mod:`rlweave.testing.config_keys`).

The runs (tiny fp32 model, 1-2 steps, no Ray: :mod:`rlweave.testing.recorded_run`):

* ``grpo``, ``grpo_async`` (run modes, partial rollout, off-policy correction), ``ppo``,
  ``ppo_kl_loss``, ``dpo``,
  ``online_dpo``, ``sft`` (with a vLLM rollout), ``rm``, ``megatron_rm``, ``deepspeed_rm`` (those backends' options): the real
  ``rlweave.runner.loop.run`` (controller, role builder, workers, algorithm with its steps,
  evaluations and checkpoints, rewards) with every rank in this process;
* ``fsdp_init``: an fsdp role built with settings whose cost is paid at the first forward
  (``compile``) or that only apply with bf16 compute; ``hf_unseeded``: an hf engine asked to
  generate without a seed (the only calls that read its ``seed``: every shipped algorithm seeds
  its own); ``vllm_args``: a vLLM engine asked for the arguments it gives ``vllm.LLM``
  (``enforce_eager: false`` costs 20 s of compilation here);
* ``in_process``: a GRPO step of the real run loop with ``run.scheduler: in_process`` (its own role
  builder, which the recorded run does not replace); ``grpo_agent``, ``ppo_agent``,
  ``online_dpo_agent``: the same with an agent function driving the rollout through the
  OpenAI-compatible endpoint;
* ``ray_address`` / ``ray_local``: ``start_ray`` with ``ray.init`` recorded instead of called.

A key may be exempt only in :data:`EXEMPT`, with a reason (checked where the code allows); an
exempt key that gets read fails the test (the exemption is stale). Reads during plugin
resolution count only for the keys in :data:`RESOLVED`, whose consumer resolution is. A read of
a missing key next to one of a similar name (``ppo_epochs`` where the section has ``epochs``)
fails unless listed in :data:`KNOWN_MISREADS`.

The runs happen once per module (about a minute on 2 cores); one test per config section
reports that section's keys, and the last one records the guarantee of the reliability suite.
"""

from __future__ import annotations

import json
import string
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlweave.config.schema import RunConfig
from rlweave.testing.config_keys import Key, judge, key_of, key_universe, mutations, summary
from rlweave.testing.config_reach import ModelView, Recorder

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VARIANTS = Path(__file__).with_name("config_reach_variants.yaml")

#: parameters of reward functions that come from the data record, not from ``args``
RECORD_FIELDS = {"arith_exact": ("answer",), "arith_last": ("answer",), "math_boxed": ("answer",)}

#: keys whose consumer is plugin resolution (``rlweave.config.resolve``): reads there count
RESOLVED = {
    Key("required_plugins"): "checked against the installed distributions",
    Key("algorithm.name"): "selects the algorithm record",
    Key("roles.<role>.backend"): "selects the training backend record",
    Key("roles.<role>.engine"): "selects the inference engine record",
    Key("algorithm.reference"): "decides whether the reference role is started or served by the policy with its "
                                "LoRA adapters disabled (rlweave.config.lora)",
    Key("algorithm.eval_rollout", "sft"): "sft_roles() decides whether a rollout role is built; SFT evaluates "
                                          "through it when it is there",
}

#: keys no run can read, with why (checked in test_exemption_reasons_hold)
EXEMPT = {
    Key("kernels"):
        "consumed by the controller: it decides which kernels each rank's context carries "
        "(rlweave.config.kernels.role_kernels in worker_context, whose reads the recorded run pauses); "
        "core/tests/test_config_kernels.py checks what reaches each role",
    Key("roles.<role>.kernels"): "as kernels",
    Key("model.revision"): "read only for a hub name (org/name) in the Hugging Face cache; the runs here use local "
        "directories (core/tests/test_config_hub.py pins revisions in a cache it writes)",
    Key("roles.<role>.model.revision"): "as model.revision",
    Key("model.vision.min_pixels"): "read only for a vision-language model; the runs here use a text model "
        "(core/tests/test_config_vision_inputs.py checks that validation resizes images with it)",
    Key("model.vision.max_pixels"): "as model.vision.min_pixels",
    Key("roles.<role>.model.vision.min_pixels"): "as model.vision.min_pixels",
    Key("roles.<role>.model.vision.max_pixels"): "as model.vision.min_pixels",
    Key("roles.<role>.options.freeze_vision_tower", "fsdp"): "read only for a vision-language model (a text model "
        "refuses it); the runs here use a text model; tests/test_vision_training.py freezes a tiny Qwen2-VL's tower",
    Key("roles.<role>.options.freeze_vision_tower", "deepspeed"): "as for fsdp",
    Key("roles.<role>.options.sequence_parallel", "megatron"):
        "needs tp > 1, which the one-rank reward-model run here does not have; read and tested against FSDP in "
        "plugins/backend_megatron/tests/test_megatron_cpu.py (tp2sp)",
    Key("roles.<role>.options.moe_aux_loss_coef", "megatron"):
        "read only for a mixture-of-experts model; the reward-model run here is dense; read and tested against "
        "FSDP in plugins/backend_megatron/tests/test_megatron_moe.py",
    Key("algorithm.multi_turn.reward_overlap", "online_dpo"):
        "read only where rule rewards score the episodes; the OnlineDPO run here ranks by a reward model "
        "(reward_source: model); read in the GRPO and PPO runs, tested in core/tests/test_reward_overlap.py",
    Key("algorithm.router_replay", "grpo"): "needs a mixture-of-experts policy; the runs here use the tiny dense "
        "model (tests/test_router_replay.py replays routing on a tiny MoE model, from the engine and the old pass)",
    Key("rollout.replay"): "needs the dump of an earlier run of the same model and seed (rollout.dump is set in the "
        "ppo_kl_loss run); tests/test_reproducibility.py replays one and compares the weights bit for bit",
    Key("logging.entity"): "read only by the wandb backend, which needs W&B's offline mode to run here "
        "(core/tests/test_loggers.py)",
}

#: misnamed reads that are known (the reader asks for a key its section lacks while a key of a
#: similar name exists): template of the asked key -> why it is left as it is
KNOWN_MISREADS: dict = {}

#: section names of plugin keys in test ids: options[fsdp], algorithm[grpo], reward_args[format]
PLUGIN_SECTIONS = {"roles": "options", "rewards": "reward_args"}
ENGINE_ARGS = (("engine_kwargs", ()), ("engine_in_process", ()))


def _unseeded_generate() -> tuple:
    from rlweave.interfaces.engine import SamplingParams

    return (("generate", ([[5, 6, 7]], SamplingParams(max_new_tokens=2))),)


# ------------------------------------------------------------------ workspace
REWARDS = '''
def spread(prompt, response, **_):
    """Varies between samples of one prompt (dynamic sampling keeps the group), except for
    prompts starting with 1 (their group is dropped: more prompts are drawn)."""
    return 0.0 if prompt.startswith("1") else float(sum(map(ord, response)) % 5)


def flaky(prompt, response, **_):
    """Fails for prompts starting with 3 (one in two of each training batch)."""
    if prompt.startswith("3"):
        raise RuntimeError("flaky reward")
    return 0.0


from rlweave.interfaces.environment import Environment, EnvStep


def agent(episode):
    """An agent of one model request that lists a tool (so its parser reads the reply); it fails on
    prompts starting with 3 (so its episode's error policy applies)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    episode.client.chat.completions.create(model="policy", max_tokens=2, tools=tools,
                                           messages=[{"role": "user", "content": episode.record["prompt"]}])
    if episode.record["prompt"].startswith("3"):
        raise RuntimeError("agent failure")
    return None


def no_calls(text):
    """A tool-call parser that finds no call."""
    return [], []


class Echo(Environment):
    """A multi-turn environment: answers 'ok' to every model turn, never ends an episode itself."""

    def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        return EnvStep(messages=[{"role": "tool", "content": "1"}])
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, monkeypatch_module, grpo_workspace) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("config_reach")
    model = grpo_workspace.model  # the tiny model of tests/conftest.py (vLLM runs it on every CPU)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model).save_pretrained(tmp / "tok")
    (tmp / "model_b").symlink_to(model, target_is_directory=True)
    train = [{"prompt": f"{a}+{b}=", "answer": a + b} for a, b in ((1, 1), (3, 1), (2, 1), (3, 2), (2, 2), (3, 3))]
    files = {
        "train.jsonl": train,
        "eval.jsonl": [{"prompt": f"{a}-1=", "answer": a - 1} for a in (5, 3, 4)],
        "prefs.jsonl": [{"id": i, "prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
                        for i, (a, b) in enumerate(((1, 2), (3, 4), (2, 2), (5, 1)))],
        "ranked.jsonl": [{"query": f"{a}*2=", "response": [str(2 * a), str(2 * a + 1), "0"], "score": [2.0, 1.0, 0.0]}
                         for a in (1, 2, 3)],
        "sft.jsonl": [{"query": f"{a}+{b}=", "response": str(a + b)} for a, b in ((1, 2), (2, 3), (3, 4), (4, 4))],
    }
    for name, rows in files.items():
        (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "config_reach_rewards.py").write_text(REWARDS)
    monkeypatch_module.syspath_prepend(str(tmp))  # reward workers inherit sys.path
    return {"tmp": str(tmp), "model": str(model), "model_b": str(tmp / "model_b"), "tok": str(tmp / "tok")}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def variant(name: str, workspace: dict[str, str]) -> dict[str, Any]:
    text = string.Template(VARIANTS.read_text()).substitute(workspace)
    return yaml.safe_load(text)[name]


@pytest.fixture(scope="module")
def universe():
    from rlweave.plugins.manager import get_plugin_manager

    return key_universe(get_plugin_manager(), RECORD_FIELDS)


# ----------------------------------------------------------------------- runs
def _loop_run(user: dict, rec: Recorder) -> RunConfig:
    from rlweave.runner.loop import run
    from rlweave.testing.recorded_run import recorded_run

    cfg = RunConfig.model_validate(user)
    with recorded_run(rec):
        run(ModelView(cfg, "", rec))
    return cfg


def _build_only(user: dict, rec: Recorder, role: str, init: bool, calls: tuple = ()) -> RunConfig:
    """Resolve ``user`` and build ``role`` alone (initialised or not), then make each call
    ``(method, args)`` on its rank 0."""
    from rlweave.config.resolve import resolve_plugins
    from rlweave.scheduler.ray_impl.build import RoleBuilder
    from rlweave.testing.recorded_run import recorded_run

    cfg = RunConfig.model_validate(user)
    view = ModelView(cfg, "", rec)
    with recorded_run(rec):
        resolved = resolve_plugins(view)
        builder = RoleBuilder(view, {role: resolved.roles[role]}, [role])
        try:
            handle = builder.build(init=init)[role]
            for method, args in calls:
                handle.call(method, *args, dispatch="rank0").result()
        finally:
            builder.close()
    return cfg


def _ray_start(user: dict, rec: Recorder) -> tuple[RunConfig, list[dict]]:
    """``start_ray`` on the recorded ``ray`` section, with ``ray.init`` recorded instead of called."""
    import ray

    from rlweave.scheduler.ray_impl import cluster

    cfg = RunConfig.model_validate(user)
    calls: list[dict] = []
    started = cluster._started_local
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "is_initialized", lambda: False)
        mp.setattr(ray, "init", lambda **kw: calls.append(kw))
        mp.setattr(cluster, "real_gpu_count", lambda: 0)  # the same path on a GPU machine
        mp.setattr(cluster, "cpu_malloc", lambda reuse: calls.append({"cpu_malloc": reuse}))
        try:
            cluster.start_ray(ModelView(cfg, "", rec).ray, needs_gpus=3)
        finally:
            cluster._started_local = started
    return cfg, calls


RUNS = {
    "grpo": _loop_run,
    "grpo_async": _loop_run,
    "ppo": _loop_run,
    "ppo_kl_loss": _loop_run,
    "dpo": _loop_run,
    "online_dpo": _loop_run,
    "sft": _loop_run,
    "rm": _loop_run,
    "megatron_rm": _loop_run,
    "deepspeed_rm": _loop_run,
    "in_process": _loop_run,
    "grpo_agent": _loop_run,
    "ppo_agent": _loop_run,
    "online_dpo_agent": _loop_run,
    "fsdp_init": lambda user, rec: _build_only(user, rec, "policy", init=True),
    "hf_unseeded": lambda user, rec: _build_only(user, rec, "rollout", init=True, calls=_unseeded_generate()),
    "vllm_args": lambda user, rec: _build_only(user, rec, "rollout", init=False, calls=ENGINE_ARGS),
    "ray_address": lambda user, rec: _ray_start(user, rec)[0],
    "ray_local": lambda user, rec: _ray_start(user, rec)[0],
}


@pytest.fixture(scope="module")
def runs(workspace, universe):
    """name -> (config, mutations, problems, recorder, seconds) for every run."""
    pytest.importorskip("vllm", reason="the sft and vllm_args runs start or ask a vLLM engine")
    from rlweave.scheduler import shutdown_ray

    shutdown_ray()  # the recorded runs replace Ray: disconnect one an earlier module of this process left
    out = {}
    for name, fn in RUNS.items():
        user = variant(name, workspace)
        rec = Recorder()
        t0 = time.perf_counter()
        cfg = fn(user, rec)
        muts, problems = mutations(cfg, user, universe)
        out[name] = (cfg, muts, problems, rec, time.perf_counter() - t0)
    return out


@pytest.fixture(scope="module")
def verdicts(runs, universe):
    return judge(universe, [(n, m, rec) for n, (_, m, _, rec, _) in runs.items()], EXEMPT, RESOLVED)


def _section(key: Key) -> str:
    """``run``, ``roles``... for core keys; ``options[fsdp]``, ``algorithm[grpo]``,
    ``reward_args[format]`` for plugin sections."""
    head = key.path.split(".")[0]
    if key.plugin is None:
        return head
    return f"{PLUGIN_SECTIONS.get(head, head)}[{key.plugin}]"


def _sections() -> list[str]:
    from rlweave.plugins.manager import get_plugin_manager

    uni = key_universe(get_plugin_manager(), RECORD_FIELDS)
    return sorted({_section(k) for k in [*uni.keys, *uni.unavailable]})


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(RUNS))
def test_each_run_sets_only_valid_non_default_values(runs, name):
    _, muts, problems, _, _ = runs[name]
    assert muts, f"run {name} mutates nothing"
    assert not problems, f"run {name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("section", _sections())
def test_every_key_of_the_section_reaches_its_consumer(verdicts, section):
    mine = [v for v in verdicts if _section(v.key) == section]
    assert mine, f"no key in section {section}"
    bad = [f"{v.key}: {v.status}: {v.detail}" for v in mine if not v.ok]
    assert not bad, f"{len(bad)} key(s) of {section} do not reach their consumer:\n  " + "\n  ".join(bad)


def test_no_key_is_read_under_a_misspelt_name(runs):
    """A read of a key its section lacks, while a key of a similar name exists, is a
    misnamed key (the reader falls back to its default); known ones must still occur."""
    found: dict[Key, str] = {}
    for name, (cfg, _, _, rec, _) in runs.items():
        for miss in rec.misses:
            if miss.close is not None and miss.phase == "run":
                found.setdefault(key_of(cfg, miss.path), f"{miss.path} in {name} (did you mean {miss.close!r}?)")
    new = {k: v for k, v in found.items() if k not in KNOWN_MISREADS}
    assert not new, "misnamed reads:\n  " + "\n  ".join(f"{k}: {v}" for k, v in new.items())
    stale = [str(k) for k in KNOWN_MISREADS if k not in found]
    assert not stale, f"known misnamed reads no longer happen (remove them from KNOWN_MISREADS): {stale}"


def test_exemption_reasons_hold(universe):
    """Each reason in EXEMPT is checked against the code it names."""
    build = (REPO / "core/src/rlweave/scheduler/contexts.py").read_text()
    assert "role_kernels(cfg, role, record)" in build, "kernels reach the ranks another way now: update EXEMPT"
    assert set(EXEMPT) <= set(universe.keys), "an exemption names a key that does not exist"


def test_ray_section_reaches_ray_init(workspace):
    """The recorded reads of the ray runs are what ``ray.init`` got."""
    rec = Recorder()
    _, calls = _ray_start(variant("ray_local", workspace), rec)
    init = next(c for c in calls if "num_cpus" in c)
    assert (init["num_cpus"], init["num_gpus"], init["include_dashboard"]) == (3, 5, True)
    assert init["_system_config"] == {"worker_niceness": 7}
    assert {"cpu_malloc": False} in calls
    _, calls = _ray_start(variant("grpo", workspace), Recorder())  # no worker_niceness: Ray's own
    assert next(c for c in calls if "num_cpus" in c)["_system_config"] is None
    _, calls = _ray_start(variant("ray_address", workspace), Recorder())
    # a loopback address is joined over loopback (Ray would use the machine's own IP for it)
    assert calls == [{"address": "127.0.0.1:6390", "_node_ip_address": "127.0.0.1", "log_to_driver": True}]


def test_every_config_key_reaches_its_consumer(runs, verdicts, universe, guarantee):
    counts = summary(verdicts)
    bad = [f"{v.key}: {v.status}: {v.detail}" for v in verdicts if not v.ok]
    assert not bad, "\n  ".join(bad)
    mutated = sum(len(m) for _, m, _, _, _ in runs.values())
    took = sum(s for *_, s in runs.values())
    exempt = "; ".join(f"{v.key}: {v.detail.split(':')[0]}" for v in verdicts if v.status == "exempt")
    unavailable = ", ".join(sorted({k.plugin for k in universe.unavailable if k.plugin}))
    guarantee(
        "every config key reaches its consumer (mutation test)",
        f"{len(verdicts)} keys (core schema + installed plugins), {mutated} values mutated in {len(runs)} runs "
        f"({took:.0f} s): {counts.get('read', 0)} read with the mutated value, {counts.get('exempt', 0)} exempt "
        f"({exempt}), {counts.get('unavailable', 0)} of plugins unavailable here ({unavailable or 'none'})",
    )
