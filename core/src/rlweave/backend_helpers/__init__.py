"""Pieces training backends share: the training-worker skeleton (:mod:`.training`: train step,
optimizer, offload, dtype table, what a backend must provide), agreeing on non-finite values
(:mod:`.finite`), the learning-rate schedule and its restore on resume (:mod:`.schedule`), the
rank's device (:mod:`.device`), loading DCP checkpoints without their pickles
(:mod:`.safe_dcp`), per-rank extra state (:mod:`.extra_state`), writing a Hugging Face model
directory from streamed tensors (:mod:`.hf_dir`), and the Hugging Face model layer of the
backends that train HF models (:mod:`.hf_model`: packing, varlen attention, heads,
micro-batches, shared prompts, outputs, log-probs). The package itself imports nothing;
:mod:`.training`, :mod:`.finite`, :mod:`.safe_dcp` and most of :mod:`.hf_model` import torch."""
