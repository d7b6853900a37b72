"""Shared algorithm helpers (pure torch, no Ray): turning rollouts into batches, KL
estimators, loss token weights and exact-match evaluation.

Import the submodules directly (``from rlweave.algo_helpers.kl import kl_penalty``); this package
module itself imports nothing heavy.
"""
