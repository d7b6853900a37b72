"""A toy training backend on :class:`rlweave.backend_helpers.training.TrainingSkeleton`, run on
spawned gloo ranks by ``test_backend_helpers_training.py``: a one-weight "model" whose per-token
log-prob is ``-softplus(w * id / 100 + b)``, one sample per micro-batch, gradients summed over
ranks in ``_clip`` (plain data parallelism)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.distributed as dist
from rlweave.backend_helpers.training import TrainingSkeleton
from rlweave.interfaces.backend import merge_metric
from rlweave.interfaces.worker import WorkerContext
from rlweave.testing.scenarios.batches import fixed_batch
from rlweave.testing.scenarios.losses import TemperedLogprobSum, nll_loss


class ToyWorker(TrainingSkeleton):
    backend = "toy"

    def init_model(self) -> None:
        self.cfg = SimpleNamespace(max_tokens_per_micro_batch=64)
        self.kind = "causal_lm"
        self.device = torch.device("cpu")
        self.init_distributed(force=True)
        torch.manual_seed(0)
        self.model = torch.nn.Linear(1, 1)
        self.step = 0
        self.offloaded = False
        if self.ctx.optim is not None:
            self._build_optimizer(self.ctx.optim)

    def _plan(self, batch, budget):
        return [[i] for i in range(len(batch))]

    def _logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        return -torch.nn.functional.softplus(self.model(ids.float().unsqueeze(-1) / 100.0).squeeze(-1))

    def _accumulate(self, batch, groups, n_micro, loss_fn, temperature, entropy):
        loss_sum, metrics = 0.0, {}
        for i in range(n_micro):
            if i < len(groups):
                mb = self._on_device(batch.select(groups[i]))
                out = SimpleNamespace(logprobs=self._logprobs(mb.token["input_ids"]) / temperature, entropy=None,
                                      values=None)
                loss, m = loss_fn(out, mb)
                if getattr(self, "poison", False):
                    loss = loss + float("nan")
                for k, v in m.items():
                    metrics[k] = merge_metric(k, metrics.get(k), float(v))
            else:
                loss = self.model.weight.sum() * 0.0
            loss.backward()
            loss_sum += float(loss.detach())
        return loss_sum, metrics

    def _clip(self) -> float:
        sq = 0.0
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            sq += float(p.grad.pow(2).sum())
        return math.sqrt(sq)

    # the operations the scenario does not call
    def compute_logprobs(self, batch, temperature=1.0, with_entropy=False):
        raise NotImplementedError

    def named_weights(self):
        raise NotImplementedError

    def save_checkpoint(self, path):
        raise NotImplementedError

    def load_checkpoint(self, path):
        raise NotImplementedError

    def save_hf(self, path):
        raise NotImplementedError


def _worker(ctx_kw: dict, optim: dict | None) -> ToyWorker:
    w = ToyWorker(WorkerContext(role="policy", options={}, model={}, seed=3,
                                extra={"optim": optim} if optim else {}, **ctx_kw))
    w.init_model()
    return w


def skeleton_scenario(ctx_kw: dict) -> dict:
    """Rank r trains on its share of one batch (rank 0: 4 samples, rank 1: 2): a normal step,
    a step whose loss is NaN on rank 1 only, and another normal step; then the temperature and
    no-optimizer refusals and offload/onload. Returns what rank 0 saw."""
    rank = ctx_kw["rank"]
    w = _worker(ctx_kw, {"lr": 0.1, "warmup_steps": 0})
    full = fixed_batch()
    mine = full.select([0, 1, 2, 3] if rank == 0 else [4, 5])
    res: dict = {"steps": []}
    params = lambda: [p.detach().clone() for p in w.model.parameters()]
    for poison in (False, True, False):
        w.poison = poison and rank == 1
        before = params()
        epoch = w.scheduler.last_epoch
        m = w.train_step(mine, nll_loss)
        changed = any(not torch.equal(a, b) for a, b in zip(before, params()))
        res["steps"].append({**m, "changed": changed, "scheduler_advanced": w.scheduler.last_epoch != epoch})
    res["step_count"] = w.step
    try:
        w.train_step(mine, TemperedLogprobSum(0.0))
    except ValueError as e:
        res["temperature_error"] = str(e)
    plain = _worker(ctx_kw, None)
    try:
        plain.train_step(mine, nll_loss)
    except RuntimeError as e:
        res["no_optimizer_error"] = str(e)
    res["offload"] = w.offload()
    res["offloaded"] = w.offloaded
    res["onload"] = w.onload()
    res["state_bytes"] = sum(p.numel() * p.element_size() for p in w.model.parameters()) + sum(
        v.numel() * v.element_size() for st in w.optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    return res
