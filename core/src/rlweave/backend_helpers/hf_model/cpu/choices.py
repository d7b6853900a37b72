"""The HF model layer's device-dependent choices, resolved in one place.

Each ``auto`` option that depends on the device is decided here, once per worker, from the
config, the device type, whether the role computes in bf16, and on a CPU rank computing in
bf16 how fast this CPU runs bf16 (:func:`rlweave.devices.cpu.bf16_speed`):

* ``cpu.kernels: auto``: rlweave's CPU linears and rotary embeddings with bf16 compute on a
  CPU where bf16 is fast; transformers' code otherwise (the linears' weight-gradient layout
  suits oneDNN's bf16 kernels and is much slower than plain ``nn.Linear`` without them).
* ``cpu.attention_backward: auto``: the compiled bf16 backward with ``compile: true`` and
  rlweave's CPU kernels on a CPU where bf16 is fast; the fp32 flash backward otherwise.
* the CPU attention forward (no option): in the inputs' dtype, except bf16 inputs on a CPU
  where bf16 is slow, which are attended in fp32 (there the bf16 forward is no faster, and
  fp32 is more exact), unless the bf16 backward was asked for explicitly: it recomputes
  from the bf16 forward.
* ``compile_scope: auto``: whole layers on GPU, norms and MLP on CPU (inductor's rotary
  backward is slow on CPU whatever the dtype, so this does not depend on bf16 speed).
* the compiled log-prob/entropy kernels (no option): with ``compile: true`` on CPU.

On a CPU where bf16 is fast each ``auto`` choice is the one that assumes fast bf16 (as the
options' descriptions say). On a CPU where bf16 is slow every ``auto`` choice takes its fp32 path and :func:`warning`
returns a message for the log; explicit choices are honoured (the user asked for them, and
the results are correct, only slow). A warning, not an error: one config is meant to run on
CPUs of both kinds, and small bf16 runs (tests, smoke runs) are still worth running on a
slow-bf16 CPU. All ranks of a role resolve the same way:
:func:`role_bf16_speed` gives every rank the slowest rank's speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlweave.devices.cpu import Bf16Speed, bf16_speed
from rlweave.backend_helpers.hf_model.options import PathOptions


@dataclass(frozen=True)
class DeviceChoices:
    """The resolved choices of one worker.

    ``kernels``: install rlweave's CPU linears and rotary embeddings; ``attention_forward``:
    ``"input"`` (the inputs' dtype) or ``"fp32"`` (bf16/fp16 inputs attended in fp32) on CPU;
    ``attention_backward``: ``"fp32"`` or ``"bf16"`` on CPU; ``compile_scope``: ``"layer"``
    or ``"mlp_norms"``; ``compiled_logprobs``: log-probs and entropy by inductor kernels;
    ``bf16_compute``: the role computes in bf16; ``speed``: the bf16 speed the choices were
    made with (None when not needed: not a CPU rank computing in bf16)."""

    kernels: bool
    attention_forward: str
    attention_backward: str
    compile_scope: str
    compiled_logprobs: bool = False
    bf16_compute: bool = False
    speed: Bf16Speed | None = None

    @property
    def bf16_slow(self) -> bool:
        """bf16 compute on a CPU where bf16 is slow."""
        return self.speed is not None and self.speed.slow


def resolve(cfg: PathOptions, device: str, bf16_compute: bool, speed: Bf16Speed | None = None) -> DeviceChoices:
    """Resolve ``cfg``'s device-dependent options for a rank on ``device`` (``"cpu"`` or
    ``"cuda"``). ``speed`` is consulted only for a CPU rank computing in bf16; when it is
    needed and None, this CPU is probed (:func:`rlweave.devices.cpu.bf16_speed`)."""
    cpu = device == "cpu"
    if cpu and bf16_compute and speed is None:
        speed = bf16_speed()
    if not (cpu and bf16_compute):
        speed = None
    slow = speed is not None and speed.slow
    if cfg.cpu.kernels != "auto":
        kernels = cfg.cpu.kernels == "rlweave"
    else:
        kernels = cpu and bf16_compute and not slow
    if cfg.cpu.attention_backward != "auto":
        backward = cfg.cpu.attention_backward
    else:
        backward = "bf16" if cfg.compile and kernels and not slow else "fp32"
    forward = "fp32" if slow and backward != "bf16" else "input"
    if cfg.compile_scope != "auto":
        scope = cfg.compile_scope
    else:
        scope = "mlp_norms" if cpu else "layer"
    return DeviceChoices(kernels, forward, backward, scope, cfg.compile and cpu, bf16_compute, speed)


def role_bf16_speed(device: str, bf16_compute: bool, world_size: int) -> Bf16Speed | None:
    """This rank's :class:`Bf16Speed` with its ratio replaced by the largest (slowest) of the
    role's ranks, so every rank resolves the same choices; None unless a CPU rank computes
    in bf16. Collective when ``world_size > 1`` (call it on every rank, with the process
    group initialised)."""
    if device != "cpu" or not bf16_compute:
        return None
    mine = bf16_speed()
    if world_size <= 1:
        return mine
    import dataclasses

    import torch
    import torch.distributed as dist

    t = torch.tensor([mine.ratio], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dataclasses.replace(mine, ratio=float(t.item()))


def warning(choices: DeviceChoices, cfg: PathOptions, dtype_name: str, role: str, rank: int, *,
            backend: str) -> str | None:
    """The log message for a role computing in bf16 on a CPU where bf16 is slow (naming the
    measured slowdown, what asked for bf16 and what to set instead), or None."""
    if not choices.bf16_slow:
        return None
    asked = []
    if cfg.mixed_precision == "bf16":
        asked.append("mixed_precision: bf16")
    if dtype_name == "bfloat16":
        asked.append("model.dtype: bfloat16")
    explicit = [f"{k}: {v}" for k, v in (("cpu.kernels", cfg.cpu.kernels),
                                         ("cpu.attention_backward", cfg.cpu.attention_backward))
                if v in ("rlweave", "bf16")]
    msg = (f"{backend} backend: role {role} rank {rank} computes in bf16 on CPU ({', '.join(asked)}), but "
           f"{choices.speed.describe()}; use mixed_precision: none and model.dtype: float32 on this CPU. "
           "The auto CPU options take their fp32 paths")
    if explicit:
        msg += f"; the explicit {', '.join(explicit)} assume fast bf16 and are kept as set"
    return msg + "."
