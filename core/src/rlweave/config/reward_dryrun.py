"""Dry run of the configured rewards on the first record of the data they will score.

A reward is called during a run as ``fn(prompt=..., response=..., **record fields,
**rewards[i].args)``. Whether that call can work is known before any worker starts: this
module makes it once per reward and data file, with the file's first record and an empty
response, in the same sandboxed worker pool the run uses
(:class:`rlweave.sandbox.pool.RewardPool`, one worker, ``reward_runtime.timeout_s``). Which
files a reward scores is the algorithm's to say (``AlgorithmRecord.reward_data``; both
``data.train`` and ``data.eval`` when the algorithm is unknown).

Any outcome but a number is an issue at ``rewards.<i>`` naming the reward, the data file and
line, and what happened: the exception (a missing field such as ``answer``, an unexpected
keyword from ``rewards[].args``...), a timeout, a crash of the worker, or a reward that cannot
be imported. Only that a number comes back is checked, never the value. Imports no torch or
ray. Like the run's rewards, the worker is started with ``spawn``, so a script that calls
``load_config`` at import time needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlweave.config.errors import ConfigIssue
from rlweave.rewards.fields import reward_fields

if TYPE_CHECKING:  # pragma: no cover
    from rlweave.config.inputs import DataHead
    from rlweave.config.resolve import ResolvedPlugins
    from rlweave.config.schema import RunConfig

#: record keys that are not reward fields (the same as ``rlweave.algo_helpers.evaluate``, which needs torch)

Call = tuple[int, dict[str, Any]]


def sample_kwargs(record: dict[str, Any]) -> dict[str, Any]:
    """What a reward gets for ``record`` and an empty response (before ``rewards[].args``)."""
    prompt = record.get("prompt", record.get("query"))
    if prompt is None and isinstance(record.get("messages"), list):
        prompt = "".join(f"{m.get('role')}: {m.get('content')}\n" for m in record["messages"] if isinstance(m, dict))
    fields = reward_fields(record)
    return {"prompt": "" if prompt is None else str(prompt), "response": "", **fields}


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"


def _pool_run(targets: list[str], calls: list[Call], timeout_s: float, sandbox: Any = None) -> list[tuple[str, Any]]:
    from rlweave.sandbox.pool import RewardPool

    pool = RewardPool(targets, workers=1, timeout_s=timeout_s, sandbox=sandbox)
    try:
        return pool.run(calls)
    finally:
        pool.close()


def run_calls(targets: list[str], calls: list[Call], timeout_s: float, sandbox: Any = None) -> list[tuple[str, Any]]:
    """Outcomes of ``calls`` (see ``RewardPool.run``; ``sandbox``: the run's
    ``reward_runtime.sandbox``, so a reward is tried under the limits it will run under); a
    target that cannot be imported in a worker gives ``("import", message)`` for each of its
    calls and does not stop the others."""
    from rlweave.sandbox.pool import RewardWorkerError

    try:
        return _pool_run(targets, calls, timeout_s, sandbox)
    except RewardWorkerError as exc:
        if len(targets) == 1:
            return [("import", _last_line(str(exc)))] * len(calls)
    out: list[tuple[str, Any]] = [("import", "")] * len(calls)
    for t, target in enumerate(targets):  # one pool per target, to say which one fails
        mine = [k for k, (index, _) in enumerate(calls) if index == t]
        if not mine:
            continue
        for k, outcome in zip(mine, run_calls([target], [(0, calls[k][1]) for k in mine], timeout_s, sandbox)):
            out[k] = outcome
    return out


def _splits(resolved: ResolvedPlugins, cfg: RunConfig, source: str,
            issues: list[ConfigIssue]) -> tuple[str, ...]:
    record = resolved.algorithm
    if record is None:
        return ("train", "eval")
    try:
        return tuple(record.reward_data(resolved.algorithm_config or cfg.algorithm))
    except Exception as exc:  # a plugin bug: say whose
        issues.append(ConfigIssue(source, "algorithm", f"algorithm '{record.name}' failed to say which data its "
                                                        f"rewards score: {type(exc).__name__}: {exc}"))
        return ()


def dry_run_rewards(cfg: RunConfig, resolved: ResolvedPlugins, heads: dict[str, DataHead], source: str,
                    skip: Callable[[str], bool] = lambda path: False) -> list[ConfigIssue]:
    """Issues of calling each reward on the first record of each data file it scores."""
    from rlweave.rewards.loader import resolve_reward_target

    issues: list[ConfigIssue] = []
    splits = [s for s in _splits(resolved, cfg, source, issues) if s in heads]
    targets: list[str] = []
    calls: list[Call] = []
    where: list[tuple[int, DataHead]] = []
    for i, entry in enumerate(cfg.rewards):
        if skip(f"rewards.{i}") or i >= len(resolved.rewards):
            continue
        record = resolved.rewards[i]
        try:
            target = record.target if record is not None else resolve_reward_target(entry.name)
        except ValueError:
            continue  # pass two reported the name
        if target not in targets:
            targets.append(target)
        for split in splits:
            head = heads[split]
            calls.append((targets.index(target), {**sample_kwargs(head.records[0][1]), **entry.args}))
            where.append((i, head))
    if not calls:
        return issues
    try:
        outcomes = run_calls(targets, calls, cfg.reward_runtime.timeout_s, cfg.reward_runtime.sandbox)
    except Exception as exc:  # the pool itself could not run (no processes left...): say so, never crash
        return issues + [ConfigIssue(source, "rewards", f"the rewards' dry run could not run: {type(exc).__name__}: "
                                                        f"{exc}")]
    reported_import: set[int] = set()
    for (i, head), (status, payload) in zip(where, outcomes):
        name = cfg.rewards[i].name
        if status == "ok":
            continue
        if status == "import":
            if i not in reported_import:
                reported_import.add(i)
                issues.append(ConfigIssue(source, f"rewards.{i}", f"reward '{name}' cannot be imported in a reward "
                                                                   f"worker: {payload}"))
            continue
        what = {"error": "fails", "timeout": "times out", "crash": "crashes its worker"}.get(status, status)
        issues.append(ConfigIssue(source, f"rewards.{i}", f"reward '{name}' {what} on the first record of {head.key} "
                                                           f"({head.where(0)}) with an empty response: "
                                                           f"{_first_line(payload)}"))
    return issues
