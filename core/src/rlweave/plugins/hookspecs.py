"""The plugin contract: one hook per plugin kind.

A plugin is a module (named by an entry point in the group ``rlweave.plugins``) that
implements any of these hooks with ``@rlweave.plugins.hookimpl``. Each hook returns a list
of records (see :mod:`rlweave.plugins.types`). Hooks must be cheap: build records, import
nothing heavy. The heavy code is imported by ``record.load()`` when a run selects it.

Implementing a function named ``rlweave_*`` that is not listed here is an error: the
plugin is reported as broken rather than silently ignored.

Any record may pass ``probe=`` (a cheap, light ``() -> None | reason``): a record that cannot
run on this machine is listed as ``unavailable`` with the reason, and a config selecting it
fails validation with that reason.
"""

from __future__ import annotations

import pluggy

PROJECT = "rlweave"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rlweave_training_backends():  # type: ignore[empty-body]
    """Training backends this plugin provides.

    Selected in YAML by ``roles.<role>.backend``. Example::

        @hookimpl
        def rlweave_training_backends():
            return [BackendRecord(
                name="fsdp", summary="torch FSDP2 on gloo/NCCL",
                target="rlweave_backend_fsdp.worker:FSDPWorker",
                config_model=FSDPConfig, parallel=("dp",),
                probe=lambda: None if importlib.util.find_spec("torch") else "torch is not installed")]

    :return: list of :class:`~rlweave.plugins.types.BackendRecord`
    """


@hookspec
def rlweave_inference_engines():  # type: ignore[empty-body]
    """Inference engines this plugin provides.

    Selected in YAML by ``roles.rollout.engine``. Example::

        @hookimpl
        def rlweave_inference_engines():
            return [EngineRecord(name="vllm", summary="vLLM in Ray actors",
                                 target="rlweave_infer_vllm.engine:VLLMEngine",
                                 config_model=VLLMConfig, parallel=("tp",))]

    :return: list of :class:`~rlweave.plugins.types.EngineRecord`
    """


@hookspec
def rlweave_algorithms():  # type: ignore[empty-body]
    """Algorithms this plugin provides.

    Selected in YAML by ``algorithm.name``; the rest of the ``algorithm`` section is
    validated against ``config_model``. Example::

        @hookimpl
        def rlweave_algorithms():
            return [AlgorithmRecord(name="grpo", summary="Group-relative PPO",
                                    target="rlweave_algo_grpo.algorithm:GRPO",
                                    config_model=GRPOConfig,
                                    roles=lambda cfg: ("policy", "rollout") +
                                          (("reference",) if cfg.kl.beta else ()),
                                    reward_data=lambda cfg: ("train", "eval"))]

    :return: list of :class:`~rlweave.plugins.types.AlgorithmRecord`
    """


@hookspec
def rlweave_rewards():  # type: ignore[empty-body]
    """Reward functions this plugin provides.

    Selected in YAML by ``rewards[].name``. ``load()`` returns
    ``fn(prompt: str, response: str, **fields) -> float``. Example::

        @hookimpl
        def rlweave_rewards():
            return [RewardRecord(name="arith_exact", summary="1 if the answer is exact",
                                 target="rlweave.rewards.rules:arith_exact")]

    :return: list of :class:`~rlweave.plugins.types.RewardRecord`
    """


@hookspec
def rlweave_kernels():  # type: ignore[empty-body]
    """Optional kernels (fast paths) this plugin provides.

    Selected in YAML by ``kernels.<name>: true``; ``probe()`` says whether it can run
    here. Example::

        @hookimpl
        def rlweave_kernels():
            return [KernelRecord(name="moe_groupgemm", summary="Triton grouped GEMM",
                                 target="my_kernels.moe:grouped_gemm",
                                 probe=lambda: None if has_cuda() else "needs CUDA")]

    :return: list of :class:`~rlweave.plugins.types.KernelRecord`
    """


@hookspec
def rlweave_advantage_estimators():  # type: ignore[empty-body]
    """Advantage estimators this plugin provides (:mod:`rlweave.algo_parts.advantages`).

    Selected in YAML by ``algorithm.advantage`` (a name, or ``{name: ..., <options>}``).
    Example::

        @hookimpl
        def rlweave_advantage_estimators():
            return [AdvantageRecord(name="median_baseline",
                                    summary="reward minus the group median",
                                    target="my_parts.estimators:median_baseline",
                                    config_model=MedianOptions)]

    :return: list of :class:`~rlweave.plugins.types.AdvantageRecord`
    """


@hookspec
def rlweave_policy_losses():  # type: ignore[empty-body]
    """Policy losses this plugin provides (:mod:`rlweave.algo_parts.policy_losses`).

    Selected in YAML by ``algorithm.policy_loss``. Example::

        @hookimpl
        def rlweave_policy_losses():
            return [PolicyLossRecord(name="sapo", summary="soft-gated surrogate",
                                     target="my_parts.losses:sapo", loss_agg="token_mean")]

    :return: list of :class:`~rlweave.plugins.types.PolicyLossRecord`
    """


