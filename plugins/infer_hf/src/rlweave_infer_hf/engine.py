"""``HFEngine``: the rollout contract on transformers ``generate``.

Small and dependable rather than fast: it starts in about a second, runs wherever
transformers runs, and is the reference the vLLM engine is tested against.

Behaviour beyond :class:`rlweave.interfaces.engine.RolloutEngine`:

* **Log-probs.** ``logprobs_mode: processed`` (default) reports, for each sampled token,
  ``log_softmax`` of the scores it was sampled from: logits / temperature, restricted to the
  top-k / top-p set. Without top-k/top-p this is exactly ``log_softmax(logits / T)`` on the
  same tokens, what a training backend computes with ``compute_logprobs(temperature=T)``.
  Greedy (``temperature=0``) reports ``log_softmax(logits)``. ``raw`` always reports
  ``log_softmax(logits)``. vLLM's engine reports the same quantities.
* **Seeds.** A seeded call is reproducible: the same prompts, params and weights give the
  same tokens. Samples of one micro-batch share one torch generator, so unlike vLLM a
  sample's tokens also depend on the rest of its micro-batch.
* **Token budget and abort.** ``SamplingParams.token_budget`` caps each sample's new tokens
  in the call (:func:`rlweave.engine_helpers.requests.plan_requests`). :meth:`abort`, from
  another thread, stops the call in progress at its next decoding step (a transformers
  ``StoppingCriteria`` that reads the call's stop flag ends every row): rows that had not
  ended with a stop token or reached their limit come back ``"aborted"`` with their tokens
  and log-probs so far, and micro-batches not started yet come back ``"aborted"`` empty.
  Calls from several threads run one at a time (:class:`~rlweave.engine_helpers.requests.CallRegistry`).
* **Versions and in-flight weights.** Every token carries the ``weight_version`` of the
  weights that produced it (``Generation.versions``). The engine has a control plane
  (``RolloutEngine.control_plane``): a weight sync that arrives while a call runs lands
  between two decoding steps (the same ``StoppingCriteria`` hook parks the call while the
  weights are copied in place), and the call goes on with the new weights and its KV cache.
* **Routing.** With ``SamplingParams.return_routing`` (MoE models), each generation carries the
  experts every prompt and response token was routed to (``Generation.routing``: the prefill's
  routing for the prompt, each decoding step's for the token it read; :mod:`.routing`).
* **Sleep.** Nothing persists between calls but the weights. On CUDA, ``sleep(level=2)``
  moves the weights to host memory and ``wake_up`` brings them back; on CPU there is nothing
  to release and ``sleep`` reports ``freed_bytes: 0``.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Iterable

from rlweave.devices.cpu import slow_bf16_warning
from rlweave.engine_helpers.requests import (
    CallRegistry,
    SampleRequest,
    eos_token_ids,
    error_generation,
    finish_generation,
    group_generations,
    plan_requests,
    stop_token_ids,
)
from rlweave.engine_helpers.vision import image_inputs
from rlweave.interfaces.engine import Generation, RolloutEngine, SamplingParams

from rlweave_infer_hf.config import HFEngineConfig

log = logging.getLogger(__name__)


class HFEngine(RolloutEngine):
    """One replica (world size 1 per replica; several replicas are data parallel)."""

    engine_name = "hf"
    control_plane = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cfg = ctx.options_as(HFEngineConfig)
        self.model = None
        self._asleep = False
        self._calls = CallRegistry()
        self._adapter: str | None = None  # the LoRA adapter generate applies (weight_sync.lora: adapter)
        self._adapter_ids = itertools.count(1)

    # ---------------------------------------------------------------- set-up
    @property
    def where(self) -> str:
        return f"role {self.ctx.role} rank {self.ctx.rank} ({self.engine_name} engine)"

    def init_engine(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        path = self.ctx.model.get("path")
        if not path:
            raise ValueError(f"{self.where}: no model path (set model.path or roles.{self.ctx.role}.model.path)")
        dtype_name = self.cfg.dtype if self.cfg.dtype != "auto" else self.ctx.model.get("dtype", "float32")
        self.device = torch.device("cuda" if self.ctx.device == "cuda" and torch.cuda.is_available() else "cpu")
        t0 = time.perf_counter()
        from rlweave.data.vision import is_vision_model

        auto = AutoModelForCausalLM
        if is_vision_model(path):
            from transformers import AutoModelForImageTextToText as auto
        self.model = auto.from_pretrained(
            path, dtype=getattr(torch, dtype_name), trust_remote_code=bool(self.ctx.model.get("trust_remote_code"))
        )
        self.model.to(self.device).eval()
        # generate() fills unset fields from the model's own generation config (EOS, top-k...);
        # every call here sets all it needs, so start from an empty one.
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig()
        self.dtype = getattr(torch, dtype_name)
        slow = slow_bf16_warning(self.where, dtype_name, self.device.type)
        if slow:
            log.warning(slow)
        self.eos_ids = eos_token_ids(path)
        limit = self.cfg.max_model_len or getattr(self.model.config, "max_position_embeddings", None) or 2048
        self._max_model_len = int(limit)
        self.start_seconds = time.perf_counter() - t0

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def _require_model(self):
        if self.model is None:
            raise RuntimeError(f"{self.where}: init_engine() was not called")
        if self._asleep:
            raise RuntimeError(f"{self.where}: engine is asleep; call wake_up() before generate/load_weights")
        return self.model

    # -------------------------------------------------------------- generate
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        self._require_model()
        reqs = plan_requests(prompts, params, self.max_model_len, self.cfg.long_prompt, where=self.where)
        stops = stop_token_ids(params, self.eos_ids)
        gens: list[Generation | None] = [None] * len(reqs)
        todo = [j for j, r in enumerate(reqs) if r.error is None]
        for j in [j for j, r in enumerate(reqs) if r.error is not None]:
            gens[j] = error_generation(reqs[j])
        # similar lengths together: less padding, fewer wasted steps
        todo.sort(key=lambda j: len(reqs[j].prompt_ids))
        chunks = micro_batches([len(reqs[j].prompt_ids) + reqs[j].max_new_tokens for j in todo],
                               self.cfg.max_batch_size, self.cfg.max_batch_tokens)
        seed = params.seed if params.seed is not None else self.cfg.seed
        if seed is None:
            seed = self.ctx.seed
        with self._calls.call() as stop_flag, self.step_gate.running():
            for b, (start, stop) in enumerate(chunks):
                chunk = todo[start:stop]
                self.step_gate.boundary()
                if stop_flag.is_set():  # aborted before this micro-batch started
                    outs = [finish_generation(reqs[j], [], [], stops, self.weight_version, aborted=True) for j in chunk]
                else:
                    batch = [reqs[j] for j in chunk]
                    outs = self._generate_batch(batch, params, stops, seed * 7919 + b, stop_flag)
                for j, g in zip(chunk, outs):
                    gens[j] = g
        return group_generations(reqs, gens, len(prompts))

    def abort(self) -> int:
        """Stop the ``generate`` call in progress at its next decoding step (thread-safe);
        returns the number of calls asked (0 when idle: the next call is unaffected)."""
        return self._calls.abort_all()

    def _generate_batch(
        self,
        reqs: list[SampleRequest],
        params: SamplingParams,
        stops: list[int],
        seed: int,
        stop_flag: Any = None,
    ) -> list[Generation]:
        """One micro-batch; after every decoding step the weight version is noted and waiting
        weight updates land (``step_gate.boundary()``)."""
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        model = self.model
        width = max(len(r.prompt_ids) for r in reqs)
        pad_id = stops[0] if stops else 0
        ids = torch.full((len(reqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for row, r in enumerate(reqs):  # left padding
            ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids) :] = 1
        greedy = params.temperature == 0
        budget = max(r.max_new_tokens for r in reqs)
        gc = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else float(params.temperature),
            top_k=None if greedy else (0 if params.top_k == -1 else int(params.top_k)),  # None would mean 50
            top_p=None if greedy else float(params.top_p),
            max_new_tokens=budget,
            min_new_tokens=0,
            eos_token_id=stops or None,
            pad_token_id=pad_id,
            bos_token_id=None,
            num_beams=1,
            repetition_penalty=None,
            return_dict_in_generate=True,
            output_scores=self.cfg.logprobs_mode == "processed",
            output_logits=self.cfg.logprobs_mode == "raw",
            use_cache=True,
        )
        versions: list[int] = []  # the weights' version at each decoding step

        def after_step() -> None:
            versions.append(self.weight_version)
            self.step_gate.boundary()

        import contextlib

        from rlweave_infer_hf.routing import GenerateRouting

        recorder = GenerateRouting(model, len(reqs), self.where) if params.return_routing else None
        with torch.no_grad(), torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]), \
                (recorder or contextlib.nullcontext()):
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                **image_inputs(model, [r.mm for r in reqs], ids.to(self.device), self.where),
                generation_config=gc,
                stopping_criteria=StoppingCriteriaList([_after_step(stop_flag, after_step)]),
            )
        aborted = stop_flag is not None and stop_flag.is_set()
        steps = out.scores if self.cfg.logprobs_mode == "processed" else out.logits
        new = out.sequences[:, width:].cpu()
        if steps:
            scores = torch.stack([s.float() for s in steps], dim=1).cpu()  # (B, steps, V)
            lp = torch.log_softmax(scores, dim=-1).gather(-1, new[:, : scores.shape[1], None]).squeeze(-1)
        else:
            lp = torch.zeros_like(new, dtype=torch.float32)
        versions += [self.weight_version] * (new.shape[1] - len(versions))
        grid = recorder.grid() if recorder is not None else None
        result = []
        for row, r in enumerate(reqs):
            gen = finish_generation(r, new[row].tolist(), lp[row].tolist(), stops, versions[:new.shape[1]],
                                    aborted=aborted)
            if grid is not None:
                gen.routing = recorder.sample(grid, row, width, len(r.prompt_ids), len(gen.token_ids))
            result.append(gen)
        return result

    # --------------------------------------------------------------- weights
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        """Copy tensors into the parameters of the same (HF) name, in place.

        Tied weights are reachable under both names. MoE experts may come in checkpoint
        names, one matrix per expert (``...experts.3.up_proj.weight``): each fills its part of
        the model's stacked expert parameter (:mod:`rlweave_infer_hf.expert_names`). Unknown
        names or shape mismatches raise ``ValueError`` naming the tensor before anything is
        copied from later tensors; tensors copied before the failing one stay copied."""
        import torch

        from rlweave_infer_hf.expert_names import expert_slot, renamed

        model = self._require_model()
        targets = model.state_dict(keep_vars=True)
        count, nbytes = 0, 0
        with torch.no_grad(), self.step_gate.update():  # between two decoding steps of a running call
            for name, tensor in named_tensors:
                dst = next((targets[n] for n in renamed(name) if n in targets), None)
                if dst is None:
                    try:
                        slot = expert_slot(model, targets, name)
                    except ValueError as exc:
                        raise ValueError(f"{self.where}: load_weights: {exc}") from None
                    dst = slot[1] if slot is not None else None
                if dst is None:
                    raise ValueError(f"{self.where}: load_weights got unknown tensor {name!r}")
                if tuple(dst.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"{self.where}: load_weights {name!r} has shape {tuple(tensor.shape)}, "
                        f"model expects {tuple(dst.shape)}"
                    )
                dst.data.copy_(tensor.to(device=dst.device, dtype=dst.dtype))  # a view writes through
                count += 1
                nbytes += tensor.numel() * tensor.element_size()
        return {"tensors": count, "bytes": nbytes}

    def load_adapter(self, folder: str, sha256: str) -> dict[str, Any]:
        """Generate from now on with the PEFT adapter in ``folder`` applied to the base model
        (``weight_sync.lora: adapter``, :mod:`rlweave.weight_sync.adapter`), through transformers'
        PEFT integration. Its ``adapter_model.safetensors`` must have the SHA-256 ``sha256`` (else
        WeightSyncError, and the adapter applied before stays); the previous adapter is deleted.
        Returns ``bytes`` and ``seconds``."""
        from rlweave.weight_sync.adapter import verify_adapter

        model = self._require_model()
        t0 = time.perf_counter()
        weights = verify_adapter(folder, sha256, self.where)
        name = f"rlweave-adapter-{next(self._adapter_ids)}"
        model.load_adapter(str(folder), adapter_name=name)
        model.set_adapter(name)
        previous, self._adapter = self._adapter, name
        if previous is not None:
            model.delete_adapter(previous)
        return {"bytes": weights.stat().st_size, "seconds": time.perf_counter() - t0}

    # ----------------------------------------------------------- sleep/wake
    def sleep(self, level: int = 1) -> dict[str, Any]:
        model = self._require_model()
        if level >= 2 and self.device.type == "cuda":
            freed = sum(p.numel() * p.element_size() for p in model.parameters())
            model.to("cpu")
            self._asleep = True
            return {"freed_bytes": int(freed), "level": level}
        return {"freed_bytes": 0, "level": level, "note": "nothing to release (no persistent KV cache on this device)"}

    def wake_up(self) -> None:
        if self._asleep and self.model is not None:
            self.model.to(self.device)
        self._asleep = False

    def health(self) -> dict[str, Any]:
        info = self.ping()
        info.update(engine=self.engine_name, ready=self.model is not None, asleep=self._asleep)
        return info

    def shutdown(self) -> None:
        self.model = None
        super().shutdown()


def micro_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[tuple[int, int]]:
    """Cut samples, in order, into forward batches ``[start, stop)``: consecutive samples while
    the batch has at most ``max_rows`` rows and ``rows x longest length <= max_tokens`` (the
    padded batch a ``generate`` call holds); a sample longer than ``max_tokens`` alone gets a
    batch of its own."""
    out: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        longest = max(longest, n)
        if i > start and (i - start >= max_rows or (i - start + 1) * longest > max_tokens):
            out.append((start, i))
            start, longest = i, n
    if lengths:
        out.append((start, len(lengths)))
    return out


def _after_step(flag: Any, hook: Any):
    """A transformers ``StoppingCriteria`` called after each decoding step: runs ``hook()``,
    then ends every row once ``flag`` (a ``threading.Event``, or None: never) is set."""
    import torch
    from transformers import StoppingCriteria

    class AfterStep(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            hook()
            stop = flag is not None and flag.is_set()
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return AfterStep()
