#!/usr/bin/env python3
"""Writes tests/formats/data/mds/ with MosaicML Streaming's MDSWriter and
reads it back with Streaming's own shard reader.

The fixtures are committed (CI does not install Streaming, which needs
torch): this script is how they were made, and how to make them again, in
the environment tests/formats/requirements-writers.txt pins:

    /tmp/writers/bin/python tests/formats/write_mds_fixtures.py tests/formats/data/mds

raw/: an uncompressed dataset in several shards (a small size_limit), with
a variable-shape ndarray of int32 tokens, a string, an int, bytes, a
float32 and a fixed-shape ndarray. zstd/, gz/, bz2/, br/, snappy/: the
same samples in shards compressed with each codec Streaming writes (MDSWriter
keeps only the compressed files). For each, expected.json holds, per shard
of index.json and per sample, what Streaming's reader returns: the sample's
raw bytes (get_sample_data) and each column re-encoded from the decoded
value (mds_encode(decode_sample(...))), in hex; for a compressed dataset the
reader reads the shards as Streaming decompresses them
(streaming.base.compression.decompress) into a scratch folder.
"""
import json
import os
import random
import shutil
import sys
import tempfile

import numpy
from streaming import MDSWriter
from streaming.base.compression import decompress
from streaming.base.format import reader_from_json
from streaming.base.format.mds.encodings import mds_encode

COLUMNS = {
    "tokens": "ndarray:int32",
    "text": "str",
    "label": "int",
    "image": "bytes",
    "score": "float32",
    "box": "ndarray:uint16:4",
}


def samples(rng):
    for i in range(40):
        yield {
            "tokens": numpy.array([rng.randrange(-5, 50000) for _ in range(rng.choice([1, 9, 300]))], numpy.int32),
            "text": f"document {i} " + "x" * rng.randrange(50),
            "label": rng.randrange(-3, 1000),
            "image": bytes(rng.randrange(256) for _ in range(rng.choice([0, 17, 700]))),
            "score": numpy.float32(rng.random()),
            "box": numpy.array([rng.randrange(65536) for _ in range(4)], numpy.uint16),
        }


def expected(out, scratch):
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    shards = []
    for obj in index["shards"]:
        if obj["compression"]:
            with open(os.path.join(out, obj["zip_data"]["basename"]), "rb") as f:
                raw = decompress(obj["compression"], f.read())
            with open(os.path.join(scratch, obj["raw_data"]["basename"]), "wb") as f:
                f.write(raw)
        reader = reader_from_json(scratch if obj["compression"] else out, None, obj)
        rows = []
        for i in range(obj["samples"]):
            raw = reader.get_sample_data(i)
            decoded = reader.decode_sample(raw)
            rows.append({
                "raw": raw.hex(),
                "columns": {c: mds_encode(e, decoded[c]).hex() for c, e in COLUMNS.items()},
            })
        shards.append(rows)
    return {"writer": "streaming.MDSWriter; read back with streaming's MDS reader", "shards": shards}


CODECS = (("raw", None), ("zstd", "zstd"), ("gz", "gz"), ("bz2", "bz2"), ("br", "br:5"), ("snappy", "snappy"))


def main():
    root = sys.argv[1]
    for name, compression in CODECS:
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=out, columns=COLUMNS, compression=compression, size_limit=8192) as w:
            for s in samples(random.Random(36)):
                w.write(s)
        with tempfile.TemporaryDirectory() as scratch:
            got = expected(out, scratch)
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump(got, f, indent=0)
            f.write("\n")


if __name__ == "__main__":
    main()
