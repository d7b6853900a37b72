"""Records with images (:mod:`rlweave.data.vision_records`): both forms load with their images in
placeholder order from jsonl (paths), parquet (bytes), saved datasets and base64; chat prompts
render their image parts; every bad record is one error naming file, line or row, and field;
text-only records are untouched."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from rlweave.data.records import DataError, RecordDataset, iter_records, load_records
from rlweave.data.vision import ImageError, load_image
from rlweave.data.vision_records import record_images


def png(h: int, w: int, color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    """A solid ``h`` x ``w`` image of ``color``, encoded."""
    buf = io.BytesIO()
    from PIL import Image

    Image.fromarray(np.full((h, w, 3), color, dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def colors(images) -> list[tuple[tuple[int, int, int], tuple[int, int]]]:
    """``(colour of the top-left pixel, (width, height))`` of each image."""
    return [(img.getpixel((0, 0)), img.size) for img in images]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def images_dir(tmp_path) -> Path:
    d = tmp_path / "img"
    d.mkdir()
    (d / "red.png").write_bytes(png(16, 24, RED))
    (d / "green.png").write_bytes(png(32, 16, GREEN))
    return d


def test_chat_records_in_every_part_form_load_their_images_in_order(tmp_path, images_dir):
    blue = "data:image/png;base64," + base64.b64encode(png(16, 16, BLUE)).decode()
    rows = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which?"},
                                                   {"type": "image"}]},
                      {"role": "assistant", "content": "left"}], "images": ["img/green.png", "img/red.png"]},
        {"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": blue}},
                                                 {"type": "text", "text": "and?"},
                                                 {"type": "image", "image": "img/red.png"}]}], "answer": "x"},
        {"messages": [{"role": "user", "content": "<image>first, <image>second"}],
         "images": ["img/red.png", str(images_dir / "green.png")]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "file://" + str(images_dir / "red.png")},
                                                   {"type": "image"}]}], "images": "img/green.png"},
    ]
    records = load_records(write_jsonl(tmp_path / "chat.jsonl", rows))
    assert [colors(record_images(r)) for r in records] == [
        [(GREEN, (16, 32)), (RED, (24, 16))], [(BLUE, (16, 16)), (RED, (24, 16))],
        [(RED, (24, 16)), (GREEN, (16, 32))], [(RED, (24, 16)), (GREEN, (16, 32))]]
    assert records[0]["images"] == [str(images_dir / "green.png"), str(images_dir / "red.png")]
    assert records[1]["images"][0] == blue and records[1]["answer"] == "x"
    # image parts are bare (TRL's form), so loading the normalised records again changes nothing
    assert records[1]["prompt"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "and?"},
                                                  {"type": "image"}]
    assert records[2]["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "first, "},
                                                    {"type": "image"}, {"type": "text", "text": "second"}]
    again = load_records(write_jsonl(tmp_path / "again.jsonl", [{k: v for k, v in r.items() if k != "id"}
                                                                for r in records]))
    assert again == [{**r, "id": f"again:{i + 1}"} for i, r in enumerate(records)]


def test_chat_prompts_render_their_image_parts_with_the_template(tmp_path, images_dir):
    from rlweave.testing.tiny_vlm import vision_tokenizer

    tok = vision_tokenizer(["abcdefghijklmnopqrstuvwxyz?, "])
    rows = [{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "image_url", "image_url": {"url": "img/red.png"}},
                                                       {"type": "text", "text": "b"}]},
                          {"role": "assistant", "content": "c"}]}]
    (rec,) = load_records(write_jsonl(tmp_path / "chat.jsonl", rows), tokenizer=tok)
    assert rec["prompt"] == "a<|vision_start|><|image_pad|><|vision_end|>b"
    assert rec["messages"][1] == {"role": "assistant", "content": "c"}


def test_plain_prompts_take_a_list_or_one_value(tmp_path, images_dir):
    rows = [{"prompt": "<|image_pad|> vs <|image_pad|>", "images": ["img/red.png", "img/green.png"], "answer": 1},
            {"query": "<|image_pad|> ?", "images": "img/green.png"},
            {"prompt": "no image", "images": []}]
    records = load_records(write_jsonl(tmp_path / "plain.jsonl", rows))
    assert [colors(record_images(r)) for r in records] == [[(RED, (24, 16)), (GREEN, (16, 32))],
                                                            [(GREEN, (16, 32))], []]
    assert records[0]["prompt"] == "<|image_pad|> vs <|image_pad|>" and records[2]["images"] == []


def test_parquet_bytes_and_saved_datasets_load_undecoded(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    red, green = png(16, 16, RED), png(16, 32, GREEN)
    rows = [{"id": "a", "prompt": "<|image_pad|><|image_pad|>", "messages": None,
             "images": [{"bytes": red, "path": None}, {"bytes": green, "path": "g.png"}]},
            {"id": "b", "prompt": None, "images": None,
             "messages": [{"role": "user", "content": [{"type": "image", "image": {"bytes": green}, "text": None},
                                                       {"type": "text", "text": "hi", "image": None}]}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    features = datasets.Features({"prompt": datasets.Value("string"), "images": datasets.List(datasets.Image())})
    datasets.Dataset.from_dict({"prompt": ["<|image_pad|>"], "images": [[{"bytes": red, "path": None}]]},
                               features=features).save_to_disk(tmp_path / "saved")
    records = load_records(tmp_path / "d.parquet")
    assert records[0]["images"] == [red, green] and records[1]["images"] == [green]
    assert records[1]["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "hi"}]
    assert [colors(record_images(r)) for r in records] == [[(RED, (16, 16)), (GREEN, (32, 16))], [(GREEN, (32, 16))]]
    (saved,) = load_records(tmp_path / "saved")
    assert saved["images"] == [red] and colors(record_images(saved)) == [(RED, (16, 16))]


def test_base64_images_load_whatever_their_first_characters(tmp_path):
    jpeg = base64.b64encode(png(16, 16, BLUE, "JPEG")).decode()
    assert jpeg.startswith("/9j/")  # a JPEG's base64 looks like an absolute path at first
    rows = [{"prompt": "<|image_pad|>", "images": [jpeg, base64.b64encode(png(16, 16, RED)).decode()]}]
    (rec,) = RecordDataset(write_jsonl(tmp_path / "b64.jsonl", rows))
    (blue, red) = record_images(rec)
    assert np.abs(np.asarray(blue, dtype=int) - BLUE).max() < 8 and red.getpixel((3, 3)) == RED


def test_text_only_records_are_left_as_they_are(tmp_path):
    rows = [{"prompt": "1+1=", "answer": 2}, {"messages": [{"role": "user", "content": "hi"}]},
            {"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert load_records(path) == [{**r, "id": f"t:{i + 1}"} for i, r in enumerate(rows)]
    assert all(record_images(r) == [] for r in load_records(path))


@pytest.mark.parametrize("bad,message", [
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]},
     "field 'messages': message 0: part 0 has type 'video'; the part types are text, image, image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "field 'messages': message 0: part 0 (text) has no 'text' string"),
    ({"messages": [{"role": "user", "content": ["hi"]}]},
     "field 'messages': message 0: part 0 is a str, not a {type, ...} object"),
    ({"messages": [{"role": "user", "content": []}]}, "field 'messages': message 0: the content part list is empty"),
    ({"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "field 'prompt': message 0: part 0 (image_url) needs 'image_url': {'url': <image>}"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}, {"type": "image"}]}],
      "images": ["img/red.png"]},
     "field 'messages': message 0 part 2: an image part without a value, and the record's 'images' has no value "
     "left for it (1 given)"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "images": ["img/red.png", "img/red.png"]},
     "field 'images': 2 image(s) given but 'messages' has 1 image part(s) without a value to take them: put a "
     "{\"type\": \"image\"} part where each image goes"),
    ({"messages": [{"role": "user", "content": "what is it?"}], "images": ["img/red.png"]},
     "field 'images': 1 image(s) given but 'messages' has 0 image part(s) without a value to take them: put a "
     "{\"type\": \"image\"} part where each image goes"),
    ({"prompt": "<|image_pad|>", "images": ["img/red.png", "img/blue.png"]},
     "field 'images': image 1: image file '{d}/img/blue.png' does not exist ('img/blue.png' is taken from the data "
     "file's folder)"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "image": "https://x.org/a.png"}]}]},
     "field 'messages': image 0: 'https://x.org/a.png' is a remote URL; images are not downloaded: download it and "
     "give its path (or its bytes or base64)"),
    ({"prompt": "<|image_pad|>", "images": [7]},
     "field 'images': image 0: expected a path, base64 text, bytes or a {bytes, path} mapping, got int"),
    ({"prompt": "<|image_pad|>", "images": [{"name": "a.png"}]},
     "field 'images': image 0: a mapping needs 'bytes' or 'path' (has ['name'])"),
    ({"prompt": "p", "chosen": [{"role": "assistant", "content": [{"type": "image", "image": "img/red.png"}]}],
      "rejected": "r"},
     "field 'chosen': message 0 part 0: an image outside the prompt; images are read from the prompt's messages "
     "(prompt or messages) only"),
], ids=["unknown-part", "text-part-without-text", "part-not-object", "empty-parts", "image-url-without-url",
        "too-few-images", "too-many-images", "chat-without-parts", "missing-file", "remote-url", "wrong-type",
        "mapping-without-bytes", "image-in-answer"])
def test_a_bad_image_record_is_one_line_naming_file_line_and_field(tmp_path, images_dir, bad, message):
    good = {"prompt": "<|image_pad|>", "images": ["img/red.png"]}
    path = write_jsonl(tmp_path / "d.jsonl", [good, "", bad])
    with pytest.raises(DataError) as err:
        load_records(path)
    assert str(err.value) == f"{path} line 3: {message.replace('{d}', str(tmp_path))}"


def test_an_image_file_that_does_not_decode_names_the_record_and_image(tmp_path, images_dir):
    (images_dir / "broken.png").write_bytes(b"not an image")
    rows = [{"id": "r1", "prompt": "<|image_pad|>" * 2, "images": ["img/red.png", "img/broken.png"]}]
    ((location, rec),) = iter_records(write_jsonl(tmp_path / "d.jsonl", rows))
    assert location == "line 1"
    with pytest.raises(ImageError, match=r"^record r1: field 'images': image 1: cannot decode the image"):
        record_images(rec)
    with pytest.raises(ImageError, match="images are not downloaded|remote URL"):
        load_image("http://example.org/a.png")
