"""Shared algorithm helpers (pure torch, no Ray): turning rollouts into batches, loss token
weights, reward models as reward sources and exact-match evaluation. The math of an RL step
(estimators, policy losses, aggregations, KL) is in :mod:`rlweave.algo_parts`.

Import the submodules directly (``from rlweave.algo_helpers.weights import token_weights``); this package
module itself imports nothing heavy.
"""
