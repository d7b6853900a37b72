"""Test helpers rlweave ships for plugin authors (imported by tests, benchmarks and the builders
of the examples' tiny models).

* :mod:`rlweave.testing.engine_contract`: :class:`EngineContractSuite`, the pytest class
  every inference-engine plugin subclasses in its own tests.
* :mod:`rlweave.testing.backend_contract`: :class:`BackendContractSuite`, the same for training
  backends (its rank side: :mod:`rlweave.testing.scenarios.contract`).
* :mod:`rlweave.testing.reference`: transformers reference computations (greedy decoding,
  per-token log-probs) the suites compare against.
* :mod:`rlweave.testing.tiny_model`: tiny random Qwen2 and MoE checkpoints (no downloads) for
  tests, benchmarks and examples, with a character-level tokenizer trained locally by
  :mod:`rlweave.testing.tiny_tokenizer` where a model needs one (the examples).
* :mod:`rlweave.testing.scenarios`: what every training backend's multi-rank test scenarios
  share (batches, losses, transformers references, a worker built by backend name), run on
  spawned ranks by :func:`rlweave.testing.ranks.run_ranks`; a backend keeps its own scenarios
  beside its tests, loaded with :func:`rlweave.testing.helper_modules.import_helper`.
* :mod:`rlweave.testing.workers`: tiny probe workers for scheduler and weight-sync tests.
* :mod:`rlweave.testing.runs`: drive ``rlweave`` in a subprocess and find what outlived it.
* :mod:`rlweave.testing.chaos`: SIGKILL a run's processes (ranks, reward workers, the controller)
  at random moments from a seeded plan, resume it, and check what it trained and left behind.
* :mod:`rlweave.testing.tamper`: damage and booby-trap checkpoints.
* :mod:`rlweave.testing.config_reach`, :mod:`rlweave.testing.config_keys` and
  :mod:`rlweave.testing.recorded_run`: the config mutation test (every key reaches its reader).

Importing this package is light; the suites import pytest, torch and transformers.
"""
