#!/usr/bin/env python3
"""Writes tests/formats/data/hub/: Hugging Face Hub dataset repositories as
`datasets.DatasetDict.push_to_hub` lays them out, and reads every split back
with `datasets.load_dataset` (the Hub's own reading of a repository's
README.md configs and file names) to write what each row holds.

The fixtures are committed (CI does not install `datasets`); this script is
how they were made, in the environment tests/formats/requirements-hub-writers.txt
pins:

    python3 -m venv /tmp/hfw && /tmp/hfw/bin/pip install -r tests/formats/requirements-hub-writers.txt
    /tmp/hfw/bin/python tests/formats/write_hub_fixtures.py tests/formats/data/hub

There is no Hub to push to here, so the script does what push_to_hub does
for each split with the same `datasets` code, into a folder instead of a
commit: the split cut into contiguous shards (`Dataset.shard`), external
files embedded (`embed_table_storage`), each shard written by
`Dataset.to_parquet` as `DATA_DIR/SPLIT-00000-of-0000N.parquet`, and the
README.md card made by push_to_hub's own `_get_updated_dataset_card` over the
folder (a second config's push updates the card the first one wrote).
`load_dataset` then reads the folder as it would a cloned repository.

Repositories:
  tokens/         config default: train (50 rows, 3 shards), test (12 rows,
                  1 shard); input_ids list<int32>, text string, label int64
  configs/        configs en (train, 20 rows, 2 shards, in en/; pushed with
                  set_default=True) and fr (train, 9 rows, in fr/)
  images/         config default: train (6 rows): image (the Image feature:
                  struct<bytes, path>, PNG bytes embedded), label int64
  default-layout/ no README.md: data/train-0000N-of-00002.parquet and
                  data/validation-00000-of-00001.parquet, as a repository
                  whose card names no configs (the Hub infers the splits
                  from the file names)

expected.json: per repository, config and split, load_dataset's rows in
order: input_ids, text (hex of its UTF-8), label, image bytes (hex).
"""

import io
import json
import os
import shutil
import sys
import tempfile

import datasets
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, List, Value, load_dataset
from datasets.arrow_dataset import _get_updated_dataset_card
from datasets.table import embed_table_storage
from datasets.features.features import require_decoding
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from PIL import Image as PILImage


def push(dd: DatasetDict, root: str, config_name: str = "default", num_shards=None, set_default=None):
    """push_to_hub's steps for each split, into the folder `root`."""
    data_dir = config_name if config_name != "default" else "data"
    os.makedirs(os.path.join(root, data_dir), exist_ok=True)
    splits_info, uploaded_sizes, features = [], [], None
    for split, ds in dd.items():
        n = (num_shards or {}).get(split, 1)
        decodable = [k for k, v in ds.features.items() if require_decoding(v, ignore_decode_attribute=True)]
        size = 0
        for index in range(n):
            shard = ds.shard(num_shards=n, index=index, contiguous=True)
            if decodable:
                fmt = shard.format
                shard = shard.with_format("arrow").map(embed_table_storage, batched=True, keep_in_memory=True)
                shard = shard.with_format(**fmt)
            path = os.path.join(root, f"{data_dir}/{split}-{index:05d}-of-{n:05d}.parquet")
            shard.to_parquet(path)
            size += os.path.getsize(path)
        splits_info.append(datasets.SplitInfo(name=split, num_bytes=ds._estimate_nbytes(), num_examples=len(ds)))
        uploaded_sizes.append(size)
        features = ds.features
    fs = DirFileSystem(path=root, fs=LocalFileSystem())
    card, legacy = _get_updated_dataset_card(
        fs=fs,
        config_name=config_name,
        splits_info=splits_info,
        features=features,
        data_dir=data_dir,
        set_default=set_default,
        uploaded_sizes=uploaded_sizes,
        deleted_sizes=[],
        remove_other_splits=True,
    )
    assert legacy is None
    with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
        f.write(str(card))


def tokens_rows(n, seed):
    rows = {"input_ids": [], "text": [], "label": []}
    for i in range(n):
        k = (i * 7 + seed) % 23
        rows["input_ids"].append([(i * 131 + j * 17 + seed) % 50000 for j in range(k)])
        rows["text"].append(f"document {seed}-{i} " + "é" * (i % 4) + "x" * (i % 11))
        rows["label"].append((i + seed) % 5)
    return rows


TOKENS = Features({"input_ids": List(Value("int32")), "text": Value("string"), "label": Value("int64")})


def png(i):
    img = PILImage.new("RGB", (3 + i, 2 + i % 3), (i * 40 % 256, 100, 200 - i * 20))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def expected(root, name, split):
    return rows_of(load_dataset(root, name=name, split=split))


def rows_of(ds):
    """What each row of `ds` holds, as expected.json writes it."""
    if "image" in ds.features:
        ds = ds.cast_column("image", Image(decode=False))
    rows = []
    for r in ds:
        row = {}
        if "input_ids" in r:
            row["input_ids"] = r["input_ids"]
        if "text" in r:
            row["text"] = r["text"].encode("utf-8").hex()
        if "label" in r:
            row["label"] = r["label"]
        if "image" in r:
            row["image"] = r["image"]["bytes"].hex()
        rows.append(row)
    return rows


def main(out):
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    exp = {}

    root = os.path.join(out, "tokens")
    dd = DatasetDict(
        {
            "train": Dataset.from_dict(tokens_rows(50, 1), features=TOKENS),
            "test": Dataset.from_dict(tokens_rows(12, 2), features=TOKENS),
        }
    )
    push(dd, root, num_shards={"train": 3})
    exp["tokens"] = {"default": {s: expected(root, "default", s) for s in ("train", "test")}}

    root = os.path.join(out, "configs")
    push(DatasetDict({"train": Dataset.from_dict(tokens_rows(20, 3), features=TOKENS)}), root, "en",
         num_shards={"train": 2}, set_default=True)
    push(DatasetDict({"train": Dataset.from_dict(tokens_rows(9, 4), features=TOKENS)}), root, "fr")
    exp["configs"] = {c: {"train": expected(root, c, "train")} for c in ("en", "fr")}

    root = os.path.join(out, "images")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(6):
            p = os.path.join(tmp, f"img{i}.png")
            with open(p, "wb") as f:
                f.write(png(i))
            paths.append(p)
        feats = Features({"image": Image(), "label": Value("int64")})
        ds = Dataset.from_dict({"image": paths, "label": list(range(6))}, features=feats)
        push(DatasetDict({"train": ds}), root)
    exp["images"] = {"default": {"train": expected(root, "default", "train")}}

    root = os.path.join(out, "default-layout")
    os.makedirs(os.path.join(root, "data"))
    train = Dataset.from_dict(tokens_rows(14, 5), features=TOKENS)
    for i in range(2):
        train.shard(num_shards=2, index=i, contiguous=True).to_parquet(
            os.path.join(root, f"data/train-{i:05d}-of-00002.parquet"))
    Dataset.from_dict(tokens_rows(5, 6), features=TOKENS).to_parquet(
        os.path.join(root, "data/validation-00000-of-00001.parquet"))
    exp["default-layout"] = {"default": {s: expected(root, None, s) for s in ("train", "validation")}}

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"datasets": datasets.__version__, "repositories": exp}, f, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main(sys.argv[1])
