"""rlweave.algo_helpers.rollout: prompt encoding and generations -> packed Batch."""

import pytest
import torch

from rlweave.algo_helpers.rollout import encode_prompts, generations_to_batch, sampling_params
from rlweave.interfaces.engine import Generation


class CharTokenizer:
    """Each character is its token id (ord); EOS = 0; appends nothing."""

    eos_token_id = 0
    eos_token = "\x00"

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


class EosAppendingTokenizer(CharTokenizer):
    def __call__(self, text):
        return {"input_ids": [1] + [ord(c) for c in text] + [0]}


def test_encode_prompts_keeps_bos_and_drops_appended_eos():
    assert encode_prompts(CharTokenizer(), ["ab", "c"]) == [[97, 98], [99]]
    assert encode_prompts(EosAppendingTokenizer(), ["ab"]) == [[1, 97, 98]]
    with pytest.raises(ValueError, match="prompt #1"):
        encode_prompts(CharTokenizer(), ["a", ""])


def test_sampling_params_stop_at_eos_unless_ignore_eos():
    class Cfg:
        n_samples, temperature, top_p, top_k, max_new_tokens = 4, 1.0, 1.0, -1, 16

    stops = sampling_params(Cfg(), CharTokenizer(), seed=3)
    assert stops.stop_token_ids == [0] and not stops.ignore_eos and stops.n == 4 and stops.seed == 3
    # ignore_eos must not be undone by the tokenizer's EOS in the stop ids (equal-length samples)
    full = sampling_params(Cfg(), CharTokenizer(), seed=3, ignore_eos=True)
    assert full.stop_token_ids == [] and full.ignore_eos


def test_generations_to_batch_layout():
    gens = [
        [Generation([5, 6], [-0.5, -0.25], "stop"), Generation([7], [-1.0], "length")],
        [Generation([8, 9, 10], [-0.1, -0.2, -0.3], "stop")],
    ]
    b = generations_to_batch([[1, 2], [3]], gens, ["p0", "p1"], [{"answer": "x"}, {"answer": "y"}])
    assert len(b) == 3
    assert b.token["input_ids"].tolist() == [1, 2, 5, 6, 1, 2, 7, 3, 8, 9, 10]
    assert b.token["loss_mask"].tolist() == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert b.token["rollout_logprobs"].tolist() == pytest.approx(
        [0, 0, -0.5, -0.25, 0, 0, -1.0, 0, -0.1, -0.2, -0.3]
    )
    assert b.sample["prompt_len"].tolist() == [2, 2, 1]
    assert b.sample["response_len"].tolist() == [2, 1, 3]
    assert b.sample["group"].tolist() == [0, 0, 1]
    assert b.ids == ["p0/0", "p0/1", "p1/0"]
    assert b.meta[1] == {"answer": "x", "response_ids": [7], "finish_reason": "length"}
    assert b.meta[2]["answer"] == "y"
    assert "weight_version" not in b.token  # unstamped generations and no version to fall back on


def test_weight_versions_of_the_tokens():
    stamped = [[Generation([5, 6], [-0.5, -0.25], "stop", versions=[3, 4])], [Generation([8], [-0.1], "stop")]]
    b = generations_to_batch([[1, 2], [3]], stamped, ["p0", "p1"], [{}, {}], version=7)
    # the engine's stamps where it gave them, the caller's version for the others, 0 on prompts
    assert b.token["weight_version"].tolist() == [0, 0, 3, 4, 0, 7]
    all_stamped = [[Generation([5], [-0.5], "stop", versions=[2])]]
    assert generations_to_batch([[1]], all_stamped, ["a"], [{}]).token["weight_version"].tolist() == [0, 2]


def test_empty_response_has_no_trained_token_and_mismatch_raises():
    b = generations_to_batch([[1, 2]], [[Generation([], [], "length")]], ["a"], [{}])
    assert b.token["loss_mask"].sum() == 0 and b.sample["response_len"].tolist() == [0]
    with pytest.raises(ValueError, match="logprobs"):
        generations_to_batch([[1]], [[Generation([2, 3], [-1.0], "stop")]], ["a"], [{}])
    with pytest.raises(ValueError, match="must match"):
        generations_to_batch([[1]], [], ["a"], [{}])
    assert torch.is_tensor(b.token["rollout_logprobs"])
