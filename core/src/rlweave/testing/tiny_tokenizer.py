"""Character-level tokenizers trained locally (no downloads) for tiny models of toy tasks.

:func:`char_tokenizer` trains a WordLevel tokenizer with one token per character seen (plus the
special tokens :data:`SPECIALS`) and returns it as a ``PreTrainedTokenizerFast`` that
transformers and vLLM load from a model directory; :func:`task_texts` reads a task's training
texts (``{"query"|"prompt", "response"|"answer"}`` JSONL rows) to train it on. Pass the result
to a builder of :mod:`rlweave.testing.tiny_model` (``tokenizer=``) to save it beside the model.
Same texts -> the same vocabulary, in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

#: special tokens, ids 0-3 in this order
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
#: prompt/assistant turns concatenated; the assistant turn ends with EOS. Lets algorithms that
#: use chat templates treat ``{"messages": [...]}`` like ``{"query", "response"}``.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def task_texts(data_dir: str | Path, alphabet: str,
               files: tuple[str, ...] = ("sft_train.jsonl", "rl_train.jsonl")) -> Iterator[str]:
    """``alphabet`` (so no symbol of the task is missing), then every prompt and answer of the
    JSONL ``files`` under ``data_dir`` (missing files are skipped): ``query`` or ``prompt``,
    and ``response`` or ``answer`` as a string."""
    yield alphabet
    for name in files:
        path = Path(data_dir) / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            yield rec.get("query") or rec.get("prompt") or ""
            yield str(rec.get("response", rec.get("answer", "")))


def char_tokenizer(texts: Iterable[str], *, max_length: int = 256, chat_template: str = CHAT_TEMPLATE):
    """A character-level WordLevel tokenizer trained on ``texts``, as a
    ``PreTrainedTokenizerFast``: pad/bos/eos/unk set (:data:`SPECIALS`), no BOS added, left
    padding, ``model_max_length`` ``max_length`` and ``chat_template``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIALS), min_frequency=1, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        model_max_length=max_length, padding_side="left", clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template
    return fast
