"""Multi-turn rollouts (:mod:`rlweave.algo_helpers.multi_turn`): observations rendered by the chat
template without touching the model's tokens, episodes packed with the loss mask on the model's
tokens only, episode limits, and scheduling (a slow environment step holds only its own episode).
The engine here is a scripted stand-in: the logic around it is the subject (tests/ runs the real
HF engine and an FSDP worker)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from rlweave.algo_helpers import chat
from rlweave.algo_helpers.multi_turn import MultiTurnRollout, episode_metrics, episodes_to_batch
from rlweave.algo_helpers.multi_turn_config import MultiTurnConfig
from rlweave.interfaces.engine import Generation, SamplingParams
from rlweave.interfaces.environment import Environment, EnvStep
from rlweave.testing.tiny_tokenizer import char_tokenizer

QWEN_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 :<>|_\n"])


def test_observation_text_of_a_template_with_roles(tok):
    tok = char_tokenizer(["abcdefghijklmnopqrstuvwxyz0123456789 :<>|_\n"], chat_template=QWEN_LIKE)
    tok.eos_token = "<|im_end|>"
    obs = [{"role": "tool", "content": "42"}]
    assert chat.observation_text(tok, obs, stopped=True) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert chat.observation_text(tok, obs, stopped=False).startswith("<|im_end|>\n<|im_start|>tool")
    ids, text = chat.prompt_ids(tok, [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" and tok.decode(ids) == text


def test_observation_text_of_the_tiny_template_and_without_one(tok):
    assert chat.observation_text(tok, [{"role": "tool", "content": "42"}], stopped=True) == "42"
    plain = SimpleNamespace(chat_template=None)
    assert chat.observation_text(plain, [{"role": "tool", "content": "7"}], stopped=True) == "tool: 7\nassistant: "


class Echo(Environment):
    """Answers every turn with 'ok<turn>' until the model writes 'done'; step 0 of the episode
    whose prompt is 'slow' sleeps."""

    def reset(self, record):
        self.turn, self.slow = 0, record["prompt"] == "slow"
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, action):
        self.turn += 1
        if self.slow and self.turn == 1:
            time.sleep(0.5)
        if "done" in action:
            return EnvStep(done=True, reward=1.0)
        return EnvStep(messages=[{"role": "tool", "content": f"ok{self.turn}"}], reward=0.25, info={"tool_calls": 1})


class Script:
    """A stand-in engine: turn k of every episode is the tokens of ``turns[k]`` (+ EOS); records
    each call's prompts and the time it was made."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls, self.lock = tok, turns, [], threading.Lock()

    def __call__(self, prompts, params: SamplingParams):
        with self.lock:
            self.calls.append((time.perf_counter(), [list(p) for p in prompts], params))
        out = []
        for p in prompts:
            k = sum(self._turn_of(p))
            ids = self.tok(self.turns[min(k, len(self.turns) - 1)], add_special_tokens=False)["input_ids"]
            ids = ids[: params.max_new_tokens]
            stop = len(ids) < params.max_new_tokens
            if stop:
                ids = ids + [self.tok.eos_token_id]
            out.append([Generation(ids, [-0.5] * len(ids), "stop" if stop else "length", versions=[3] * len(ids))])
        return out

    def _turn_of(self, prompt):
        return [1 for t in prompt if t == self.tok.eos_token_id]


def _rollout(tok, **cfg):
    c = MultiTurnConfig.model_validate({"env": {"name": "tools", "args": {"tools": [
        {"name": "calc", "target": "rlweave.environments.calculator:calculate"}]}}, **cfg})
    return MultiTurnRollout(c, Echo, None, tok)


