"""Rollout-side helpers shared by inference-engine plugins (light: no torch at import).

* :mod:`rlweave.engine_helpers.requests`: per-sample request preparation every engine applies the
  same way (long-prompt policy, response budget, stop ids, per-sample seeds).
* :mod:`rlweave.engine_helpers.consistency`: the train/rollout log-prob consistency metric.
"""
