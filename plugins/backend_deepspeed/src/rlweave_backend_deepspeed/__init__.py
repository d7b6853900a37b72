"""rlweave training backend on DeepSpeed ZeRO (record ``deepspeed``).

The worker (:mod:`.worker`) runs the FSDP plugin's Hugging Face model layer (packed varlen
micro-batches, shared prompts, value and reward heads, export) inside a DeepSpeed engine:
ZeRO stages 1/2/3, optimizer and parameter offload to host memory, bf16 with fp32 master
weights. Importing this package imports neither torch nor deepspeed.
"""
