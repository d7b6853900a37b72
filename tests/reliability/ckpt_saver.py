"""Checkpoint saver and checker for the SIGKILL-during-save test (run as a script).

A server that imports torch once and forks one child per command, so each of many trials
costs milliseconds, not an interpreter start. Commands on stdin, one per line; replies on
stdout:

* ``save ROOT SEED`` -> ``pid PID``: the child trains a small fully_shard MLP (one rank,
  gloo) one step at a time and saves a checkpoint after each step the way the run loop does
  (``CheckpointManager.begin`` -> FSDP ``checkpoint.save`` into ``roles/policy`` ->
  ``state.json`` + ``rng.json`` -> ``commit``, keep_last 2), printing ``committed STEP``
  after each, forever (the test SIGKILLs it).
* ``reap PID`` -> ``exited STATUS``.
* ``check ROOT SEED`` -> ``ok STEP`` or ``fail MESSAGE``: a child opens ROOT with a new
  manager (removes partial saves), takes ``resumable()``, loads it into a fresh model and
  optimizer and compares them bitwise with a replay of STEP training steps.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch


def _build(seed: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(4)])
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model, opt, seed: int, step: int) -> None:
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    model(torch.randn(8, 384, generator=g)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def _init() -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _save_forever(root: str, seed: int) -> None:
    from rlweave.runner import rng
    from rlweave.runner.checkpoint import CheckpointManager, write_json
    from rlweave_backend_fsdp import checkpoint

    _init()
    mgr = CheckpointManager(root, keep_last=2)
    model, opt = _build(seed)
    step = 0
    while True:
        step += 1
        _step(model, opt, seed, step)
        tmp = mgr.begin(step)
        checkpoint.save(str(tmp / "roles" / "policy"), model, opt, {"step": step, "scheduler": None}, 0)
        write_json(tmp / "state.json", {"step": step})
        write_json(tmp / "rng.json", rng.to_json(rng.get_state()))
        mgr.commit(tmp, step)
        print(f"committed {step}", flush=True)


def _check(root: str, seed: int) -> str:
    from rlweave.runner import rng
    from rlweave.runner.checkpoint import CheckpointManager, read_state_json
    from rlweave_backend_fsdp import checkpoint

    _init()
    path = CheckpointManager(root, keep_last=2).resumable()
    if path is None:
        return "fail no complete checkpoint"
    step = read_state_json(path / "state.json")["step"]
    rng.from_json(read_state_json(path / "rng.json"))
    ref, ref_opt = _build(seed)
    for s in range(1, step + 1):
        _step(ref, ref_opt, seed, s)
    model, opt = _build(seed + 1)
    extra = checkpoint.load(str(path / "roles" / "policy"), model, opt, 0)
    if extra["step"] != step:
        return f"fail {path.name}: extra step {extra['step']}"
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        if not torch.equal(a.full_tensor(), b.full_tensor()):
            return f"fail {path.name}: parameter {name} differs"
        sa, sb = ref_opt.state[a], opt.state[b]
        if not all(torch.equal(sa[k].full_tensor() if hasattr(sa[k], "full_tensor") else sa[k],
                               sb[k].full_tensor() if hasattr(sb[k], "full_tensor") else sb[k]) for k in sa):
            return f"fail {path.name}: optimizer state of {name} differs"
    return f"ok {step}"


def _child(fn, *args) -> None:
    code = 0
    try:
        out = fn(*args)
        if out is not None:
            print(out, flush=True)
    except BaseException:  # noqa: BLE001 - reported to the test
        print("fail " + traceback.format_exc().replace("\n", " | "), flush=True)
        code = 1
    os._exit(code)


def _warm_imports() -> None:
    """Import, once in the server, everything the children use (a fork then costs ms;
    ``torch._dynamo`` is what ``fully_shard`` imports on first use, ~1.4 s)."""
    import importlib

    for name in ("numpy", "safetensors.torch", "torch._dynamo", "torch.distributed.checkpoint",
                 "torch.distributed.fsdp", "rlweave.runner.checkpoint", "rlweave.runner.rng",
                 "rlweave_backend_fsdp.checkpoint"):
        importlib.import_module(name)


def main() -> None:
    _warm_imports()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(f"exited {status}", flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            _child(_save_forever if cmd == "save" else _check, args[0], int(args[1]))
        if cmd == "save":
            print(f"pid {pid}", flush=True)
        else:
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
