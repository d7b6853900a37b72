"""GGUF model paths (:mod:`rlweave.config.gguf`, :mod:`rlweave.config.gguf_convert`), the parts that
need no training: which path names a GGUF; that a tensor type the gguf package cannot dequantize
is one config error naming the file (a quantised type it can, Q4_K, passes); where the cache is;
that a cache folder which is not a finished conversion of ours is never overwritten; that every
model key naming one file uses one conversion; and that reading these modules imports neither
torch nor transformers. Training from a GGUF: ``tests/test_gguf_input.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlweave.config.gguf import GgufError, cache_root, file_sha256, gguf_file


def _write_gguf(path, arch: str = "llama", quant: str | None = None):
    """A GGUF of one tensor: float32, or ``quant`` (a ggml type name) blocks of zeros."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    if quant is None:
        w.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    else:
        kind = gguf.GGMLQuantizationType[quant]
        block, size = gguf.GGML_QUANT_SIZES[kind]
        w.add_tensor("token_embd.weight", np.zeros((4, 256 // block * size), dtype=np.uint8), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fakes():
    """The core tests' fake plugins (``plugin_dists/fakes.py``)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("rlweave_test_fakes", Path(__file__).parent / "plugin_dists" /
                                                  "fakes.py")
    fakes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakes)
    return fakes


def test_which_paths_name_a_gguf(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    f = _write_gguf(one / "m.Q4.gguf")
    assert gguf_file(f) == f and gguf_file(one) == f and gguf_file(str(one)) == f
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _write_gguf(hf / "extra.gguf")
    assert gguf_file(hf) is None  # a Hugging Face directory stays one
    assert gguf_file(tmp_path / "missing.gguf") is None and gguf_file(None) is None
    (tmp_path / "notes.txt").write_text("x")
    assert gguf_file(tmp_path / "notes.txt") is None
    two = tmp_path / "two"
    two.mkdir()
    _write_gguf(two / "a.gguf")
    _write_gguf(two / "b.gguf")
    with pytest.raises(GgufError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\).*name the file"):
        gguf_file(two)


def test_a_quantisation_that_cannot_be_dequantized_is_one_config_error_naming_the_file(monkeypatch, tmp_path):
    from pathlib import Path

    import yaml

    from rlweave.config.errors import ConfigError
    from rlweave.config.loader import load_config

    monkeypatch.chdir(tmp_path)
    _write_gguf(tmp_path / "ok.gguf", quant="Q4_K")
    _write_gguf(tmp_path / "q81.gguf", quant="Q8_1")
    Path("train.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    data = {"resources": {"pools": {"default": {"devices_per_node": 2}}},
            "roles": {"policy": {"backend": "fsdp"}, "rollout": {"engine": "vllm", "model": {"path": "ok.gguf"}}},
            "algorithm": {"name": "grpo"}, "model": {"path": "q81.gguf"}, "data": {"train": "train.jsonl"}}
    Path("c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_config("c.yaml", pm=_fakes().make_pm())
    assert [str(i) for i in err.value.issues] == [
        "c.yaml: model.path: 'q81.gguf': tensor 'token_embd.weight' is stored as Q8_1, which the gguf package cannot "
        "dequantize; use a file in another quantisation"]


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("RLWEAVE_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c" / "gguf"
    monkeypatch.delenv("RLWEAVE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "rlweave" / "gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "rlweave" / "gguf"


def test_a_cache_folder_that_is_not_ours_is_never_overwritten(monkeypatch, tmp_path):
    from rlweave.config.gguf_convert import converted_dir

    monkeypatch.setenv("RLWEAVE_CACHE", str(tmp_path / "cache"))
    src = _write_gguf(tmp_path / "m.gguf")
    entry = tmp_path / "cache" / "gguf" / file_sha256(src)[:16]
    entry.mkdir(parents=True)
    (entry / "mine.txt").write_text("keep me")
    with pytest.raises(GgufError, match=f"{entry} exists but is not a finished conversion.*left as it is"):
        converted_dir(src, say=lambda line: None)
    assert [p.name for p in entry.iterdir()] == ["mine.txt"] and (entry / "mine.txt").read_text() == "keep me"
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary folder left


def test_reading_gguf_paths_imports_neither_torch_nor_transformers_models(tmp_path):
    src = _write_gguf(tmp_path / "m.gguf")
    code = ("import sys\nfrom pathlib import Path\nimport rlweave.config.gguf_convert\n"
            "from rlweave.config.gguf import check_gguf\n"
            f"info = check_gguf(Path({str(src)!r}))\n"
            "assert info.architecture == 'llama' and info.tensor_types == ('F32',), info\n"
            "print(sorted(m for m in ('torch', 'transformers.modeling_utils') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_model_key_naming_one_gguf_uses_one_conversion(monkeypatch, tmp_path):
    from pathlib import Path

    import yaml

    from rlweave.config.gguf_convert import localize_gguf
    from rlweave.config.loader import load_config
    from rlweave.testing.tiny_gguf import byte_bpe_tokenizer, write_llama_gguf
    from rlweave.testing.tiny_model import build_tiny

    fakes = _fakes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLWEAVE_CACHE", str(tmp_path / "cache"))
    arch = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=32, max_position_embeddings=32)
    texts = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    source = build_tiny("Llama", arch, tmp_path / "src", tokenizer=byte_bpe_tokenizer(texts))
    (tmp_path / "models").mkdir()
    write_llama_gguf(source, tmp_path / "models" / "m.gguf")
    Path("train.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n')
    data = {"resources": {"pools": {"default": {"devices_per_node": 2}}},
            "roles": {"policy": {"backend": "fsdp", "model": {"path": "models"}}, "rollout": {"engine": "vllm"}},
            "algorithm": {"name": "grpo"}, "model": {"path": "models/m.gguf", "tokenizer": "models/m.gguf"},
            "data": {"train": "train.jsonl"}}
    Path("c.yaml").write_text(yaml.safe_dump(data))
    cfg, _ = load_config("c.yaml", pm=fakes.make_pm())  # validation reads the header: a usable GGUF
    lines: list[str] = []
    local, found = localize_gguf(cfg, lines.append)
    assert sorted(found) == ["model.path", "model.tokenizer", "roles.policy.model.path"]
    assert len(set(found.values())) == 1 and sum("converting" in line for line in lines) == 1, lines
    hf = str(found["model.path"])
    assert local.model.path == local.model.tokenizer == local.roles["policy"].model.path == hf
    assert cfg.model.path == "models/m.gguf" and cfg.roles["policy"].model.path == "models"  # the config as written
