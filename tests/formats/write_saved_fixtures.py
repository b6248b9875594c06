#!/usr/bin/env python3
"""Writes tests/formats/data/saved/: datasets written by Hugging Face
`datasets`' own `save_to_disk` (Arrow IPC streams, state.json,
dataset_info.json; a DatasetDict's dataset_dict.json), and reads each back
with `datasets.load_from_disk` to write what each row holds.

The fixtures are committed (CI does not install `datasets`); this script is
how they were made, in the environment tests/formats/requirements-hub-writers.txt
pins:

    python3 -m venv /tmp/hfw && /tmp/hfw/bin/pip install -r tests/formats/requirements-hub-writers.txt
    /tmp/hfw/bin/python tests/formats/write_saved_fixtures.py tests/formats/data/saved

Datasets:
  tokens/   a DatasetDict: train (50 rows, num_shards=3) and test (12 rows);
            input_ids list<int32>, text string, label int64. save_to_disk
            writes record batches of config.DEFAULT_MAX_BATCH_SIZE rows (1000,
            fewer for large rows); it is set to 8 here so that each file holds
            several batches, as a large dataset's files do.
  images/   a Dataset (no splits): image (the Image feature, PNG bytes) and
            label int64, 6 rows

expected.json: per dataset and split ("" for a Dataset), load_from_disk's rows
in order: input_ids, text (hex of its UTF-8), label, image bytes (hex); and
per Arrow file, its record batches' row counts (pyarrow's stream reader).
"""

import json
import os
import shutil
import sys

import datasets
import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, Image, Value, load_from_disk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_hub_fixtures import TOKENS, png, rows_of, tokens_rows  # noqa: E402  (the Hub fixtures' rows)


def batches_of(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".arrow"):
            with pa.OSFile(os.path.join(folder, name)) as f:
                out[name] = [b.num_rows for b in pa.ipc.open_stream(f)]
    return out


def main(out):
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    exp = {"datasets": datasets.__version__, "saved": {}, "batches": {}}

    root = os.path.join(out, "tokens")
    dd = DatasetDict(
        {
            "train": Dataset.from_dict(tokens_rows(50, 1), features=TOKENS),
            "test": Dataset.from_dict(tokens_rows(12, 2), features=TOKENS),
        }
    )
    datasets.config.DEFAULT_MAX_BATCH_SIZE = 8
    dd.save_to_disk(root, num_shards={"train": 3, "test": 1})
    back = load_from_disk(root)
    exp["saved"]["tokens"] = {s: rows_of(back[s]) for s in ("train", "test")}
    for s in ("train", "test"):
        exp["batches"][f"tokens/{s}"] = batches_of(os.path.join(root, s))

    root = os.path.join(out, "images")
    feats = Features({"image": Image(), "label": Value("int64")})
    ds = Dataset.from_dict({"image": [{"bytes": png(i), "path": None} for i in range(6)], "label": list(range(6))},
                           features=feats)
    datasets.config.DEFAULT_MAX_BATCH_SIZE = 4
    ds.save_to_disk(root)
    exp["saved"]["images"] = {"": rows_of(load_from_disk(root))}
    exp["batches"]["images"] = batches_of(root)

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main(sys.argv[1])
