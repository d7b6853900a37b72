"""The agent rollout on real components: the real HTTP endpoint, the stock ``openai`` client, the HF
engine on a tiny model in this process. Over 200 scripted episodes (tool calls, ``n`` > 1, parallel
requests, edited histories, the completions endpoint, a non-append-only chat template) the trained
ids are the sampled ids, each sampled turn right after the ids it continued, and the loss mask
covers exactly the model's tokens."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from rlweave.testing.helper_modules import import_helper

pytest.importorskip("rlweave_infer_hf")
pytest.importorskip("openai")
pytest.importorskip("fastapi")
scn = import_helper(Path(__file__).with_name("agent_scenarios.py"))
#: the default template with the number of messages written first: every turn changes the history
COUNTING = ("{{ messages|length }}|{% for m in messages %}{% if m['role'] == 'assistant' %}"
            "{{ m['content'] + eos_token }}{% else %}{{ m['content'] }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rlweave.interfaces.worker import WorkerContext
    from rlweave.testing.tiny_model import build_tiny_qwen2
    from rlweave.testing.tiny_tokenizer import char_tokenizer
    from rlweave_infer_hf.engine import HFEngine

    tok = char_tokenizer(["0123456789+-= |"])
    path = str(build_tiny_qwen2(tmp_path_factory.mktemp("agent") / "m", tokenizer=tok, hidden=64, heads=2,
                                kv_heads=1, seed=3))
    eng = HFEngine(WorkerContext(role="rollout", options={"max_model_len": 256},
                                 model={"path": path, "dtype": "float32"}, seed=1))
    eng.init_engine()
    yield eng, tok
    eng.shutdown()


def _episodes(engine, tok, records, n, agent, timeout_s=120.0, delay_s=0.0):
    """The agent rollout's groups, batch and engine calls (each call ``delay_s`` late: a busy engine)."""
    from rlweave.algo_helpers.agent.rollout import AgentRollout
    from rlweave.algo_helpers.multi_turn import episodes_to_batch
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
    from rlweave.interfaces.engine import SamplingParams

    calls = []

    def generate(prompts, params):
        time.sleep(delay_s)
        gens = engine.generate(prompts, params)
        calls.append(([list(p) for p in prompts], gens))
        return gens

    cfg = MultiTurnConfig.model_validate({"agent": {"target": "x:y", "parser": f"{scn.__file__}:every_turn_calls",
                                                    "timeout_s": timeout_s}, "max_turns": 6, "max_total_tokens": 200})
    rollout = AgentRollout(cfg, agent, tok)
    try:
        groups = rollout.episodes(records, n, SamplingParams(max_new_tokens=4, stop_token_ids=[tok.eos_token_id],
                                                             seed=3), generate)
    finally:
        rollout.close()
    batch = episodes_to_batch(groups, [r["id"] for r in records], [{} for _ in records])
    return groups, batch, calls


def _check_token_exact(batch, calls):
    cu = batch.cu_seqlens.tolist()
    rows = [batch.token["input_ids"][cu[k]:cu[k + 1]].tolist() for k in range(len(batch))]
    masks = [batch.token["loss_mask"][cu[k]:cu[k + 1]].tolist() for k in range(len(batch))]
    lps = [batch.token["rollout_logprobs"][cu[k]:cu[k + 1]].tolist() for k in range(len(batch))]
    sampled, turns = 0, Counter()
    for prompts, gens in calls:
        for p, choices in zip(prompts, gens):
            for g in choices:
                turns[(tuple(p), tuple(g.token_ids))] += 1
                sampled += len(g.token_ids)
                hits = [k for k, row in enumerate(rows) if row[:len(p) + len(g.token_ids)] == p + list(g.token_ids)
                        and masks[k][len(p):len(p) + len(g.token_ids)] == [1.0] * len(g.token_ids)]
                assert hits, (p, g.token_ids)
                for k in hits:  # the engine's log-probs, as they came
                    assert lps[k][len(p):len(p) + len(g.token_ids)] == pytest.approx(list(g.logprobs), abs=1e-6)
    for (p, turn), count in turns.items():  # each sampled turn trained once, right after what it continued
        hits = [k for k, row in enumerate(rows) if tuple(row[:len(p) + len(turn)]) == p + turn
                and masks[k][len(p):len(p) + len(turn)] == [1.0] * len(turn)]
        assert len(hits) == count, (p, turn)
    assert sampled == int(batch.token["loss_mask"].sum())  # nothing else is trained


