"""Sandboxed worker processes that run user code: reward functions (:mod:`rlweave.rewards`) and
the tools of multi-turn environments (:mod:`rlweave.environments.tools`) alike.

* :mod:`.pool`: :class:`~rlweave.sandbox.pool.RewardPool`, a pool of worker processes with
  per-call timeouts, restarts of lost workers and batching (the name is historical: it runs any
  ``module:function`` target);
* :mod:`.worker`: the worker process's loop and how it imports a target;
* :mod:`.limits`: what a worker enters before running user code (its own process group, memory,
  CPU time, a private directory); :mod:`.guard`: the audit hook that refuses new processes and
  network access; :mod:`.proctree`: finding and killing what a call left running.

Stdlib only, and nothing here imports the rest of rlweave: a worker process starts fast.
"""
