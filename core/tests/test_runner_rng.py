"""RNG states as JSON (rlweave.runner.rng): exact round trips, validation, no pickles."""

import json
import random

import numpy as np
import pytest
import torch
from rlweave.runner import rng


def _draws(n=4):
    return ([random.random() for _ in range(n)] + [random.gauss(0, 1)],
            np.random.rand(n).tolist() + [float(np.random.randn())],
            torch.rand(n).tolist() + torch.randn(n).tolist())


def test_json_round_trip_continues_every_stream_exactly():
    random.seed(11), np.random.seed(12), torch.manual_seed(13)
    random.gauss(0, 1), np.random.randn()  # a cached second gaussian in both
    text = json.dumps(rng.to_json(rng.get_state()))
    expected = [_draws() for _ in range(3)]
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    rng.set_state(rng.from_json(json.loads(text), source="rng.json"))
    assert [_draws() for _ in range(3)] == expected


def test_split_join_round_trip_through_safetensors(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(5)
    obj, tensors = rng.split(rng.get_state())
    save_file(tensors, str(tmp_path / "t.safetensors"))
    (tmp_path / "r.json").write_text(json.dumps(obj))
    expected = _draws()
    torch.manual_seed(6), random.seed(6), np.random.seed(6)
    rng.set_state(rng.join(json.loads((tmp_path / "r.json").read_text()), load_file(str(tmp_path / "t.safetensors"))))
    assert _draws() == expected


@pytest.mark.parametrize("breakage, words", [
    (lambda o: o.update(format=0), "format"),
    (lambda o: o["python"].update(state=o["python"]["state"][:10]), "python.state"),
    (lambda o: o["python"]["state"].__setitem__(3, -1), "python.state"),
    (lambda o: o["numpy"].update(kind="PCG64"), "numpy.kind"),
    (lambda o: o["numpy"].update(pos=10**6), "numpy.pos"),
    (lambda o: o["tensors"].update(torch="%%%"), "base64"),
    (lambda o: o["tensors"].pop("torch"), "torch CPU generator"),
    (lambda o: o.pop("tensors"), "tensors"),
])
def test_malformed_state_is_refused_naming_the_source_and_field(breakage, words):
    obj = rng.to_json(rng.get_state())
    breakage(obj)
    with pytest.raises(ValueError, match="ckpt/rng.json") as info:
        rng.from_json(obj, source="ckpt/rng.json")
    assert words in str(info.value)