def test_200_scripted_episodes_train_exactly_the_sampled_ids(engine):
    eng, tok = engine
    records = [{"id": f"r{i}", "prompt": f"{i % 10}+{i % 7}=", "kind": i % 4} for i in range(40)]
    groups, batch, calls = _episodes(eng, tok, records, 4, scn.scripted)
    _check_token_exact(batch, calls)
    stats = [t.stats for g in groups for t in g]
    assert all(t.ended_by == "done" for g in groups for t in g)
    assert len({id(g) for g in groups}) == 40 and sum(s["requests"] > 0 for s in stats) >= 160
    assert sum(s["forks"] for s in stats) > 0 and sum(s["resets"] for s in stats) > 0
    assert sum(s["tool_calls"] for s in stats) > 0 and sum(s["template_resets"] for s in stats) == 0
    # the calls batched episodes together
    assert len(calls) < sum(len(p) for p, _ in calls)


def test_a_non_append_only_template_starts_new_samples_and_stays_token_exact(engine):
    from rlweave.testing.tiny_tokenizer import char_tokenizer

    eng, tok = engine
    counting = char_tokenizer(["0123456789+-= |"], chat_template=COUNTING)
    assert counting.get_vocab() == tok.get_vocab()
    records = [{"id": f"t{i}", "prompt": f"{i}+1=", "kind": 0} for i in range(10)]
    groups, batch, calls = _episodes(eng, counting, records, 4, scn.tool_agent)
    _check_token_exact(batch, calls)
    stats = [t.stats for g in groups for t in g]
    assert all(s["template_resets"] == 1 and s["samples"] == 2 for s in stats)


def test_each_finished_group_is_reported_packed_as_in_the_batch(engine):
    """``run(on_group=...)`` tells of each record whose episodes all ended while others still run,
    its samples packed as the run's batch holds them (what overlapped rewards score)."""
    from rlweave.algo_helpers.agent.rollout import AgentRollout
    from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
    from rlweave.interfaces.engine import SamplingParams

    eng, tok = engine
    records = [{"id": f"g{i}", "prompt": f"{i}+2=", "kind": i % 4} for i in range(8)]
    cfg = MultiTurnConfig.model_validate({"agent": {"target": "x:y", "parser": f"{scn.__file__}:every_turn_calls",
                                                    "timeout_s": 120}, "max_turns": 6, "max_total_tokens": 200,
                                          "max_in_flight": 4})
    rollout, reported = AgentRollout(cfg, scn.scripted, tok), {}
    try:
        batch = rollout.run(records, 2, SamplingParams(max_new_tokens=4, stop_token_ids=[tok.eos_token_id], seed=3),
                            lambda p, s: eng.generate(p, s), on_group=lambda g, b: reported.setdefault(g, b))
    finally:
        rollout.close()
    assert 0 < len(reported) < len(records)  # the last record to finish is not reported
    cu = batch.cu_seqlens.tolist()
    for g, part in reported.items():
        rows = [k for k, gid in enumerate(batch.sample["group"].tolist()) if gid == g]
        assert part.ids == [batch.ids[k] for k in rows] and part.meta == [batch.meta[k] for k in rows]
        ids = batch.token["input_ids"]
        assert part.token["input_ids"].tolist() == [t for k in rows for t in ids[cu[k]:cu[k + 1]].tolist()]


def test_the_timeout_counts_the_agents_own_time_not_the_engines(engine):
    """``agent.timeout_s`` 1 s, every engine call 1.5 s late: agents that only wait for the engine
    (3 s or more each) finish; an agent that blocks in its own code, or awaits a sleep, for 2.5 s
    times out (the awaited sleep is cancelled)."""
    eng, tok = engine
    scn.SLEEPS.clear()
    kinds = ["quick", "blocks", "quick", "sleeps"]
    records = [{"id": f"s{i}", "prompt": f"{i}+1=", "kind": k, "sleep_s": 2.5} for i, k in enumerate(kinds)]
    t0 = time.monotonic()
    groups, batch, calls = _episodes(eng, tok, records, 1, scn.timed_agent, timeout_s=1.0, delay_s=1.5)
    took = time.monotonic() - t0
    ended = {r["kind"]: [t.ended_by for t in g] for r, g in zip(records, groups)}
    assert ended == {"quick": ["done"], "blocks": ["error"], "sleeps": ["error"]}, ended
    quick = [t for r, g in zip(records, groups) if r["kind"] == "quick" for t in g]
    assert all(t.stats["requests"] == 2 and t.reward == 1.0 for t in quick)
    assert took >= 3.0 and len(calls) >= 2  # each quick episode waited twice for a late engine
    for _ in range(100):  # the cancellation reaches the agent's own event loop
        if scn.SLEEPS:
            break
        time.sleep(0.05)
    assert scn.SLEEPS == ["cancelled"]