def test_episodes_are_token_exact_and_masked(tok):
    engine = Script(tok, ["abc", "de", "done"])
    r = _rollout(tok, max_turns=5)
    try:
        groups = r.episodes([{"prompt": "go", "answer": "x"}], 2, SamplingParams(max_new_tokens=8, seed=1), engine, version=3)
    finally:
        r.close()
    t = groups[0][0]
    assert t.ended_by == "done" and t.stats["turns"] == 3 and t.reward == 1.5 and t.stats["tool_calls"] == 2
    text = tok.decode(t.prompt_ids + t.ids)
    assert text == "go" + "abc<eos>" + "ok1" + "de<eos>" + "ok2" + "done<eos>"
    # each engine call continued exactly the ids the trajectory holds
    for _, prompts, _ in engine.calls:
        for p in prompts:
            assert p == (t.prompt_ids + t.ids)[: len(p)]
    batch = episodes_to_batch(groups, ["r0"], [{"answer": "x"}])
    mask = batch.token["loss_mask"][: batch.cu_seqlens[1]]
    ids = batch.token["input_ids"][: batch.cu_seqlens[1]]
    model = ids[mask > 0].tolist()
    assert tok.decode(model) == "abc<eos>de<eos>done<eos>"
    assert tok.decode(ids[mask == 0].tolist()) == "go" + "ok1" + "ok2"
    lp = batch.token["rollout_logprobs"][: batch.cu_seqlens[1]]
    assert torch.all(lp[mask > 0] == -0.5) and torch.all(lp[mask == 0] == 0)
    ver = batch.token["weight_version"][: batch.cu_seqlens[1]]
    assert torch.all(ver[mask > 0] == 3) and torch.all(ver[mask == 0] == 0)  # the version the episode ran with
    assert batch.meta[0]["response_ids"] == t.final_ids and tok.decode(t.final_ids) == "done<eos>"
    assert float(batch.sample["env_reward"][0]) == 1.5 and batch.sample["group"].tolist() == [0, 0]
    m = episode_metrics(batch.meta)
    assert m["episode/turns_mean"] == 3 and m["episode/limit_frac"] == 0 and m["episode/tool_used_frac"] == 1


def test_limits_end_episodes(tok):
    engine = Script(tok, ["abc"])  # never 'done'
    r = _rollout(tok, max_turns=2)
    try:
        (t,), = r.episodes([{"prompt": "go"}], 1, SamplingParams(max_new_tokens=8), engine)
        assert t.ended_by == "max_turns" and t.stats["turns"] == 2
        r.cfg = r.cfg.model_copy(update={"max_turns": 10, "max_total_tokens": 14})
        (t,), = r.episodes([{"prompt": "go"}], 1, SamplingParams(max_new_tokens=8), engine)
        assert t.length <= 14 and t.ended_by in ("max_total_tokens", "length")
        # a turn is cut to what the episode has left
        assert all(p.max_new_tokens <= 14 - len(prompts[0]) for _, prompts, p in engine.calls[-2:])
    finally:
        r.close()
    assert episode_metrics([{"episode": {"ended_by": "max_turns", "turns": 2}}])["episode/limit_frac"] == 1


class Breaks(Echo):
    """:class:`Echo` that raises in ``args`` (``"reset"`` or ``"step"``) on the record whose prompt
    is 'bad'; keeps count of the environments built and closed."""

    built: list = []
    closed: list = []

    def __init__(self, args):
        super().__init__(args)
        Breaks.built.append(self)

    def reset(self, record):
        self.bad = record["prompt"] == "bad"
        if self.args == "reset" and self.bad:
            raise KeyError("no 'secret' field")
        return super().reset(record)

    def step(self, action):
        if self.args == "step" and self.bad:
            raise ValueError("cannot parse the move")
        return super().step(action)

    def close(self):
        Breaks.closed.append(self)


@pytest.mark.parametrize("phase", ["reset", "step"])
def test_an_environment_that_raises_stops_the_rollout_naming_it_its_key_and_the_record(tok, phase):
    from rlweave.interfaces.failures import PluginCodeError

    engine = Script(tok, ["abc", "de", "done"])
    r = MultiTurnRollout(_rollout(tok).cfg, Breaks, phase, tok)
    Breaks.built.clear()
    Breaks.closed.clear()
    records = [{"id": "train:4", "prompt": "ok"}, {"id": "train:5", "prompt": "bad"}]
    try:
        with pytest.raises(PluginCodeError) as info:
            r.episodes(records, 2, SamplingParams(max_new_tokens=8), engine)
    finally:
        r.close()
    err = info.value
    assert str(err).startswith(f"environment 'tools' (algorithm.multi_turn.env.name) failed in {phase}() on record "
                               "'train:5': ")
    assert err.error == ("KeyError: \"no 'secret' field\"" if phase == "reset" else "ValueError: cannot parse the move")
    assert "Traceback (most recent call last)" in err.details and f"in {phase}" in err.details
    assert Breaks.built and sorted(map(id, Breaks.closed)) == sorted(map(id, Breaks.built))  # each one closed


