"""Named algorithm parts: advantage estimators, policy losses, KL estimators, loss
aggregations and rollout corrections, each a plain tensor function selected by name in YAML.

Five families, one registry each (a plugin kind with its own hook, see
:mod:`rlweave.plugins.hookspecs`); the built-in entries register through the same hooks as a
third party's (:mod:`rlweave.algo_parts.plugin`). A config names an entry
(``algorithm.advantage: rloo``), a ``module:function`` of the user's own, or a mapping with
the entry's options (``algorithm.policy_loss: {name: gspo, clip_high: 4.0e-4}``);
:mod:`rlweave.algo_parts.spec` validates and resolves those names.

Calling conventions (all tensors on one device; ``T`` packed tokens of ``n`` samples laid
out by ``cu_seqlens``):

* advantage estimator ``fn(*, scores, groups, mask, cu_seqlens, token_rewards, values,
  baseline, **options) -> (advantages (T,), returns (T,) | None)``
  (:mod:`.advantages`);
* policy loss ``fn(logp, old_logp, advantages, *, mask, cu_seqlens, **options) ->
  (per-token loss (T,), {"clipped": (T,), "ratio": (T,)})`` (:mod:`.policy_losses`);
* KL estimator ``fn(logp, ref_logp) -> (T,)`` (:mod:`.kl`);
* loss aggregation ``fn(mask, cu_seqlens, *, max_len, **options) -> weights (T,)``: the
  token weights of :mod:`rlweave.interfaces.backend`'s convention (:mod:`.aggregation`);
* rollout correction ``fn(log_ratio, *, active, sample_index, num_samples, **options) ->
  Correction``: the stop-gradient factor of each token's policy-gradient term
  (:mod:`.corrections`, applied by :mod:`.offpolicy`).

Statistics follow one convention everywhere (:mod:`.stats`). This package imports no torch at
import time; the function modules do.
"""
