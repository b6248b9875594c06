#!/usr/bin/env python3
"""Writes tests/formats/data/parquet/ with pyarrow's Parquet writer
(pyarrow.parquet.write_table, the reference C++ writer under it), and reads
every file back with pyarrow.parquet.read_table to write what each row holds.

The environment is the project's own .venv (pyarrow is pinned in
requirements-build.txt), so the fixtures can be made again exactly:

    .venv/bin/python tests/formats/write_parquet_fixtures.py tests/formats/data/parquet

One table of 60 rows, the columns a training set has, as Hugging Face
`datasets` writes them:
  input_ids  list<int32>, 0 to 40 tokens (row 9 an empty list, row 13 null)
  text       string (row 21 null; some non-ASCII)
  label      int64
  score      float
  flag       bool
  emb        fixed_size_list<float, 4>
  grid       fixed_size_list<fixed_size_list<int16, 3>, 2>
  image      struct<bytes: binary, path: string> (the Hub's Image
             feature; row 30 a null image, row 31 an image of null bytes)
  digest     fixed_size_binary(8)
  big_ids    large_list<int64>
and columns meshload refuses by name: ts timestamp[ms], price decimal128(9,2),
tags list<string>, attrs map<string,int32>, kind dictionary<int32, string>,
image (the whole struct).

The same table is written several ways, each file holding every row:
  rg7-dict-snappy.parquet     row groups of 7 rows, dictionary encoding,
                              snappy pages, no page index, data page v1
  rg25-plain-zstd-v2.parquet  row groups of 25, no dictionary, zstd, a page
                              index, data page v2, 1 KiB pages (several a chunk)
  rg1000-gzip.parquet         one row group, dictionary, gzip, a page index
schema-int64.parquet is the first 10 rows with input_ids as list<int64> (a
file whose schema differs). expected.json: per row, per column (those
delivered), the bytes meshload delivers in lower-case hex (a string's or
binary's bytes; numbers little-endian in the column's dtype, a bool one
byte; a list's or fixed-size list's values back to back), or null.
"""
import datetime
import decimal
import json
import os
import random
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 60


def table():
    rng = random.Random(52)
    input_ids, text, label, score, flag, emb, grid, image, digest, big = [], [], [], [], [], [], [], [], [], []
    for i in range(ROWS):
        n = 0 if i == 9 else rng.randrange(1, 41)
        input_ids.append(None if i == 13 else [rng.randrange(-5, 50000) for _ in range(n)])
        text.append(None if i == 21 else "row %d %s" % (i, "ü€" * (i % 3)))
        label.append(rng.randrange(-3, 10**12))
        score.append(rng.random() * 100)
        flag.append(i % 3 == 0)
        emb.append([rng.random() for _ in range(4)])
        grid.append([[rng.randrange(-300, 300) for _ in range(3)] for _ in range(2)])
        if i == 30:
            image.append(None)
        elif i == 31:
            image.append({"bytes": None, "path": "missing.png"})
        else:
            image.append({"bytes": bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 300]))),
                          "path": "img%d.png" % i})
        digest.append(bytes(rng.randrange(256) for _ in range(8)))
        big.append([rng.randrange(-2**40, 2**40) for _ in range(rng.randrange(0, 5))])
    return pa.table({
        "input_ids": pa.array(input_ids, pa.list_(pa.int32())),
        "text": pa.array(text, pa.string()),
        "label": pa.array(label, pa.int64()),
        "score": pa.array(score, pa.float32()),
        "flag": pa.array(flag, pa.bool_()),
        "emb": pa.array(emb, pa.list_(pa.float32(), 4)),
        "grid": pa.array(grid, pa.list_(pa.list_(pa.int16(), 3), 2)),
        "image": pa.array(image, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "digest": pa.array(digest, pa.binary(8)),
        "big_ids": pa.array(big, pa.large_list(pa.int64())),
        "ts": pa.array([datetime.datetime(2026, 1, 1) + datetime.timedelta(minutes=i) for i in range(ROWS)],
                       pa.timestamp("ms")),
        "price": pa.array([decimal.Decimal(i) / 4 for i in range(ROWS)], pa.decimal128(9, 2)),
        "tags": pa.array([["a", "b"][: i % 3] for i in range(ROWS)], pa.list_(pa.string())),
        "attrs": pa.array([[("k", i)] for i in range(ROWS)], pa.map_(pa.string(), pa.int32())),
        "kind": pa.array(["x", "y", "z"] * (ROWS // 3)).dictionary_encode(),
    })


DTYPES = {"input_ids": "<i4", "label": "<i8", "score": "<f4", "flag": "u1", "emb": "<f4", "grid": "<i2",
          "big_ids": "<i8"}


def delivered(name, value):
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode().hex()
    if isinstance(value, bytes):
        return value.hex()
    return np.asarray(value, dtype=DTYPES[name]).tobytes().hex()


def expected(path):
    t = pq.read_table(path)
    rows = []
    for r in t.to_pylist():
        row = {name: delivered(name, r[name]) for name in DTYPES}
        row["text"] = delivered("text", r["text"])
        row["digest"] = delivered("digest", r["digest"])
        img = r["image"]
        row["image.bytes"] = None if img is None else delivered("image.bytes", img["bytes"])
        row["image.path"] = None if img is None else delivered("image.path", img["path"])
        rows.append(row)
    return rows


def main(out):
    os.makedirs(out, exist_ok=True)
    t = table()
    files = {
        "rg7-dict-snappy.parquet": dict(row_group_size=7, use_dictionary=True, compression="snappy"),
        "rg25-plain-zstd-v2.parquet": dict(row_group_size=25, use_dictionary=False, compression="zstd",
                                           write_page_index=True, data_page_version="2.0", data_page_size=1024),
        "rg1000-gzip.parquet": dict(row_group_size=1000, use_dictionary=True, compression="gzip",
                                    write_page_index=True),
    }
    want = None
    for name, opts in files.items():
        path = os.path.join(out, name)
        pq.write_table(t, path, **opts)
        rows = expected(path)
        if want is None:
            want = rows
        assert rows == want, name
    other = t.slice(0, 10).set_column(0, "input_ids", t.column("input_ids").slice(0, 10).cast(pa.list_(pa.int64())))
    pq.write_table(other, os.path.join(out, "schema-int64.parquet"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"rows": want, "files": {n: {"row_group_size": min(o["row_group_size"], ROWS)}
                                            for n, o in files.items()}}, f, indent=0, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
