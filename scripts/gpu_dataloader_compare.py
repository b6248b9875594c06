#!/usr/bin/env python3
"""meshload against torch.utils.data.DataLoader, batches landing on a GPU.

    PYTHONPATH=<dir holding the meshload package> python3 scripts/gpu_dataloader_compare.py \
        --meshload BIN/meshload --sidecar BIN/meshload-sidecar [--cores 4] [--steps 2000]

The same TokenStream dataset (uint16 tokens, sequence length 2048, a sample
is T + 1 tokens) and batches of 32 samples, shuffled, each batch ending up
as a CUDA tensor the "trainer" (this process) reduces on the GPU:

  - DataLoader: a map-style Dataset over a numpy memmap, batch_size=32,
    pin_memory=True, the best of num_workers in {2, 4, 8}, and
    .cuda(non_blocking=True) per batch;
  - meshload: a sidecar with --staging cuda; the trainer takes each batch
    with torch.from_dlpack (zero-copy, already on the GPU).

Both get the same CPU cores (--cores, set with sched_setaffinity before
anything starts; workers and the sidecar inherit it). It prints samples/s,
the trainer's wait per batch (p50/p99) and the ratio (target: >= 2x at
equal cores, trainer wait p99 < 100 us while the loader keeps up).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

T = 2048
B = 32


class TokenSamples:
    """Sample i = tokens[i*T : i*T + T + 1] (the product's TokenStream)."""

    def __init__(self, path, n):
        self.path, self.n, self.tokens = path, n, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self.tokens is None:  # opened in the worker
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        return torch.from_numpy(np.array(self.tokens[i * T: i * T + T + 1]))


def quantiles(waits):
    w = np.sort(np.array(waits))
    return w[len(w) // 2], w[min(len(w) - 1, int(len(w) * 0.99))]


def run_dataloader(path, n, steps, workers):
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(TokenSamples(path, n), batch_size=B, shuffle=True, num_workers=workers, pin_memory=True,
                        drop_last=True, persistent_workers=True, prefetch_factor=4)
    it = iter(loader)
    for _ in range(20):  # warm-up: workers started, pipeline full
        next(it).cuda(non_blocking=True).sum()
    torch.cuda.synchronize()
    waits, t0 = [], time.perf_counter()
    done = 0
    while done < steps:
        w0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        x = batch.cuda(non_blocking=True)
        waits.append(time.perf_counter() - w0)
        x.sum()
        done += 1
    torch.cuda.synchronize()
    return steps * B / (time.perf_counter() - t0), waits


def run_meshload(args, job, tmp, steps):
    import torch

    import meshload

    sock = os.path.join(tmp, "s.sock")
    log = open(os.path.join(tmp, "sidecar.log"), "wb")
    proc = subprocess.Popen([args.sidecar, "--job", job, "--process", "0", "--socket", sock, "--staging", "cuda",
                             "--staging-threads", "2"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=log)
    try:
        with meshload.Client(sock) as c:
            for _ in range(20):
                b = c.next(timeout=60)
                torch.from_dlpack(b.tensors[0]).sum()
                del b
            torch.cuda.synchronize()
            waits, t0 = [], time.perf_counter()
            for _ in range(steps):
                w0 = time.perf_counter()
                b = c.next(timeout=60)
                x = torch.from_dlpack(b.tensors[0])
                waits.append(time.perf_counter() - w0)
                x.sum()
                del b, x
            torch.cuda.synchronize()
            return steps * B / (time.perf_counter() - t0), waits
    finally:
        proc.terminate()
        proc.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meshload", required=True)
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--cores", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=200000)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_dataloader_compare: PyTorch is not installed: nothing measured")
        return 1
    if not torch.cuda.is_available():
        print("gpu_dataloader_compare: no GPU for PyTorch: nothing measured")
        return 1
    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    os.sched_setaffinity(0, cores)
    tmp = tempfile.mkdtemp(prefix="mlcmp-")
    path = os.path.join(tmp, "tokens.bin")
    np.random.default_rng(1).integers(0, 50000, size=args.samples * T + 1, dtype=np.uint16).tofile(path)
    for_page_cache = open(path, "rb").read()  # both read from the page cache
    del for_page_cache
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(f"""apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {{name: compare}}
spec:
  mesh: {{processes: 1, devicesPerProcess: 1, axes: [{{name: data, size: 1}}]}}
  strategy: PerProcess
  dataset: {{uri: {path}, format: TokenStream, dtype: uint16, sequenceLength: {T}}}
  batch: {{globalBatchSize: {B}, prefetch: 8}}
  shuffle: {{mode: Global, seed: 1}}
""")
    print("cores %s, %s, TokenStream uint16 T=%d, batch %d, %d steps"
          % (cores, torch.cuda.get_device_name(0), T, B, args.steps))
    best = (0.0, None, None)
    for workers in (2, 4, 8):
        rate, waits = run_dataloader(path, args.samples, args.steps, workers)
        p50, p99 = quantiles(waits)
        print("DataLoader(num_workers=%d, pin_memory=True): %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
              % (workers, rate, p50 * 1e6, p99 * 1e6))
        if rate > best[0]:
            best = (rate, workers, p99)
    rate, waits = run_meshload(args, job, tmp, args.steps)
    p50, p99 = quantiles(waits)
    print("meshload (--staging cuda):                 %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
          % (rate, p50 * 1e6, p99 * 1e6))
    ratio = rate / best[0]
    print("ratio meshload / best DataLoader (num_workers=%d): %.2fx (target >= 2x); meshload wait p99 %.1f us "
          "(target < 100 us)" % (best[1], ratio, p99 * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
