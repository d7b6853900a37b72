"""Core config sections (pass one of validation).

Strict: an unknown key is an error. Every field has a default and a one-line description.
Sections that belong to one component live beside its code and are used here: ``roles.<r>.optim``
(:mod:`rlweave.interfaces.optim`), ``rewards`` and ``reward_runtime`` (:mod:`rlweave.rewards.sections`),
``weight_sync`` (:mod:`rlweave.weight_sync.section`).

Plugin-owned parts are validated in pass two against the selected plugin's own model:

* ``algorithm``: ``name`` plus the algorithm's own keys, flat beside it.
* ``roles.<role>.options``: the selected backend's / engine's own keys.
* ``rewards[].args``: keyword arguments for the reward function.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlweave.interfaces.lora import LoRASection
from rlweave.interfaces.optim import OptimSection
from rlweave.rewards.sections import RewardEntry, RewardsRuntime
from rlweave.weight_sync.section import WeightSyncSection


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(Strict):
    name: str = Field("run", description="Run name; the run directory is <output_dir>/<name>.")
    output_dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(1, description="Base seed for data order, sampling and initialisation.")
    total_steps: int = Field(10, ge=1, description="Number of training steps.")
    eval_every: int = Field(0, ge=0, description="Evaluate every k steps (0: only before and after).")
    save_every: int = Field(0, ge=0, description="Checkpoint every k steps (0: only at the end).")
    keep_last: int = Field(2, ge=1, description="Complete checkpoints to keep.")
    log_every: int = Field(1, ge=1, description="Print a status line every k steps.")
    save_hf: bool = Field(True, description="Write a Hugging Face checkpoint of the policy at the end.")
    mode: str = Field(
        "sync", description="How generation and training take turns (a run-mode plugin; rlweave list-plugins shows "
        "them). sync: generate, then train, then sync weights. one_step_off: the next step's batch is generated while "
        "this one trains (samples one version old). async: samples stream through a bounded queue, generated up to "
        "run.max_staleness versions ahead of training. The last two need the rollout role on devices of its own, and "
        "the algorithm and the rollout must support the mode.",
    )
    max_staleness: int = Field(
        1, ge=0, description="one_step_off and async: no trained token was generated more than this many policy "
        "versions before the update that uses it (older samples are generated again).",
    )
    scheduler: Literal["ray", "in_process"] = Field(
        "ray", description="Where the roles' workers run. ray: one Ray actor per rank, with placement groups, per-call "
        "deadlines (roles.<role>.timeouts) and restarts. in_process: every role's worker in this process, one rank per "
        "role, without Ray (a GPU machine without Ray, small models): the roles share this process's device (its "
        "current GPU on gpu pools), weights move in process (weight_sync.transport auto or in_process), calls run "
        "without deadlines, and run.max_restarts must be 0 (docs/in_process.md).",
    )
    in_process_threads: bool = Field(
        False, description="run.scheduler in_process only: run each engine role's calls on a thread of its own (its "
        "control calls on another) and the training roles' calls on one shared thread, so that one_step_off and async "
        "overlap generation with training in this process. Meant for work that releases the interpreter (GPU kernels); "
        "on a CPU the roles contend for the interpreter and the cores (docs/in_process.md).",
    )
    max_restarts: int = Field(
        0, ge=0, description="Times a run recovers from a dead or hung worker: the lost roles are rebuilt, every "
        "trained role reloads the newest complete checkpoint (one is written at step 0 when there is none) and the run "
        "goes on from there. 0: the run stops with the error.",
    )
    deterministic: bool = Field(
        False, description="Two runs of one config give bitwise identical weights and metrics (on one machine with "
        "one software stack): torch's deterministic algorithms in the controller and every rank, seeds as always. A "
        "setting that cannot be deterministic (run.mode other than sync, rollout.partial, an engine that does not "
        "promise it) is a validation error (docs/reproducibility.md).",
    )
    trace: bool = Field(
        True, description="Record the run's timeline: a span for every rank call and every phase of the controller, "
        "written as <run_dir>/trace.json (ui.perfetto.dev, chrome://tracing) and drawn as timeline.png when the run "
        "ends. false: nothing is recorded.",
    )


class RaySection(Strict):
    address: Optional[str] = Field(None, description="Join this Ray cluster; null starts a local one.")
    num_cpus: Optional[int] = Field(None, description="CPUs of a local cluster (null: all).")
    dashboard: bool = Field(False, description="Start the Ray dashboard with a local cluster.")
    virtual_gpus: Optional[int] = Field(
        None, description="Declare this many GPUs to a local cluster on a GPU-less machine (virtual devices)."
    )
    worker_niceness: Optional[int] = Field(
        None, ge=0, le=19, description="Scheduling niceness (nice) of the worker processes of a local cluster, the "
        "ranks among them; null: Ray's own (15, below the controller and Ray's agents, or the RAY_worker_niceness "
        "environment variable). 0 gives the ranks the controller's priority, faster where they share the CPU cores "
        "with it (bench/RESULTS.md), less responsive control processes on a loaded machine. A joined cluster "
        "(address) keeps its own.",
    )
    cpu_malloc_reuse: bool = Field(
        True,
        description="Processes on CPU keep freed memory for reuse (glibc mmap/trim thresholds raised) instead of "
        "returning it to the OS and page-faulting it back: the controller and the whole local cluster on a GPU-less "
        "machine, and the ranks of cpu pools. Faster CPU training steps (bench/RESULTS.md); a process keeps "
        "its peak heap until it exits. false: glibc's defaults.",
    )


class PoolSection(Strict):
    nodes: int = Field(1, ge=1, description="Nodes in this pool.")
    devices_per_node: int = Field(1, ge=1, description="Devices (GPUs or virtual devices) per node.")
    device: Literal["gpu", "cpu"] = Field("gpu", description="Device kind; gpu pools become virtual devices without GPUs.")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK"] = Field("PACK", description="Ray placement strategy.")


class ResourcesSection(Strict):
    pools: dict[str, PoolSection] = Field(
        default_factory=lambda: {"default": PoolSection()}, description="Named resource pools."
    )
    colocate: list[list[str]] = Field(
        default_factory=list, description="Groups of roles that share devices and take turns."
    )
    offload: Literal["auto", "always", "never"] = Field(
        "auto", description="Put away roles idle in a phase of a step (offload training state, engine sleep): "
        "auto = roles that share devices with another role; always = every role; never.",
    )


class VisionSection(Strict):
    """Image size bounds of a vision-language model, read by data validation and by the controller,
    which turns each image into the pixels the engine and the trainer both get, so their image
    token counts agree (null: the model directory's own)."""

    min_pixels: Optional[int] = Field(
        None, ge=1, description="Smallest area (height x width, in pixels) an image is resized to (null: the "
        "model's preprocessor_config.json).",
    )
    max_pixels: Optional[int] = Field(
        None, ge=1, description="Largest area (height x width, in pixels) an image is resized to; fewer pixels, "
        "fewer image tokens (null: the model's preprocessor_config.json).",
    )

    @field_validator("max_pixels")
    @classmethod
    def _not_below_min(cls, value: Optional[int], info: Any) -> Optional[int]:
        low = info.data.get("min_pixels")
        if value is not None and low is not None and value < low:
            raise ValueError(f"must be at least min_pixels ({low}), got {value}")
        return value


class ModelSection(Strict):
    path: Optional[str] = Field(
        None, description="Local Hugging Face model directory, or a hub name (org/name) already in the Hugging Face "
        "cache (nothing is downloaded: `hf download org/name` first).",
    )
    revision: Optional[str] = Field(
        None, description="Hub revision of a hub-name path (branch, tag or commit hash) in the cache (null: main); "
        "the commit used is recorded in plugins.json.",
    )
    tokenizer: Optional[str] = Field(None, description="Tokenizer directory or cached hub name (default: model path).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    model_type: Literal["causal_lm", "value", "reward"] = Field("causal_lm", description="Head on the model.")
    trust_remote_code: bool = Field(False, description="Allow model code from the model directory.")
    vision: Optional[VisionSection] = Field(
        None, description="Vision-language models: image size bounds, used by validation and by the controller, "
        "which resizes each image once for the engine and the trainer (null: the model directory's own).",
    )


class CallTimeouts(Strict):
    """Seconds a call on a role may take before the run stops with an error naming role, rank and method."""

    init: float = Field(1800.0, gt=0, description="Building the model or engine (init_model / init_engine).")
    generate: float = Field(3600.0, gt=0, description="One generate() call of a rollout engine.")
    train: float = Field(3600.0, gt=0, description="One train step (all micro-batches of a mini-batch).")
    logprobs: float = Field(1800.0, gt=0, description="One forward pass call: log-probs, values or scores.")
    sync: float = Field(900.0, gt=0, description="One weight sync into this role (all buckets).")
    checkpoint: float = Field(1800.0, gt=0, description="Saving or loading a checkpoint, or writing the HF model.")
    other: float = Field(600.0, gt=0, description="Any other call (offload, onload, sleep, ping...).")


class RoleSection(Strict):
    backend: Optional[str] = Field(None, description="Training backend plugin (trained/scoring roles).")
    engine: Optional[str] = Field(None, description="Inference engine plugin (rollout role).")
    pool: str = Field("default", description="Resource pool the role's devices come from.")
    devices: int = Field(1, ge=1, description="Devices (ranks) this role uses.")
    parallel: dict[str, int] = Field(default_factory=dict, description="Parallel sizes, e.g. {dp: 2} or {tp: 2}.")
    cpu_threads: Optional[int] = Field(
        None,
        ge=1,
        description="Intra-op CPU threads of each rank on a CPU device (torch.set_num_threads, OMP_NUM_THREADS). "
        "null: the node's cores divided by this role's ranks (Ray alone would give 1). GPU ranks are left as Ray sets them.",
    )
    model: Optional[ModelSection] = Field(None, description="Model for this role (default: top-level model).")
    optim: Optional[OptimSection] = Field(None, description="Optimizer, for roles that train.")
    lora: Optional[LoRASection] = Field(
        None, description="Train low-rank adapters (LoRA) instead of all weights; the backend must support it "
        "(null: full weights).",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="The selected plugin's own settings.")
    timeouts: CallTimeouts = Field(default_factory=CallTimeouts, description="Per-method call timeouts (seconds).")
    kernels: dict[str, bool] = Field(
        default_factory=dict,
        description="Kernels for this role by name, over the top-level kernels: true turns one on for this role "
        "(its backend must use it), false turns a top-level one off.",
    )


class PartialRolloutSection(Strict):
    token_budget_per_step: int = Field(
        ..., ge=1, description="New tokens a sample gets at most in one generation round; a longer response is kept "
        "and continued in the next round (its group is trained when every sample of it has finished).",
    )
    max_rounds: int = Field(
        4, ge=1, description="Rounds a sample may take: in its last it is generated to the end (max_new_tokens).",
    )
    fill_confidence: float = Field(
        0.9, gt=0.0, lt=1.0, description="sync steps of single-turn rollouts: a round starts enough fresh groups "
        "that the step's batch is complete after it with this probability, at the rate fresh groups have completed in "
        "one round so far (higher: fewer rounds a step, more groups carried to the next step).",
    )


class RolloutSection(Strict):
    name: Optional[str] = Field(
        None, description="Rollout plugin: how records become trajectories (rlweave list-plugins shows them). null: "
        "multi_turn when algorithm.multi_turn is set, else single_turn (one continuation per prompt).",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="The selected rollout's own settings (its schema; the multi_turn rollout "
        "takes its settings from algorithm.multi_turn).",
    )
    partial: Optional[PartialRolloutSection] = Field(
        None, description="Partial rollout: over-long generations are cut at a token budget and continued in the "
        "next round instead of holding up the step (null: off).",
    )
    request_groups: Optional[int] = Field(
        None, ge=1, description="async: prompts (groups) per generate request; weight updates reach the engine "
        "between requests (null: a quarter of data.batch_size, at least 1).",
    )
    dump: bool = Field(
        False, description="Write every step's trajectories (token ids, masks, engine log-probs, weight versions, "
        "rewards, routing when the batch carries it) to <run_dir>/rollouts/step_XXXXXX.safetensors, with a header "
        "naming the model, tokenizer, algorithm and seed (docs/reproducibility.md).",
    )
    replay: Optional[str] = Field(
        None, description="Train from a dump (rollout.dump) instead of generating: a run directory or its rollouts/ "
        "folder. No rollout role is started and no reward is computed; sync mode only; the dump must come from "
        "this model, tokenizer, algorithm and seed (docs/reproducibility.md).",
    )


class DataSection(Strict):
    train: Optional[str] = Field(
        None, description="Training data: a jsonl or parquet file, or a directory written by datasets' save_to_disk.",
    )
    eval: Optional[str] = Field(None, description="Held-out data, same formats as train (never trained on).")
    chat_template: Optional[str] = Field(
        None, description="Jinja chat template for records in chat form ('messages'), used instead of the "
        "tokenizer's own: the template text, or a path to a .jinja file.",
    )
    batch_size: int = Field(8, ge=1, description="Records per step.")
    eval_size: Optional[int] = Field(None, description="Evaluate on the first k eval records (null: all).")
    shuffle: bool = Field(True, description="Shuffle each epoch with the run seed.")


class LoggingSection(Strict):
    backends: list[str] = Field(
        default_factory=lambda: ["jsonl", "tensorboard"],
        description="Where per-step metrics go: jsonl (always written), tensorboard, wandb, mlflow.",
    )
    project: str = Field("rlweave", description="W&B project / MLflow experiment name.")
    run_name: Optional[str] = Field(None, description="Run name shown by W&B and MLflow (null: run.name).")
    entity: Optional[str] = Field(None, description="W&B entity (team or user; null: W&B's default).")
    tracking_uri: Optional[str] = Field(
        None, description="MLflow tracking URI (null: MLFLOW_TRACKING_URI, else file:<run dir>/mlruns).",
    )

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, names: list[str]) -> list[str]:
        from rlweave.loggers import BACKENDS

        unknown = []
        for name in names:
            if name not in BACKENDS:
                close = difflib.get_close_matches(str(name), list(BACKENDS), n=1, cutoff=0.6)
                unknown.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        if unknown:
            raise ValueError(f"unknown logger{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                             f"known loggers: {', '.join(BACKENDS)}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"logger(s) listed twice: {', '.join(dup)}")
        return names


class AlgorithmSection(BaseModel):
    """``name`` plus the algorithm's own keys (validated in pass two)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field("grpo", description="Algorithm plugin name, or 'module:Class' / 'path/file.py:Class' for a "
                      "local Algorithm subclass (docs/custom_algorithm.md).")
    reference: Literal["auto", "adapter_disabled", "role"] = Field(
        "auto", description="Where reference log-probs come from when the algorithm needs them: 'role' starts the "
        "reference role; 'adapter_disabled' computes them on the policy's ranks with its LoRA adapters off (the "
        "policy's base model, no reference role started). auto: adapter_disabled when the policy trains LoRA "
        "adapters and the reference model is the policy's base model (or roles.reference is not given), else role.",
    )


class RunConfig(Strict):
    required_plugins: list[str] = Field(
        default_factory=list, description="Distributions that must be installed, e.g. 'rlweave-algo-grpo>=0.1'."
    )
    run: RunSection = Field(default_factory=RunSection, description="Run-level settings.")
    ray: RaySection = Field(default_factory=RaySection, description="Ray cluster settings.")
    resources: ResourcesSection = Field(default_factory=ResourcesSection, description="Pools and colocation.")
    model: ModelSection = Field(default_factory=ModelSection, description="Default model of all roles.")
    roles: dict[str, RoleSection] = Field(default_factory=dict, description="Role name -> placement and plugin.")
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection, description="Algorithm and its settings.")
    rewards: list[RewardEntry] = Field(default_factory=list, description="Rewards, summed with weights.")
    reward_runtime: RewardsRuntime = Field(default_factory=RewardsRuntime, description="How rewards run.")
    data: DataSection = Field(default_factory=DataSection, description="Data files and batch size.")
    logging: LoggingSection = Field(default_factory=LoggingSection, description="Metrics backends.")
    weight_sync: WeightSyncSection = Field(
        default_factory=WeightSyncSection, description="Weight sync between roles (policy -> rollout).",
    )
    rollout: RolloutSection = Field(
        default_factory=RolloutSection, description="How rollouts are generated (partial rollout, async requests).",
    )
    kernels: dict[str, bool] = Field(
        default_factory=dict,
        description="Optional kernels (plugins, see list-plugins) to turn on by name, e.g. {moe_groupgemm: true}: "
        "handed to every role whose backend uses them; roles.<role>.kernels overrides per role.",
    )


ROLE_NAMES = ("policy", "rollout", "reference", "critic", "reward")
