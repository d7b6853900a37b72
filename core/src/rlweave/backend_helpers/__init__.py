"""Pieces training backends share: the training-worker skeleton (:mod:`.training`: train step,
optimizer, offload, dtype table), agreeing on non-finite values (:mod:`.finite`), the
learning-rate schedule (:mod:`.schedule`), the rank's device (:mod:`.device`), loading DCP
checkpoints without their pickles (:mod:`.safe_dcp`), per-rank extra state
(:mod:`.extra_state`) and writing a Hugging Face model directory from streamed tensors
(:mod:`.hf_dir`). The package itself imports nothing; :mod:`.training`, :mod:`.finite` and
:mod:`.safe_dcp` import torch."""
