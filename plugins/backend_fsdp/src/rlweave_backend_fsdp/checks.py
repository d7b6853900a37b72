"""What the ``fsdp`` backend refuses at validation time (light at import: no torch).

:func:`check_role` is the backend record's ``check``: it runs in ``rlweave validate`` and
before any worker starts, after the role's options were validated.
"""

from __future__ import annotations

from typing import Any

from rlweave.backend_helpers.hf_model.config_json import moe_experts, text_config

from rlweave_backend_fsdp.lora_check import lora_target_problems


def kv_repeat(n_heads: int, n_kv: int, sp: int) -> int:
    """How many times each key/value head is repeated so that ``sp`` ranks get whole heads:
    1 when ``n_kv`` is a multiple of ``sp``, else ``sp / n_kv``. Raises ValueError naming the
    numbers when the heads cannot be split."""
    if n_heads % sp:
        raise ValueError(f"{n_heads} attention heads are not divisible by parallel.sp={sp}")
    if n_kv % sp == 0:
        return 1
    if sp % n_kv:
        raise ValueError(f"{n_kv} key/value heads cannot be split over parallel.sp={sp}: sp must divide them or "
                         "be a multiple of them")
    return sp // n_kv


def _heads(model: Any) -> tuple[int, int] | None:
    """``(attention heads, key/value heads)`` from a local model directory's config.json."""
    data = text_config(model) or {}
    heads = data.get("num_attention_heads")
    if not heads:
        return None
    return int(heads), int(data.get("num_key_value_heads") or heads)


def moe_problems(sp: int, experts: int | None) -> list[tuple[str, str]]:
    """``("parallel.sp", message)`` when an MoE model (``experts`` routed experts) is asked to
    run with sequence parallelism, which the backend does not support for MoE yet."""
    if sp <= 1 or not experts:
        return []
    msg = (f"mixture-of-experts models ({experts} experts) with parallel.sp={sp} are not supported yet; "
           "set parallel.sp: 1")
    return [("parallel.sp", msg)]


def sp_problems(sp: int, options: dict[str, Any], heads: tuple[int, int] | None) -> list[tuple[str, str]]:
    """``(options key or "parallel.sp", message)`` for each reason sequence parallelism of size
    ``sp`` cannot run with these backend ``options`` and ``(heads, key/value heads)``."""
    if sp <= 1:
        return []
    out = []
    where = f"parallel.sp={sp}"
    if not options.get("use_packing", True):
        out.append(("options.use_packing", f"{where} needs packed rows; set use_packing: true"))
    attn = options.get("attn_implementation", "auto")
    if attn not in ("auto", "varlen"):
        out.append(("options.attn_implementation",
                    f"{where} needs rlweave's varlen attention; set auto or varlen, not {attn}"))
    if heads is not None:
        try:
            kv_repeat(heads[0], heads[1], sp)
        except ValueError as exc:
            out.append(("parallel.sp", str(exc)))
    return out


def check_role(role: str, section: Any, model: Any) -> list[tuple[str, str]]:
    """Sequence parallelism (``parallel.sp``) needs packed rows, rlweave's varlen attention and
    heads that split over the group (key/value heads repeated when fewer than ``sp``), and a
    dense model (MoE models with ``sp > 1`` are not supported yet); LoRA target modules must be
    linear layers of the model (:mod:`rlweave_backend_fsdp.lora_check`)."""
    sp = int(section.parallel.get("sp", 1))
    heads = _heads(model) if sp > 1 else None
    experts = moe_experts(model) if sp > 1 else None
    src = f" (model {model.path})" if heads is not None or experts else ""
    problems = sp_problems(sp, section.options or {}, heads) + moe_problems(sp, experts)
    return [(f"roles.{role}.{key}", f"role {role!r}: {msg}{src if key == 'parallel.sp' else ''}")
            for key, msg in problems] + lora_target_problems(role, section, model)
