"""Commands that use a trained model, outside a run (registered in :mod:`rlweave.cli`).

* ``rlweave generate`` (:mod:`.generate`): offline batch generation into a resumable jsonl file.
* ``rlweave export`` (:mod:`.export`): a run's checkpoint to a Hugging Face directory.
* ``rlweave eval`` (:mod:`.evaluate`): exact match, mean reward and pass@k over a data set.

Shared pieces: :mod:`.errors` (one-line user errors, exit code 2), :mod:`.plugins` (the
plugin manager of the command line, ``rlweave.cli`` included), :mod:`.source` (which model a
``CONFIG_OR_MODEL`` argument names), :mod:`.run_config` (a run directory's config),
:mod:`.engine` (an inference engine plugin driven in this process, no Ray), :mod:`.records`
(prompt records). Importing any of these modules imports no torch, ray or vllm; each command
imports them when it runs.
"""
