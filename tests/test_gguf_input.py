"""A GGUF file as ``model.path``: converted once before any worker starts, then trained from.

The model is a tiny random Llama (one layer, head size 32) with a byte-level BPE tokenizer trained
here, written as a GGUF file in llama.cpp's layout (:mod:`rlweave.testing.tiny_gguf`: float32
tensors, tokenizer and ChatML template as metadata). The GGUF cache is a folder of the test
(``RLWEAVE_CACHE``).

* ``rlweave train`` of 2 GRPO steps (FSDP policy, HF engine, in process) from the GGUF: one status
  line says it converts, the run trains (finite, non-zero losses), the cache holds one conversion
  whose ``source.json`` names the file's sha256 (so does the run's ``plugins.json``), whose
  weights equal the source model's exactly, and whose tokenizer encodes like the source's, with
  its chat template and EOS;
* a second use (``rlweave generate`` on the same file) says it reuses the cache and converts
  nothing (the conversion's record is untouched); its greedy output is the source model's;
  ``rlweave export FILE.gguf --out DIR`` writes the cached conversion to ``DIR``;
* the file rewritten (float16 tensors) gets a new conversion beside the first, with weights equal
  to the source's after float16 rounding;
* a corrupt file and a GGUF of an architecture transformers cannot read are one-line validation
  errors (exit 2) naming the file and the key, with nothing converted.
"""

from __future__ import annotations

import json
import math

import pytest

from rlweave.testing.runs import cli_env, length_reward, metrics_rows, run_cli

ARCH = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
            max_position_embeddings=64, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def gguf_ws(tmp_path_factory):
    """``root`` with ``source/`` (the tiny Llama as a Hugging Face directory), ``model.gguf``,
    ``train.jsonl``, ``test.jsonl`` and the cache folder ``cache/``."""
    from rlweave.testing.tiny_gguf import byte_bpe_tokenizer, write_llama_gguf
    from rlweave.testing.tiny_model import build_tiny

    root = tmp_path_factory.mktemp("gguf")
    train = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(8) for b in range(8)]
    test = [{"prompt": f"{a}-{b}=", "answer": a - b} for a in range(4, 8) for b in range(4)]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)] + [f"{a}-{b}={a - b}" for a in range(10)
                                                                            for b in range(10)]
    source = build_tiny("Llama", ARCH, root / "source", tokenizer=byte_bpe_tokenizer(texts))
    write_llama_gguf(source, root / "model.gguf")
    return root


def _config(root, name: str, model_path, data=None) -> str:
    cfg = {
        "run": {"name": name, "output_dir": str(root / "runs"), "seed": 5, "total_steps": 2, "save_every": 0,
                "scheduler": "in_process"},
        "model": {"path": str(model_path), "dtype": "float32"},
        "resources": {"pools": {"default": {"devices_per_node": 2}}},
        "roles": {"policy": {"backend": "fsdp", "devices": 1, "optim": {"lr": 2.0e-2}},
                  "rollout": {"engine": "hf", "devices": 1}},
        "algorithm": {"name": "grpo", "n_samples": 4, "max_new_tokens": 4},
        "rewards": [{"name": "arith_exact"}, {"name": length_reward(root), "weight": 0.5}],
        "reward_runtime": {"timeout_s": 2.0, "workers": 2},
        "logging": {"backends": ["jsonl"]},
        "data": {"train": str((data or root) / "train.jsonl"), "batch_size": 4},
    }
    path = root / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return str(path)


def _entries(cache):
    return sorted(p for p in (cache / "gguf").iterdir() if not p.name.startswith(".")) if (cache / "gguf").is_dir() \
        else []


def _same_weights(a_dir, b_dir, atol: float = 0.0) -> None:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        diff = (a[k].float() - b[k].float()).abs().max().item()
        assert diff <= atol * max(1.0, a[k].abs().max().item()), (k, diff)
        if atol == 0.0:
            assert torch.equal(a[k], b[k]), k