@hookspec
def rlweave_kl_estimators():  # type: ignore[empty-body]
    """Per-token KL estimators this plugin provides (:mod:`rlweave.algo_parts.kl`).

    Selected in YAML by ``algorithm.kl.estimator`` (GRPO) or ``algorithm.kl_estimator`` (PPO).
    Example::

        @hookimpl
        def rlweave_kl_estimators():
            return [KLRecord(name="k3_plus", summary="k3 with a linear tail",
                             target="my_parts.kl:k3_plus")]

    :return: list of :class:`~rlweave.plugins.types.KLRecord`
    """


@hookspec
def rlweave_loss_aggregations():  # type: ignore[empty-body]
    """Loss aggregations (token weights) this plugin provides (:mod:`rlweave.algo_parts.aggregation`).

    Selected in YAML by ``algorithm.loss_agg``. Example::

        @hookimpl
        def rlweave_loss_aggregations():
            return [LossAggRecord(name="seq_sqrt", summary="per-sample sums over sqrt(length)",
                                  target="my_parts.agg:seq_sqrt")]

    :return: list of :class:`~rlweave.plugins.types.LossAggRecord`
    """


@hookspec
def rlweave_rollout_corrections():  # type: ignore[empty-body]
    """Rollout corrections this plugin provides (:mod:`rlweave.algo_parts.corrections`): how the
    policy loss weights or drops tokens that the engine sampled with another policy (older weights,
    another numeric stack).

    Selected in YAML by ``algorithm.off_policy.correction`` (a name, or ``{name: ..., <options>}``).
    ``needs=("proximal",)`` asks for the proximal policy recomputed before the update (refused with
    ``off_policy.mode: bypass``). Example::

        @hookimpl
        def rlweave_rollout_corrections():
            return [CorrectionRecord(name="soft_band", summary="IS weight, squashed outside [low, high]",
                                     target="my_parts.corrections:soft_band", config_model=BandOptions)]

    :return: list of :class:`~rlweave.plugins.types.CorrectionRecord`
    """


@hookspec
def rlweave_environments():  # type: ignore[empty-body]
    """Environments for multi-turn rollouts this plugin provides (:mod:`rlweave.interfaces.environment`).

    Selected in YAML by ``algorithm.multi_turn.env.name``; ``algorithm.multi_turn.env.args`` is validated
    against ``config_model``. Example::

        @hookimpl
        def rlweave_environments():
            return [EnvironmentRecord(name="chess", summary="plays a chess game against an engine",
                                      target="my_envs.chess:ChessEnvironment", config_model=ChessArgs)]

    :return: list of :class:`~rlweave.plugins.types.EnvironmentRecord`
    """


@hookspec
def rlweave_tool_parsers():  # type: ignore[empty-body]
    """Tool-call parsers this plugin provides (:mod:`rlweave.environments.parsers`): how the
    ``tools`` environment reads the calls in a model turn.

    Selected in YAML by ``algorithm.multi_turn.env.args.parser``. Example::

        @hookimpl
        def rlweave_tool_parsers():
            return [ToolParserRecord(name="pythonic", summary="[fn(a=1), g(b='x')] calls",
                                     target="my_parsers:pythonic", call_format="[tool(arg=value)]")]

    :return: list of :class:`~rlweave.plugins.types.ToolParserRecord`
    """


@hookspec
def rlweave_rollouts():  # type: ignore[empty-body]
    """Rollouts this plugin provides (:mod:`rlweave.interfaces.rollout`): how data records become
    trajectories for the RL algorithms (one continuation per prompt, multi-turn episodes, a game,
    an agent harness...).

    Selected in YAML by ``rollout.name``; ``rollout.args`` is validated against ``config_model``.
    The record says which run modes can drive it. Example::

        @hookimpl
        def rlweave_rollouts():
            return [RolloutRecord(name="self_play", summary="two copies of the policy play each other",
                                  target="my_rollouts.self_play:SelfPlayRollout", config_model=SelfPlayArgs)]

    :return: list of :class:`~rlweave.plugins.types.RolloutRecord`
    """


@hookspec
def rlweave_run_modes():  # type: ignore[empty-body]
    """Run modes this plugin provides (``run.mode``): how generation and training take turns, as a
    pipeline that feeds each step (:mod:`rlweave.interfaces.pipeline`) plus the checks the mode
    needs of a run config. Example::

        @hookimpl
        def rlweave_run_modes():
            return [RunModeRecord(name="two_steps_off", summary="generation two steps ahead of training",
                                  target="my_modes.two_off:build", check=my_modes_light.check)]

    :return: list of :class:`~rlweave.plugins.types.RunModeRecord`
    """


#: hook name -> record kind
HOOK_KINDS: dict[str, str] = {
    "rlweave_training_backends": "backend",
    "rlweave_inference_engines": "engine",
    "rlweave_algorithms": "algorithm",
    "rlweave_rewards": "reward",
    "rlweave_kernels": "kernel",
    "rlweave_advantage_estimators": "advantage",
    "rlweave_policy_losses": "policy_loss",
    "rlweave_kl_estimators": "kl",
    "rlweave_loss_aggregations": "loss_agg",
    "rlweave_rollout_corrections": "rollout_correction",
    "rlweave_environments": "environment",
    "rlweave_tool_parsers": "tool_parser",
    "rlweave_rollouts": "rollout",
    "rlweave_run_modes": "run_mode",
}
