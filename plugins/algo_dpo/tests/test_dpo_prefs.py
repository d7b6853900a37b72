"""Preference records (text and chat) -> texts and token ids; config and plugin records."""

from __future__ import annotations

import pytest

from rlweave_algo_dpo.prefs import encode_preferences, preference_texts


class CharTok:
    """A tiny character tokenizer (ids = ord) with an EOS id 0 and no chat template."""

    eos_token_id = 0
    eos_token = "<eos>"
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


def test_text_records():
    rec = {"id": 3, "prompt": "1+2=", "chosen": "3", "rejected": "4"}
    assert preference_texts(rec) == ("1+2=", "3", "4")
    p, c, r = encode_preferences([rec], CharTok())
    assert p == [[ord("1"), ord("+"), ord("2"), ord("=")]]
    assert c == [[ord("3"), 0]] and r == [[ord("4"), 0]]
    p, c, r = encode_preferences([rec], CharTok(), max_prompt_tokens=2, max_response_tokens=1)
    assert p == [[ord("2"), ord("=")]] and c == [[ord("3")]]


def test_chat_records_without_template():
    user = {"role": "user", "content": "1+2="}
    rec = {"id": "x", "chosen": [user, {"role": "assistant", "content": "3"}],
           "rejected": [user, {"role": "assistant", "content": "4"}]}
    assert preference_texts(rec) == ("user: 1+2=\nassistant: ", "3", "4")
    rec2 = {"prompt": [user], "chosen": [{"role": "assistant", "content": "3"}],
            "rejected": [{"role": "assistant", "content": "4"}]}
    assert preference_texts(rec2) == preference_texts(rec)


def test_chat_records_with_template():
    class T(CharTok):
        chat_template = "x"

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            s = "".join(f"<{m['role']}>{m['content']}</>" for m in msgs)
            return s + ("<assistant>" if add_generation_prompt else "")

    user = {"role": "user", "content": "1+2="}
    rec = {"chosen": [user, {"role": "assistant", "content": "3"}],
           "rejected": [user, {"role": "assistant", "content": "4"}]}
    assert preference_texts(rec, T()) == ("<user>1+2=</><assistant>", "3</>", "4</>")


@pytest.mark.parametrize("rec,msg", [
    ({"id": 1, "prompt": "a", "chosen": "b"}, "needs 'chosen' and 'rejected'"),
    ({"id": 2, "chosen": "b", "rejected": "c"}, "need a 'prompt'"),
    ({"id": 3, "prompt": "a", "chosen": "b", "rejected": [{"role": "assistant", "content": "c"}]}, "both"),
    ({"id": 4, "chosen": [{"role": "assistant", "content": "b"}],
      "rejected": [{"role": "assistant", "content": "c"}]}, "share no prompt"),
])
def test_bad_records_name_the_record(rec, msg):
    with pytest.raises(ValueError, match=msg):
        preference_texts(rec)


def test_config_and_records():
    from pydantic import ValidationError

    from rlweave_algo_dpo.config import DPOConfig, OnlineDPOConfig, dpo_roles, online_dpo_roles
    from rlweave_algo_dpo.plugin import rlweave_algorithms

    recs = {r.name: r for r in rlweave_algorithms()}
    assert set(recs) == {"dpo", "online_dpo"}
    assert recs["dpo"].roles(DPOConfig()) == ("policy",)
    assert recs["dpo"].roles(DPOConfig(reference_mode="live", eval_with="rollout")) == ("policy", "reference", "rollout")
    assert online_dpo_roles(OnlineDPOConfig()) == ("policy", "rollout", "reference")
    assert online_dpo_roles({"reward_source": "model"})[-1] == "reward"
    assert dpo_roles({"reference_mode": "live"}) == ("policy", "reference")
    for model in (DPOConfig, OnlineDPOConfig):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no description"
    with pytest.raises(ValidationError):
        OnlineDPOConfig(n_samples=1)
    with pytest.raises(ValidationError):
        DPOConfig(loss_type="conservative")
    with pytest.raises(ValidationError):
        DPOConfig(bogus=1)
    assert recs["dpo"].load().__name__ == "DPO"
    assert recs["online_dpo"].load().__name__ == "OnlineDPO"