def test_train_from_a_gguf_converts_it_once_and_reuses_the_cache(gguf_ws, tmp_path):
    from transformers import AutoTokenizer

    from rlweave.config.gguf import file_sha256
    from rlweave.testing.tiny_gguf import write_llama_gguf

    cache = tmp_path / "cache"
    env = cli_env(RLWEAVE_CACHE=str(cache))
    gguf = gguf_ws / "model.gguf"
    rc, out, _ = run_cli(["train", _config(gguf_ws, "from-gguf", gguf)], env)
    assert rc == 0, out[-4000:]
    assert out.count("converting to a Hugging Face directory") == 1 and "using the cached conversion" not in out
    steps = [r for r in metrics_rows(gguf_ws / "runs" / "from-gguf") if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["loss"] != 0.0 for r in steps), steps

    (entry,) = _entries(cache)
    record = json.loads((entry / "source.json").read_text())
    assert record["sha256"] == file_sha256(gguf) and entry.name == record["sha256"][:16]
    assert record["source"] == str(gguf.resolve()) and record["architecture"] == "llama"
    hf = entry / "hf"
    models = json.loads((gguf_ws / "runs" / "from-gguf" / "plugins.json").read_text())["models"]
    assert models == {"model.path": {"gguf": str(gguf.resolve()), "sha256": record["sha256"], "path": str(hf)}}
    _same_weights(gguf_ws / "source", hf)
    src_tok, conv_tok = AutoTokenizer.from_pretrained(gguf_ws / "source"), AutoTokenizer.from_pretrained(hf)
    for text in ("3+4=7", "12-5=7 and 0+0=0", "<|im_start|>user\n6-2=<|im_end|>\n"):
        assert conv_tok.encode(text) == src_tok.encode(text), text
    assert conv_tok.chat_template == src_tok.chat_template and conv_tok.eos_token_id == src_tok.eos_token_id
    assert not any(p.suffix != ".gguf" for p in gguf.parent.glob("model.*")), "nothing written beside the GGUF"

    # the second use: generate from the same file, through the cache
    outfile = tmp_path / "gen.jsonl"
    rc, out, _ = run_cli(["generate", str(gguf), "--data", str(gguf_ws / "test.jsonl"), "--out", str(outfile),
                          "--max-tokens", "3", "--engine", "hf"], env)
    assert rc == 0, out[-4000:]
    assert f"GGUF {gguf}: using the cached conversion {hf}" in out and "converting" not in out
    assert _entries(cache) == [entry] and json.loads((entry / "source.json").read_text()) == record
    rc, ref_out, _ = run_cli(["generate", str(gguf_ws / "source"), "--data", str(gguf_ws / "test.jsonl"), "--out",
                              str(tmp_path / "ref.jsonl"), "--max-tokens", "3", "--engine", "hf"], env)
    assert rc == 0, ref_out[-4000:]
    rows = [json.loads(x) for x in outfile.read_text().splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "ref.jsonl").read_text().splitlines()]
    assert [r["responses"] for r in rows] == [r["responses"] for r in ref] and len(rows) == 16

    # export: the conversion copied out as a Hugging Face directory, still from the cache
    rc, out, _ = run_cli(["export", str(gguf), "--out", str(tmp_path / "exported")], env)
    assert rc == 0 and "using the cached conversion" in out and "converting" not in out, out[-3000:]
    _same_weights(gguf_ws / "source", tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "rlweave_export.json").read_text())["gguf"] == str(gguf.resolve())

    # a changed file is converted anew, beside the first conversion
    from rlweave.config.gguf_convert import converted_dir

    write_llama_gguf(gguf_ws / "source", gguf, dtype="float16")
    lines: list[str] = []
    os_env = {"RLWEAVE_CACHE": str(cache)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in os_env.items():
            mp.setenv(k, v)
        new = converted_dir(gguf, lines.append)
    assert any("converting" in line for line in lines) and new != hf and len(_entries(cache)) == 2
    _same_weights(gguf_ws / "source", new, atol=1e-3)  # float16 rounding of values below ~0.5
    assert json.loads((new.parent / "source.json").read_text())["tensor_types"] == ["F16", "F32"]


def _one_issue(out: str, *fragments: str) -> str:
    """The one problem line of ``out`` (a config error's ``invalid config (1 error):`` header aside)."""
    lines = [x.strip() for x in out.strip().splitlines() if x.strip() and x != "invalid config (1 error):"]
    assert len(lines) == 1 and "Traceback" not in out, out
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def test_an_unreadable_gguf_is_a_one_line_validation_error(gguf_ws, tmp_path):
    import gguf as gguf_pkg
    import numpy as np

    cache = tmp_path / "cache"
    env = cli_env(RLWEAVE_CACHE=str(cache))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes((gguf_ws / "model.gguf").read_bytes()[:200])  # cut inside the metadata
    rc, out, _ = run_cli(["validate", _config(tmp_path, "corrupt", corrupt, gguf_ws)], env)
    assert rc == 2
    _one_issue(out, "model.path", str(corrupt), "not a readable GGUF file")

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    writer = gguf_pkg.GGUFWriter(str(foreign / "m.gguf"), "notanarch")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    rc, out, _ = run_cli(["validate", _config(tmp_path, "foreign", foreign, gguf_ws)], env)  # a directory holding one
    assert rc == 2
    _one_issue(out, "model.path", str(foreign / "m.gguf"), "architecture 'notanarch'")
    rc, out, _ = run_cli(["generate", str(corrupt), "--data", str(gguf_ws / "test.jsonl"), "--out",
                          str(tmp_path / "o.jsonl")], env)
    assert rc == 2 and _one_issue(out, "error: ", str(corrupt)).startswith("error: ")
    assert not cache.exists()  # nothing converted
