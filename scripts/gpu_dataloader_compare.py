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
equal cores). The trainer's wait is the time in next() for meshload, and
next() plus the .cuda(non_blocking=True) launch for the DataLoader (its
batch is not on the GPU before); torch.from_dlpack's own cost (PyTorch's
stream lookup and tensor wrapping, the same for any DLPack producer) is
printed beside it.

The unpaced runs consume as fast as the GPU reduces, so the loader is the
bottleneck and the trainer waits by construction. The trainer's wait is
then measured again as a trainer sees it when the loader keeps up: each
step the trainer keeps the GPU busy (torch.cuda._sleep, calibrated) for
twice the best DataLoader's time per batch and synchronizes, the same pace
for both loaders (target: meshload's wait p99 < 100 us).
"""

import argparse
import gc
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


class GpuStep:
    """A trainer step that keeps the GPU busy for `seconds`, then synchronizes
    (what a training step ending in loss.item() does to the host thread)."""

    def __init__(self, seconds):
        import torch

        self.torch, self.cycles = torch, 0
        if seconds > 0:
            torch.cuda._sleep(1000)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.cuda._sleep(20_000_000)
            torch.cuda.synchronize()
            self.cycles = int(20_000_000 / (time.perf_counter() - t0) * seconds)

    def __call__(self, x):
        x.sum()
        if self.cycles:
            self.torch.cuda._sleep(self.cycles)
            self.torch.cuda.synchronize()


def run_dataloader(path, n, steps, workers, step=None):
    import torch
    from torch.utils.data import DataLoader

    step = step or GpuStep(0)
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
        step(x)
        done += 1
    torch.cuda.synchronize()
    rate = steps * B / (time.perf_counter() - t0)
    # The workers and the pin-memory thread go now, not whenever the garbage
    # collector finds the loader: they would share the cores of what runs next.
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown:
        shutdown()
    del it, loader
    gc.collect()
    return rate, waits, None


def run_meshload(args, job, tmp, steps, step=None):
    import torch

    import meshload

    step = step or GpuStep(0)
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
            waits, convs, t0 = [], [], time.perf_counter()
            for _ in range(steps):
                w0 = time.perf_counter()
                b = c.next(timeout=60)
                w1 = time.perf_counter()
                x = torch.from_dlpack(b.tensors[0])
                waits.append(w1 - w0)
                convs.append(time.perf_counter() - w1)
                step(x)
                del b, x
            torch.cuda.synchronize()
            return steps * B / (time.perf_counter() - t0), waits, convs
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
        rate, waits, _ = run_dataloader(path, args.samples, args.steps, workers)
        p50, p99 = quantiles(waits)
        print("DataLoader(num_workers=%d, pin_memory=True): %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
              % (workers, rate, p50 * 1e6, p99 * 1e6))
        if rate > best[0]:
            best = (rate, workers, p99)
    rate, waits, convs = run_meshload(args, job, tmp, args.steps)
    p50, p99 = quantiles(waits)
    c50, c99 = quantiles(convs)
    print("meshload (--staging cuda):                 %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
          "  (+ torch.from_dlpack p50 %.1f us p99 %.1f us)" % (rate, p50 * 1e6, p99 * 1e6, c50 * 1e6, c99 * 1e6))
    ratio = rate / best[0]
    print("ratio meshload / best DataLoader (num_workers=%d): %.2fx (target >= 2x)" % (best[1], ratio))
    pace = 2 * B / best[0]
    step = GpuStep(pace)
    paced = max(200, args.steps // 4)
    print("paced trainer: %.0f us of GPU work per step (2x the best DataLoader's time per batch), %d steps"
          % (pace * 1e6, paced))
    d_rate, d_waits, _ = run_dataloader(path, args.samples, paced, best[1], step)
    d50, d99 = quantiles(d_waits)
    print("  DataLoader(num_workers=%d):  %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
          % (best[1], d_rate, d50 * 1e6, d99 * 1e6))
    m_rate, m_waits, m_convs = run_meshload(args, job, tmp, paced, step)
    m50, m99 = quantiles(m_waits)
    c50, c99 = quantiles(m_convs)
    print("  meshload:                   %10.0f samples/s  wait p50 %7.1f us  p99 %7.1f us"
          "  (+ torch.from_dlpack p50 %.1f us p99 %.1f us)" % (m_rate, m50 * 1e6, m99 * 1e6, c50 * 1e6, c99 * 1e6))
    print("trainer wait while the loader keeps up: meshload p99 %.1f us (target < 100 us: %s), DataLoader p99 %.1f us"
          % (m99 * 1e6, "met" if m99 < 100e-6 else "NOT met", d99 * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
