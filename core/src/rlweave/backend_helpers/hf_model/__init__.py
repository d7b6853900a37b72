"""The Hugging Face model layer every backend that trains an HF model uses (FSDP, DeepSpeed):
loading the three model kinds (:mod:`.modeling`, :mod:`.heads`), micro-batches by token budget
(:mod:`.micro`), exact varlen attention over packed rows (:mod:`.attention`, with its CPU
kernels in :mod:`.cpu`), shared prompts (:mod:`.prefix`), per-token outputs (:mod:`.outputs`,
:mod:`.logprob`), the shared preparation steps (:mod:`.prepare`), the worker part that ties
them together (:mod:`.worker`) and the options and validation helpers backends embed
(:mod:`.options`, :mod:`.config_json`; light).

What belongs to one backend stays in its plugin: sharding (FSDP2, ZeRO), sequence
parallelism (which plugs into the attention through :class:`.attention.SequenceSplit`),
mixture-of-experts layouts and kernels, LoRA, checkpoint formats. The package itself imports
nothing; :mod:`.options` and :mod:`.config_json` import no torch, the other modules do.
"""
