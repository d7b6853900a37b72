"""Pieces training backends share: the learning-rate schedule (:mod:`.schedule`) and writing a
Hugging Face model directory from streamed tensors (:mod:`.hf_dir`). Light: torch is imported
inside the functions that need it."""
