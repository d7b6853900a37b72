"""A checkpoint booby-trapped with pickles is refused, and the code in them never runs
(``rlweave train --resume`` in a subprocess: tiny fp32 GRPO on CPU, HF engine, FSDP policy).

From one real checkpoint (step 2 of the shared ``reference_run``; its step 4 removed so that
``--resume`` picks it), one copy per place where a pickle could be read: the controller's
RNG file (``rng.pkl``, the old format), the FSDP per-rank state (``extra_rank0.pt``, the old
format), DCP's ``.metadata`` and one DCP non-tensor item (the AdamW ``lr``). Each planted
pickle runs ``touch TRAP`` when unpickled, and the ``COMPLETE`` marker is rewritten to match
(as an attacker would; checksums catch damage, not intent). Each resume must fail with exit
code 1 and an error naming the file, without traceback, and TRAP must not exist. Afterwards
the stock loader of each place (``pickle.load``, ``torch.load(weights_only=False)``, DCP's
``FileSystemReader``) runs on the same file and does create TRAP: the traps were live.

The first three resumes run with ``run.scheduler=in_process`` (the refusals are the loaders',
the same in every process); the last one (a pickle inside a DCP shard, read by the policy's
rank) goes through Ray, so an error raised in a worker reaches the user the same way.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import shutil
from pathlib import Path

import pytest
from rlweave.testing.runs import cli_env, leftovers, run_cli
from rlweave.testing.tamper import malicious_pickle, reseal

pytestmark = pytest.mark.slow
CKPT = Path("checkpoints") / "step_000002"
POLICY = CKPT / "roles" / "policy"
LR_ITEM = "optim.param_groups.0.lr"
REPO = Path(__file__).resolve().parents[2]


def _plant(run: Path, place: str, trap: Path) -> str:
    """Plant a trap in ``place`` of the checkpoint of run directory ``run``; returns the name
    the error must show."""
    if place == "rng.pkl":
        (run / CKPT / "rng.json").unlink(missing_ok=True)
        (run / CKPT / "rng.pkl").write_bytes(malicious_pickle(trap))
        return "rng.pkl"
    if place == "extra_rank0.pt":
        for name in ("extra_rank0.json", "extra_rank0.safetensors"):
            (run / POLICY / name).unlink(missing_ok=True)
        (run / POLICY / "extra_rank0.pt").write_bytes(malicious_pickle(trap, torch_format=True))
        return "extra_rank0.pt"
    if place == ".metadata":
        (run / POLICY / ".metadata").write_bytes(malicious_pickle(trap))
        return ".metadata"
    from rlweave.testing.helper_modules import import_helper

    plant_byte_item = import_helper(REPO / "plugins/backend_fsdp/tests/dcp_tamper.py").plant_byte_item

    plant_byte_item(run / POLICY, LR_ITEM, malicious_pickle(trap, torch_format=True))
    return LR_ITEM


def _stock_load(run: Path, place: str) -> None:
    """What the loaders before this guard did with ``place`` (runs the trap)."""
    import torch

    with contextlib.suppress(Exception):  # what the trap returns is no valid state
        if place == "rng.pkl":
            with open(run / CKPT / "rng.pkl", "rb") as f:
                pickle.load(f)
        elif place == "extra_rank0.pt":
            torch.load(run / POLICY / "extra_rank0.pt", weights_only=False)
        elif place == ".metadata":
            from torch.distributed.checkpoint import FileSystemReader

            FileSystemReader(str(run / POLICY)).read_metadata()
        else:
            from rlweave.backend_helpers import safe_dcp

            md = safe_dcp.read_metadata(run / POLICY)
            info = next(v for k, v in md.storage_data.items() if k.fqn == LR_ITEM)
            with open(run / POLICY / info.relative_path, "rb") as f:
                f.seek(info.offset)
                torch.load(io.BytesIO(f.read(info.length)), weights_only=False)  # DefaultLoadPlanner.load_bytes


def test_malicious_checkpoint_is_refused(guarantee, reference_run, tmp_path):
    cfg = reference_run.config
    base = reference_run.copy(tmp_path / "base")
    shutil.rmtree(base / "checkpoints" / "step_000004")
    env = cli_env()
    places = ["rng.pkl", "extra_rank0.pt", ".metadata", LR_ITEM]
    results = {}
    pids: set[int] = set()
    try:
        for i, place in enumerate(places):
            run = tmp_path / f"trap{i}"
            shutil.copytree(base, run)
            trap = tmp_path / f"code-ran-{i}"
            name = _plant(run, place, trap)
            reseal(run / CKPT)
            scheduler = "ray" if place == LR_ITEM else "in_process"
            args = ["train", str(cfg), "--resume", "--run-dir", str(run), f"run.scheduler={scheduler}"]
            rc, out, seen = run_cli(args, env, timeout=600)
            pids |= seen
            results[place] = (rc, out, name, trap.exists())
            _stock_load(run, place)
            results[place] += (trap.exists(),)
    finally:
        left = leftovers(pids)
    assert not left, f"processes left behind: {left}"
    for place, (rc, out, name, ran, stock_ran) in results.items():
        assert not ran, f"{place}: the planted pickle ran during --resume"
        assert rc == 1 and "Traceback" not in out, (place, out[-4000:])
        error = next((line for line in out.splitlines() if line.startswith("error:")), "")
        assert name in error and ("never loaded" in error or "refusing to unpickle" in error), (place, out[-4000:])
        assert stock_ran, f"{place}: the stock loader did not run the trap: the test proves nothing"
    guarantee("a malicious checkpoint is refused",
              f"{len(results)} of {len(places)} booby-trapped checkpoints (pickle in {', '.join(places)}; marker "
              "resealed) refused by --resume with exit code 1, the file named, no traceback; trap code ran 0 times "
              f"(the stock loaders run it: {sum(r[4] for r in results.values())} of {len(places)})")
