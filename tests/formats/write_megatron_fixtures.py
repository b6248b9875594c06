#!/usr/bin/env python3
"""Writes tests/formats/data/megatron/ with Megatron-LM's own writer and reader.

The fixtures are committed (CI does not install torch): this script is how
they were made, and how to make them again. It needs the packages pinned in
tests/formats/requirements-writers.txt, in an environment of their own:

    python3 -m venv /tmp/writers && /tmp/writers/bin/pip install -r tests/formats/requirements-writers.txt
    /tmp/writers/bin/python tests/formats/write_megatron_fixtures.py tests/formats/data/megatron

For each dataset PREFIX it writes PREFIX.bin and PREFIX.idx with
megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder, then reads
them back with Megatron's IndexedDataset and writes what it returns into
PREFIX.expected.json: the dtype, the document indices, and every sequence
as a list of numbers. The C++ tests hold meshload's reading of the files
against that.
"""
import json
import os
import random
import sys

import numpy
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def write(out, prefix, dtype, documents, multimodal=False):
    path = os.path.join(out, prefix)
    builder = IndexedDatasetBuilder(path + ".bin", dtype=dtype, multimodal=multimodal)
    for doc in documents:
        for seq in doc:
            builder.add_item(torch.tensor(seq), mode=1 if multimodal else 0)
        builder.end_document()
    builder.finalize(path + ".idx")
    if multimodal:
        return  # meshload refuses these; nothing to compare
    ds = IndexedDataset(path)
    expected = {
        "writer": "megatron-core IndexedDatasetBuilder",
        "dtype": numpy.dtype(dtype).name,
        "document_indices": [int(x) for x in ds.document_indices],
        "sequences": [[x.item() for x in ds[i]] for i in range(len(ds))],
    }
    with open(path + ".expected.json", "w") as f:
        json.dump(expected, f)
        f.write("\n")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(36)
    # Token documents of every length (0 included: Megatron allows empty
    # sequences), in the two dtypes Megatron's preprocessing picks (uint16
    # below a 65,500-token vocabulary, int32 above).
    tokens = [[[rng.randrange(65000) for _ in range(rng.choice([0, 1, 7, 60, 513]))]
               for _ in range(rng.randrange(1, 4))] for _ in range(30)]
    write(out, "tokens_uint16", numpy.uint16, tokens)
    write(out, "tokens_int32", numpy.int32, [[[t * 1000 + 7 for t in s] for s in d] for d in tokens])
    # Every other dtype code, one small document each way.
    small = [[[1, 2, 3], [4]], [[5, 6, 7, 8, 9]]]
    for dt in (numpy.uint8, numpy.int8, numpy.int16, numpy.int64, numpy.float32, numpy.float64):
        write(out, "small_" + numpy.dtype(dt).name, dt, small)
    # A multimodal dataset: a mode byte per sequence after the document indices.
    write(out, "multimodal", numpy.int32, small, multimodal=True)
    # A second uint16 corpus of other documents (and more of them, mostly
    # short), to mix with tokens_uint16 (spec.mixture).
    rng = random.Random(37)
    code = [[[rng.randrange(65000) for _ in range(rng.choice([2, 5, 40, 200]))]
             for _ in range(rng.randrange(1, 3))] for _ in range(45)]
    write(out, "code_uint16", numpy.uint16, code)
    # A corpus a tiny language model can learn (tests/client/lm_test.py):
    # each document counts up from a random start, modulo 63, in tokens 1
    # to 63 (0 is the end-of-document and padding token).
    rng = random.Random(38)
    lm = []
    for _ in range(400):
        start, length = rng.randrange(63), rng.randrange(3, 121)
        lm.append([[1 + (start + i) % 63 for i in range(length)]])
    write(out, "lm_uint16", numpy.uint16, lm)


if __name__ == "__main__":
    main()
