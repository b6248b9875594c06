#!/usr/bin/env python3
"""Writes tests/formats/data/webdataset/ with webdataset's TarWriter, indexes
it with Megatron-Energon's prepare and with DALI's wds2idx.py, and reads it
back with webdataset.

The fixtures are committed (CI does not install torch, which Energon
needs): this script is how they were made, and how to make them again, in
the environment tests/formats/requirements-writers.txt pins:

    /tmp/writers/bin/python tests/formats/write_webdataset_fixtures.py tests/formats/data/webdataset

It writes shard-000000.tar and shard-000001.tar with webdataset.TarWriter
(keys in folders, a name longer than ustar's 100 bytes, which Python's
tarfile writes with a PAX header, an upper-case extension, encoded
"images" of every size, integer classes and JSON), shard-000002.tar with
the same writer but no index, and SHARD.tar.idx beside the first two with
Energon's WebdatasetPreparator.prepare_dataset(tar_index_only=True), and
DALI's text index SHARD.idx beside them with DALI's wds2idx.py (the module
nvidia-dali-cuda120's wheel installs; it reads the shard with the tar
program). Then
it reads every shard with webdataset.WebDataset and writes what it
returns into SHARD.expected.json: each sample's key and, per field, the
hex of its bytes.
"""
import json
import os
import random
import sys

import webdataset
from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator
from wds2idx import IndexCreator  # DALI's (nvidia-dali-cuda120)


def write_shard(path, rng, first, count):
    with webdataset.TarWriter(path) as w:
        for i in range(first, first + count):
            key = f"train/{i:06d}"
            if i % 7 == 3:
                key = "train/" + "long-key-" * 12 + f"{i:06d}"  # > 100 bytes: a PAX header
            sample = {
                "__key__": key,
                "jpg": bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 511, 512, 513, 3000]))),
                "cls": str(rng.randrange(1000)).encode(),
            }
            if i % 3 == 0:
                sample["json"] = json.dumps({"caption": f"sample {i}", "w": rng.randrange(64)}).encode()
            if i % 5 == 0:
                sample["TXT"] = f"upper-case extension {i}".encode()
            w.write(sample)


def expected(path):
    out = []
    for s in webdataset.WebDataset(path, shardshuffle=False):
        fields = {k: v.hex() for k, v in s.items() if not k.startswith("__")}
        out.append({"key": s["__key__"], "fields": fields})
    return {"writer": "webdataset.TarWriter; read back with webdataset.WebDataset", "samples": out}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(36)
    shards = [("shard-000000.tar", 0, 12), ("shard-000001.tar", 12, 9), ("shard-000002.tar", 21, 5)]
    for name, first, count in shards:
        write_shard(os.path.join(out, name), rng, first, count)
    WebdatasetPreparator.prepare_dataset(out, ["shard-{000000..000001}.tar"], split_parts_ratio=[("train", 1.0)],
                                         tar_index_only=True, workers=1)
    for name, _, _ in shards[:2]:
        tar = os.path.join(out, name)
        with IndexCreator(tar, tar[:-len(".tar")] + ".idx", verbose=False) as creator:
            creator.create_index()
    for name, _, _ in shards:
        with open(os.path.join(out, name[:-len(".tar")] + ".expected.json"), "w") as f:
            json.dump(expected(os.path.join(out, name)), f, indent=0)
            f.write("\n")


if __name__ == "__main__":
    main()