@pytest.mark.parametrize("scheduling", ["independent", "lockstep"])
def test_a_slow_step_holds_only_its_own_episode(tok, scheduling):
    engine = Script(tok, ["abc", "done"])
    r = _rollout(tok, max_turns=3, scheduling=scheduling)
    try:
        t0 = time.perf_counter()
        r.episodes([{"prompt": "slow"}, {"prompt": "fast"}], 1, SamplingParams(max_new_tokens=8), engine)
    finally:
        r.close()
    second = [(t - t0, len(prompts)) for t, prompts, _ in engine.calls[1:]]
    if scheduling == "independent":  # the fast episode's second turn did not wait for the slow step
        assert second[0][0] < 0.4 and second[0][1] == 1, second
    else:
        assert second[0][0] >= 0.5 and second[0][1] == 2, second


def test_both_rollouts_keep_the_rollout_contract(tok):
    """What :mod:`rlweave.interfaces.rollout` promises, from the single-turn default and from
    multi-turn episodes alike (both built by ``make_rollout`` from an algorithm's config)."""
    from rlweave.algo_helpers.rollout import SingleTurnRollout, make_rollout

    def one_shot(prompts, params):
        ids = tok("ab", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return [[Generation(ids, [-0.5] * len(ids), "stop") for _ in range(params.n)] for _ in prompts]

    records = [{"prompt": "go", "answer": "x", "id": "a"}, {"prompt": "ho", "answer": "y", "id": "b"}]
    spec = MultiTurnConfig.model_validate({"env": {"name": f"{__file__}:Echo"}, "max_turns": 3})
    (single, one), (episodes, many) = (make_rollout(None, SimpleNamespace(multi_turn=m), tok) for m in (None, spec))
    assert isinstance(single, SingleTurnRollout) and isinstance(episodes, MultiTurnRollout)
    assert (one.name, one.streams, many.name, many.streams) == ("single_turn", True, "multi_turn", False)
    for rollout, engine, reward in ((single, one_shot, 0.0), (episodes, Script(tok, ["abc", "done"]), 1.25)):
        try:
            batch = rollout.run(records, 2, SamplingParams(max_new_tokens=8, seed=1), engine)
        finally:
            rollout.close()
        assert batch.ids == ["a/0", "a/1", "b/0", "b/1"] and batch.sample["group"].tolist() == [0, 0, 1, 1]
        assert batch.sample["env_reward"].tolist() == [reward] * 4
        lens = batch.seqlens
        assert (batch.sample["prompt_len"] + batch.sample["response_len"]).tolist() == lens.tolist()
        mask, lp = batch.token["loss_mask"], batch.token["rollout_logprobs"]
        assert torch.all(lp[mask > 0] == -0.5) and torch.all(lp[mask == 0] == 0)
        for i, (seq, m) in enumerate(zip(batch.sequences(), batch.meta)):
            plen = int(batch.sample["prompt_len"][i])
            assert m["answer"] == records[i // 2]["answer"] and tok.decode(seq[:plen].tolist()) == m["prompt"]
            assert seq[-len(m["response_ids"]):].tolist() == m["response_ids"] and m["finish_reason"] == "stop"
            assert mask[batch.cu_seqlens[i]:batch.cu_seqlens[i] + plen].sum() == 0
        assert ("episode" in batch.meta[0]) == (rollout is episodes)


class Counted(Echo):
    """:class:`Echo` that counts the episodes alive at once (reset .. close)."""

    alive = peak = 0
    lock = threading.Lock()

    def reset(self, record):
        with Counted.lock:
            Counted.alive += 1
            Counted.peak = max(Counted.peak, Counted.alive)
        return super().reset(record)

    def close(self):
        with Counted.lock:
            Counted.alive -= 1


@pytest.mark.parametrize("scheduling", ["independent", "lockstep"])
def test_max_in_flight_streams_episodes(tok, scheduling):
    """At most max_in_flight episodes run at once, the others start as they end, and every one
    finishes in its own group slot."""
    c = MultiTurnConfig.model_validate({"env": {"name": f"{__file__}:Echo"}, "max_turns": 4, "max_in_flight": 3,
                                        "scheduling": scheduling})
    Counted.alive = Counted.peak = 0
    r = MultiTurnRollout(c, Counted, None, tok)
    engine = Script(tok, ["abc", "de", "done"])
    records = [{"prompt": p} for p in ("go", "slow", "ho", "no")]
    try:
        groups = r.episodes(records, 2, SamplingParams(max_new_tokens=8), engine)
    finally:
        r.close()
    assert Counted.peak == 3 and Counted.alive == 0
    assert all(t.ended_by == "done" and t.stats["turns"] == 3 for g in groups for t in g)
    assert [tok.decode(g[0].prompt_ids) for g in groups] == ["go", "slow", "ho", "no"]
    assert max(len(prompts) for _, prompts, _ in engine.calls) <= 3 and len(engine.calls) > 3


@pytest.mark.parametrize("engine_calls", [1, 2])
def test_engine_calls_overlap_only_when_asked(tok, engine_calls):
    """With engine_calls 2 an episode whose slow step ended goes to the engine while the other
    episode's call still runs; with 1 it waits for that call to end."""
    spans, lock = [], threading.Lock()
    script = Script(tok, ["abc", "done"])

    def engine(prompts, params):  # 1.2 s a call: the slow step (0.5 s) ends well inside the second
        start = time.perf_counter()
        time.sleep(1.2)
        out = script(prompts, params)
        with lock:
            spans.append((start, time.perf_counter()))
        return out

    r = _rollout(tok, max_turns=3, engine_calls=engine_calls)
    try:
        groups = r.episodes([{"prompt": "slow"}, {"prompt": "fast"}], 1, SamplingParams(max_new_tokens=8), engine)
    finally:
        r.close()
    assert all(g[0].ended_by == "done" for g in groups)
    spans.sort()
    overlaps = [b[0] < a[1] for a, b in zip(spans, spans[1:])]
    assert any(overlaps) == (engine_calls > 1), spans


class BudgetScript:
    """A stand-in engine that honours ``token_budget``: the episode whose prompt starts with
    letter ``c`` says ``turns[c][k]`` (+ EOS) in its turn ``k``, continuing a turn the budget cut
    (the prompt ends with part of it); a cut sample comes back ``"aborted"``. Tokens carry
    ``version``."""

    def __init__(self, tok, turns: dict[str, list[str]]):
        self.tok, self.turns, self.calls, self.version = tok, turns, [], 0

    def __call__(self, prompts, params: SamplingParams):
        self.calls.append(([list(p) for p in prompts], params))
        out = []
        for p in prompts:
            turns = self.turns[self.tok.decode(p[:1])]
            k = sum(t == self.tok.eos_token_id for t in p)
            full = self.tok(turns[min(k, len(turns) - 1)], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            done = max([j for j in range(len(full)) if j == 0 or p[-j:] == full[:j]])  # part of the turn so far
            rest = full[done:]
            budget = params.token_budget
            if budget is not None and budget < params.max_new_tokens and len(rest) > budget:
                ids, reason = rest[:budget], "aborted"
            elif len(rest) > params.max_new_tokens:
                ids, reason = rest[: params.max_new_tokens], "length"
            else:
                ids, reason = rest, "stop"
            out.append([Generation(ids, [-0.5] * len(ids), reason, versions=[self.version] * len(ids))])
        return out


def test_rounds_cut_a_turn_at_the_budget_and_continue_it_token_exact(tok):
    """A round gives each episode at most ``budget`` model tokens: a turn cut by it continues
    in the next round as the same turn (its ids, log-probs and versions appended), an episode
    whose budget is used up between turns waits for the next round, and the last round has no
    budget."""
    engine = BudgetScript(tok, {"g": ["abcdef", "ghij", "done"]})
    r = _rollout(tok, max_turns=5)
    sampling = SamplingParams(max_new_tokens=8, seed=1)
    try:
        groups = r.episodes([{"prompt": "go"}], 1, sampling, engine, budget=4, max_rounds=3)
        t = groups[0][0]
        assert t.paused and t.cut_turn and t.ended_by is None and tok.decode(t.ids) == "abcd"
        assert t.stats["turns"] == 1 and engine.calls[-1][1].token_budget == 4
        engine.version = 1
        r.episodes([{"prompt": "go"}], 1, sampling, engine, carry=groups, budget=4, max_rounds=3)
        # the cut turn ended (3 tokens), its observation came, and the next turn was cut after 1 token
        assert t.paused and t.cut_turn and tok.decode(t.ids) == "abcdef<eos>ok1g" and t.stats["turns"] == 2
        engine.version = 2
        r.episodes([{"prompt": "go"}], 1, sampling, engine, carry=groups, budget=4, max_rounds=3)
    finally:
        r.close()
    assert t.ended_by == "done" and t.rounds == 3 and t.stats["turns"] == 3 and not t.paused
    assert tok.decode(t.prompt_ids + t.ids) == "go" + "abcdef<eos>ok1" + "ghij<eos>ok2" + "done<eos>"
    assert engine.calls[-1][1].token_budget is None  # the third round is the last: no budget
    for prompts, _ in engine.calls:  # every call continued exactly the ids the trajectory holds
        assert all(p == (t.prompt_ids + t.ids)[: len(p)] for p in prompts)
    model = [v for v, m in zip(t.versions, t.mask) if m]
    text = [tok.decode([i]) for i, m in zip(t.ids, t.mask) if m]
    assert "".join(text) == "abcdef<eos>ghij<eos>done<eos>" and len(model) == len(text)
    assert model == [0] * 4 + [1] * 3 + [1] + [2] * 4 + [2] * 5  # each token: the weights that made it
    assert tok.decode(t.final_ids) == "done<eos>"


def test_episode_rounds_hand_out_complete_groups_and_keep_the_stragglers(tok):
    """EpisodeRounds: a step gets the groups complete first; a straggler stays held, is part of
    the checkpoint's records until it is trained, and is dropped and started again when its
    oldest token passes the staleness bound."""
    from rlweave.algo_helpers.episode_rounds import EpisodeRounds

    engine = BudgetScript(tok, {"l": ["abcdefghijklmnop", "done"], "g": ["ab", "done"]})
    r = _rollout(tok, max_turns=5)
    rounds = EpisodeRounds(r, 1, 1, token_budget=3, max_rounds=10, max_staleness=1)
    sampling = SamplingParams(max_new_tokens=20, seed=1)
    try:
        rounds.admit([{"prompt": "long", "id": "L"}, {"prompt": "go", "id": "G"}])
        batch, metrics = rounds.take(sampling, engine, version=0, policy_version=0)
        assert batch.ids == ["G/0"]  # complete first, though admitted second
        assert metrics["partial/ratio"] == 1.0 and metrics["partial/rounds"] >= 2 and metrics["queue/groups"] == 1
        assert metrics["staleness/max"] == 0.0
        assert [rec["id"] for rec in rounds.records()] == ["G", "L"]  # G handed out, not yet trained
        rounds.trained()
        assert [rec["id"] for rec in rounds.records()] == ["L"]
        straggler = rounds.held[0].slots[0]
        assert straggler.paused and 0 in straggler.versions
        engine.version = 2
        batch, metrics = rounds.take(sampling, engine, version=2, policy_version=2)
    finally:
        rounds.close()
        r.close()
    assert batch.ids == ["L/0"] and metrics["staleness/regenerated"] == 1.0
    assert straggler.ended_by == "error"  # dropped: its environment closed
    assert batch.meta[0]["episode"]["ended_by"] == "done" and metrics["staleness/max"] == 0.0  # all of version 2
