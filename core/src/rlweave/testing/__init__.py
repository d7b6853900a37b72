"""Test helpers rlweave ships for plugin authors (imported only by tests).

* :mod:`rlweave.testing.engine_contract`: :class:`EngineContractSuite`, the pytest class
  every inference-engine plugin subclasses in its own tests.
* :mod:`rlweave.testing.reference`: transformers reference computations (greedy decoding,
  per-token log-probs) the suites compare against.

Importing this package is light; the suites import pytest, torch and transformers.
"""
