"""rlweave.algo_helpers.evaluate.exact_match with a scripted generator (the rollout stand-in is the
thing under test's input, not the thing tested)."""

import pytest

from rlweave.algo_helpers.evaluate import exact_match, reward_fields
from rlweave.algo_helpers.rollout import record_prompt
from rlweave.interfaces.engine import Generation


class Tok:
    eos_token_id = 0
    eos_token = "\x00"
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


class ScriptedGenerator:
    """Answers each prompt with a fixed text; records the sampling params it got."""

    def __init__(self, answers):
        self.answers = answers
        self.params = None

    def generate(self, prompts, params):
        self.params = params
        out = []
        for p in prompts:
            text = self.answers["".join(chr(i) for i in p)]
            out.append([Generation([ord(c) for c in text] + [0], [-0.1] * (len(text) + 1), "stop")])
        return out


def rule(prompt, response, answer, **_):
    return 1.0 if response.strip() == answer else 0.0


def test_exact_match_counts_correct_answers_greedy():
    recs = [
        {"id": "0", "prompt": "1+1=", "answer": "2"},
        {"id": "1", "prompt": "2+2=", "answer": "4"},
        {"id": "2", "prompt": "3+3=", "answer": "6"},
        {"id": "3", "prompt": "4+4=", "answer": "8"},
    ]
    gen = ScriptedGenerator({"1+1=": "2", "2+2=": "5", "3+3=": " 6", "4+4=": "9"})
    m = exact_match(gen, Tok(), recs, rule, max_new_tokens=7)
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["reward_mean"] == pytest.approx(0.5)
    assert m["n"] == 4
    assert m["response_len"] == pytest.approx((2 + 2 + 3 + 2) / 4)
    assert gen.params.temperature == 0.0 and gen.params.max_new_tokens == 7 and gen.params.stop_token_ids == [0]


def test_exact_match_with_a_reward_set_and_a_future():
    class Future:
        def __init__(self, v):
            self.v = v

        def result(self, timeout=None):
            return self.v

    class FutureGen(ScriptedGenerator):
        def generate(self, prompts, params):
            return Future(super().generate(prompts, params))

    class RewardSetLike:
        def __init__(self):
            self.samples = None

        def score(self, samples):
            self.samples = samples
            return [rule(**s) for s in samples], [{} for _ in samples]

    rs = RewardSetLike()
    recs = [{"id": "a", "query": "1+1=", "answer": "2", "response": "2"}]
    m = exact_match(FutureGen({"1+1=": "2"}), Tok(), recs, rs)
    assert m["accuracy"] == 1.0
    assert rs.samples == [{"prompt": "1+1=", "response": "2", "answer": "2"}]


def test_record_prompt_and_fields():
    assert record_prompt({"prompt": "p"}) == "p"
    assert record_prompt({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) == (
        "user: hi\nassistant: "
    )
    assert reward_fields({"id": 1, "prompt": "p", "answer": "3", "level": 2}) == {"answer": "3", "level": 2}
    with pytest.raises(ValueError, match="record 7"):
        record_prompt({"id": 7, "x": 1})
