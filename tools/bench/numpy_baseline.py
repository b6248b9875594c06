#!/usr/bin/python3
"""The loader a user would otherwise write in Python: numpy memmap and a
fancy-index gather per batch, over exactly the batches meshload delivers.

usage: numpy_baseline.py fixed FILE RECORD_BYTES IDS.npy
       numpy_baseline.py tokens FILE DTYPE SEQ_LEN IDS.npy
IDS.npy holds one row of sample ids per step. Prints "samples_per_s=<x>".
Run with Debian's /usr/bin/python3 (python3-numpy).
"""
import sys
import time

import numpy as np


def main():
    kind = sys.argv[1]
    if kind == "fixed":
        path, rb, ids_path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        ids = np.load(ids_path)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        records = data[: (data.shape[0] // rb) * rb].reshape(-1, rb)
        gathers = [lambda row: records[row]]
    else:
        path, dtype, seq, ids_path = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        ids = np.load(ids_path).astype(np.int64)  # uint64 * int would promote to float
        tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        span = np.arange(seq + 1)
        # Two ways a user would write it; the faster one is reported.
        gathers = [
            lambda row: tokens[(row * seq)[:, None] + span],
            lambda row: np.stack([tokens[s * seq : s * seq + seq + 1] for s in row]),
        ]
    best = 0.0
    for gather in gathers:
        for row in ids[: min(len(ids), 64)]:  # warm-up, as meshload's first batches are
            gather(row)
        start = time.perf_counter()
        checksum = 0
        for row in ids:
            batch = gather(row)
            checksum ^= int(batch[0, 0])
        elapsed = time.perf_counter() - start
        best = max(best, ids.size / elapsed)
    print("samples_per_s=%.1f" % best)


if __name__ == "__main__":
    main()
