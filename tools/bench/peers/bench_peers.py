"""meshload against the loaders users would otherwise pick, in one run.

    scripts/bench-peers [--quick] [--only SCENARIO] [--procs 1,2] [--rounds N] [--dir DIR]

For each scenario (tokens-u16-2048, fixed-4KiB, fixed-1MiB, and
megatron-docs-100-8000: a Megatron indexed dataset of documents of 100 to
8,000 uint16 tokens written by megatron-core's IndexedDatasetBuilder) and process
count (one trainer; two trainers each with its own loader), the same dataset
files, the same global batch and sample size, with a global shuffle, are fed
into trainer processes (tools/bench/peers/worker.py) that read every byte of
every batch, through:

  meshload     a sidecar per trainer (host staging; its staging threads
               tried at 1 and 2 as the peers' workers are, the faster kept:
               on cores it shares with the trainer a second thread can cost
               the trainer more than it adds) and the Python client,
               consumed as NumPy (meshload) and as JAX arrays (meshload-jax)
  dataloader   PyTorch DataLoader over a memory-mapped map-style dataset
               (batched __getitems__, persistent workers), best num_workers
  grain        Grain's DataLoader over a random-access source on the mapped
               file, best worker_count
  streaming    MosaicML Streaming's StreamingDataset over MDS shards written
               from the same samples (local), in a DataLoader, best num_workers
  megatron     (the Megatron scenario) Megatron's own IndexedDataset in a PyTorch
               DataLoader, a batch being the list of its documents, best num_workers
  webdataset   (the image scenarios) webdataset's WebDataset pipeline over the
               tar shards (shard shuffle, a 1,000-sample shuffle buffer, the
               class decoded from text, batched), in a DataLoader, best num_workers
  numpy        the NumPy memmap + fancy-index loop (a baseline, not a loader)

The image scenarios (wds-images-20-500KiB, mds-images-20-500KiB,
mds-zstd-images-20-500KiB, tfrecord-images-20-500KiB) are the same samples,
an encoded image of 20 to 500 KiB (random bytes) and a class, written by
webdataset's TarWriter (with Energon's .tar.idx, which `meshload index`
writes), by Streaming's MDSWriter (raw shards, and shards compressed with
zstd) and by TensorFlow's TFRecordWriter (tf.train.Example records; the
tfrecord2idx index `meshload index` writes); meshload reads the WebDataset
shards, an MDS dataset or the TFRecord files (fields jpg, and cls as int64)
and the peers are webdataset on the shards, Streaming on the MDS dataset
and tf.data on the TFRecord files:

  tfdata       (the TFRecord scenarios) TensorFlow's tf.data: the files
               shuffled and interleaved, a 1,000-record shuffle buffer,
               batched and parsed with tf.io.parse_example, prefetched;
               best parallelism (its workers: interleave and map calls).
               It runs in TensorFlow's environment (--tf-python).

tfrecord-gzip-images-20-500KiB is the TFRecord files written with
compression_type GZIP: tf.data reads them with that compression_type
(decompressing as it reads), meshload with spec.dataset.compression: GZIP
through a fresh block cache of each run's sidecar (each file decompressed
whole once while the cache holds it).

Compressed MDS shards are Streaming's remote, decompressed into a fresh
local folder of each run, and go through a fresh block cache of each run's
sidecar for meshload (--cache-dir): both decompress as they read. The
images are random bytes, which zstd stores rather than compresses (as it
does with encoded images); the scenario measures reading through the codec.
Each loader's trainer reads every image byte and the classes.

The Megatron scenario's batches are ragged for meshload (meshload.Ragged:
the documents' tokens back to back), lists of documents for the others;
dataloader and grain, which read fixed-size samples, sit it out.

The columnar scenarios (parquet-tokens-100-2048, saved-tokens-100-2048)
are tokenized documents (input_ids of 100 to 2,048 int32 tokens, an int64
label) written by Hugging Face datasets itself: Parquet files by
Dataset.to_parquet, and the same rows by save_to_disk (Arrow streams).
meshload reads them as they are (format Parquet, or Arrow; the fields
input_ids and label; a global shuffle, decoded row groups kept within 2 GiB)
and the peers are datasets' own:

  hf-map       a map-style Dataset (load_from_disk; Dataset.from_parquet, which
               converts the Parquet files into its Arrow cache before the timed
               part) in Arrow format, a batch one take of a global shuffle's
               indices, in a PyTorch DataLoader, best num_workers
  hf-iterable  an IterableDataset (load_dataset("parquet", streaming=True);
               the saved Dataset's to_iterable_dataset), this rank's share, a
               1,000-row shuffle buffer, Arrow format, in a DataLoader, best
               num_workers
  grain-parquet (Parquet) Grain's ParquetIterDataset over this rank's files, a
               1,000-row window shuffle, batched, Grain's multiprocess
               prefetch, best worker count

Datasets are 512 MiB (--quick: 128 MiB), read once into the page cache
first. Each configuration of a peer is tried once (for half a run) and its
best kept; then every loader runs --rounds times (default 3; --quick 1), for
6 s each (--quick 2 s) after its first batch, in alternating order, and the
median round is the figure. Printed per loader: samples/s, trainer wait p50/p99, time to first
batch, loader CPU seconds per GB delivered, peak RSS of loader + trainer; and
the machine's single-thread memcpy and page-cache read ceilings, measured in
the same run. It ends with one line per scenario:

  SCENARIO: meshload N samples/s, best peer NAME M samples/s, ratio R

A loader that fails stops the program with its output (exit 1): no figure is
ever a made-up 0.
"""

import argparse
import faulthandler
import importlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scenarios import MiB, SCENARIOS, job_yaml, make_columnar, make_dataset, make_images, sample_view  # noqa: E402

WORKER = os.path.join(HERE, "worker.py")
TARGETS = {"tokens-u16-2048": 2.0, "fixed-4KiB": 2.0, "fixed-1MiB": 1.2, "megatron-docs-100-8000": 2.0,
           "wds-images-20-500KiB": 2.0, "mds-images-20-500KiB": 2.0, "mds-zstd-images-20-500KiB": 2.0,
           "tfrecord-images-20-500KiB": 2.0, "tfrecord-gzip-images-20-500KiB": 2.0, "parquet-tokens-100-2048": 2.0,
           "saved-tokens-100-2048": 2.0}
PEERS = ("dataloader", "grain", "streaming", "megatron", "webdataset", "tfdata", "hf-map", "hf-iterable",
         "grain-parquet")


def peers_of(scenario):
    """The peers that read the scenario's samples: the fixed-size readers, or
    (variable-size documents) Megatron's own reader."""
    if scenario.format == "TFRecord":
        return ("tfdata",)
    if scenario.columnar:
        return ("hf-map", "hf-iterable") + (("grain-parquet",) if scenario.format == "Parquet" else ())
    if scenario.compression:
        return ("streaming",)
    if scenario.records:
        return ("webdataset", "streaming")
    if scenario.variable:
        return ("streaming", "megatron")
    return ("dataloader", "grain", "streaming")


class Failed(Exception):
    pass


def ceilings(path, size):
    """Single-thread memcpy and page-cache read rates, GB/s."""
    n = min(size, 256 * MiB)
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dst = np.empty_like(src)
    best_copy = 0.0
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best_copy = max(best_copy, n / (time.perf_counter() - t) / 1e9)
    buf = bytearray(16 * MiB)
    best_read = 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(3):
            t = time.perf_counter()
            off = 0
            while off < size:
                got = os.preadv(fd, [buf], off)
                if got <= 0:
                    break
                off += got
            best_read = max(best_read, off / (time.perf_counter() - t) / 1e9)
    finally:
        os.close(fd)
    return best_copy, best_read


def write_mds(root, scenario, path):
    """MDS shards of the same samples, for MosaicML Streaming (cached)."""
    out = os.path.join(root, scenario.name, "mds")
    done = os.path.join(out, ".complete")
    if os.path.exists(done):
        return out
    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    view = sample_view(path, scenario)
    with MDSWriter(out=out, columns={"x": "bytes"}, size_limit=64 * MiB) as w:
        for i in range(len(view)):
            w.write({"x": view[i].tobytes()})
    open(done, "w").close()
    return out


class Runner:
    def __init__(self, args, root):
        self.args = args
        self.wds = None
        self.root = root
        self.python = sys.executable

    def run(self, loader, scenario, path, procs, seconds, workers=0, consumer="numpy", mds=None, samples=0):
        """One measurement: `procs` trainers at once; returns the merged figures."""
        sidecars = []
        if loader == "streaming":
            # Streaming coordinates a job's ranks through shared memory named
            # after the dataset: what a killed run left behind must go.
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        tmp = tempfile.mkdtemp(prefix="bp-", dir=self.root)
        try:
            t0 = time.monotonic()
            socks = []
            if loader == "meshload":
                job = os.path.join(tmp, "job.yaml")
                with open(job, "w") as f:
                    # Small batches want more slots (docs/crd-reference.md, spec.batch.prefetch).
                    prefetch = 16 if scenario.batch * scenario.sample_bytes < 4 * MiB else 4
                    f.write(job_yaml("bench-" + scenario.name, path, scenario, procs, prefetch=prefetch))
                for p in range(procs):
                    sock = os.path.join(tmp, "s%d.sock" % p)
                    log = open(os.path.join(tmp, "sidecar%d.log" % p), "wb")
                    # Compressed shards are decompressed into the block
                    # cache: a fresh one per run, as Streaming's local folder.
                    cache = ["--cache-dir", os.path.join(tmp, "cache%d" % p)] if scenario.compression else []
                    # Columnar rows: the stopping log's column-chunk bytes (info).
                    level = "info" if scenario.columnar else "warn"
                    # `workers`: the sidecar's staging threads (0: its default).
                    threads = ["--staging-threads", str(workers)] if workers else []
                    sidecars.append(subprocess.Popen(
                        [self.args.sidecar, "--job", job, "--process", str(p), "--socket", sock, "--staging", "host",
                         "--metrics-port", "0", "--log-level", level] + cache + threads, stdout=subprocess.DEVNULL,
                        stderr=log))
                    socks.append(sock)
            port = 29000 + (os.getpid() % 1000)
            procs_ = []
            for r in range(procs):
                cfg = {"loader": loader, "scenario": scenario.name, "path": path, "seconds": seconds,
                       "min_steps": 5,
                       "batch": scenario.batch, "procs": procs, "rank": r, "seed": 11 + r, "workers": workers,
                       "consumer": consumer, "t0": t0, "mds": mds, "port": port, "barrier": tmp,
                       "samples": samples,
                       "local": os.path.join(tmp, "streaming-local") if scenario.compression else None}
                if loader == "webdataset":
                    cfg["path"] = self.wds  # the shards, whichever format meshload reads
                if loader == "meshload":
                    cfg["socket"] = socks[r]
                    cfg["loader_pids"] = [sidecars[r].pid]
                python = self.args.tf_python if loader == "tfdata" else self.python
                procs_.append(subprocess.Popen([python, WORKER, json.dumps(cfg)], stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, cwd=tmp, start_new_session=True))
            outputs = []
            for p in procs_:
                try:
                    out, err = p.communicate(timeout=600)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    out, err = p.communicate()
                outputs.append((p.returncode, out, err))
            results = []
            for rank, (code, out, err) in enumerate(outputs):
                lines = [x for x in out.splitlines() if x.startswith("{")]
                if code != 0 or not lines:
                    report = ""
                    for r, (c, o, e) in enumerate(outputs):
                        report += "\n--- trainer %d: exit %s\n%s\n%s" % (r, c, o[-2000:], e[-4000:])
                    for name in sorted(os.listdir(tmp)):
                        if name.endswith(".log"):
                            report += "\n--- %s\n%s" % (name, open(os.path.join(tmp, name), errors="replace").read()[-3000:])
                    raise Failed("%s (workers=%d, consumer=%s) on %s: trainer %d failed%s"
                                 % (loader, workers, consumer, scenario.name, rank, report))
                results.append(json.loads(lines[-1]))
        finally:
            for p in procs_ if "procs_" in locals() else []:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # what a worker left behind
                except OSError:
                    pass
            for s in sidecars:
                s.send_signal(signal.SIGTERM)
            for s in sidecars:
                try:
                    s.wait(20)
                except subprocess.TimeoutExpired:
                    s.kill()
            fetched = 0  # columnar: the column-chunk (batch message) bytes the sidecars fetched to decode groups
            for p in range(len(sidecars)):
                with open(os.path.join(tmp, "sidecar%d.log" % p), errors="replace") as f:
                    for text in f:
                        if '"parquet_chunk_bytes"' in text:
                            fetched += json.loads(text).get("parquet_chunk_bytes", 0)
            shutil.rmtree(tmp, ignore_errors=True)
        total = sum(r["samples"] for r in results)
        elapsed = max(r["elapsed"] for r in results)
        gb = sum(r["bytes"] for r in results) / 1e9
        return {
            "rate": total / elapsed,
            "gbs": gb / elapsed,
            "wait_p50": max(r["wait_p50"] for r in results),
            "wait_p99": max(r["wait_p99"] for r in results),
            "ttfb": max(r["ttfb"] for r in results),
            "cpu_per_gb": sum(r["loader_cpu"] for r in results) / gb,
            "peak_rss": sum(r["peak_rss"] for r in results),
            # Bytes read from the files per byte delivered, over the whole run.
            "amplification": fetched / max(1, sum(r["all_bytes"] for r in results)) if loader == "meshload" else None,
        }


def fmt_s(x):
    return "%.0f us" % (x * 1e6) if x < 1e-3 else ("%.2f ms" % (x * 1e3) if x < 1 else "%.2f s" % x)


def scenario_run(runner, scenario, procs, args):
    size = (128 if args.quick else 512) * MiB
    if scenario.records:
        path, samples, images_mds = make_images(args.dir, scenario, size, args.meshload, args.tf_python)
        runner.wds = make_images(args.dir, SCENARIOS["wds-images-20-500KiB"], size, args.meshload)[0]
        data = os.path.join(os.path.dirname(runner.wds), "shard-000000.tar")
    elif scenario.columnar:
        path, samples = make_columnar(args.dir, scenario, size)
        data = os.path.join(path, sorted(n for n in os.listdir(path) if n.endswith((".parquet", ".arrow")))[0])
    else:
        path, samples = make_dataset(args.dir, scenario, size)
        data = path + ".bin" if scenario.variable else path  # the bytes (a Megatron path is the prefix)
    seconds = 2.0 if args.quick else 6.0
    tune_seconds = seconds / 2
    warm = [data]
    if scenario.records:  # every shard of the formats this scenario reads
        base = os.path.dirname(os.path.dirname(data))
        dirs = {"WebDataset": ["wds", "mds"], "TFRecord": ["tfrecord"]}.get(scenario.format, ["mds"])
        if scenario.compression:
            dirs = [("tfrecord-" if scenario.format == "TFRecord" else "mds-") + scenario.compression.lower()]
        warm = [os.path.join(base, d, n) for d in dirs for n in sorted(os.listdir(os.path.join(base, d)))]
    if scenario.columnar:
        warm = [os.path.join(path, n) for n in sorted(os.listdir(path))]
    for name in warm:
        with open(name, "rb") as f:  # into the page cache
            while f.read(64 * MiB):
                pass
    copy_gbs, read_gbs = ceilings(data, os.path.getsize(data))
    name = scenario.name + ("-%dproc" % procs if procs > 1 else "")
    print("\n== %s: %d samples x %s B, global batch %d, %.0f s per run, %d trainer(s)"
          % (name, samples, ("%d..%d" % (4 * scenario.min_tokens + 8, 4 * scenario.max_tokens + 8))
             if scenario.columnar
             else ("%d..%d" % (2 * scenario.min_tokens, 2 * scenario.max_tokens)) if scenario.variable
             else ("%d..%d" % (scenario.min_bytes, scenario.max_bytes)) if scenario.records
             else scenario.sample_bytes, scenario.batch, seconds, procs), flush=True)
    print("  ceilings (1 thread): memcpy %.2f GB/s, page-cache read %.2f GB/s" % (copy_gbs, read_gbs))
    if scenario.records:
        mds = images_mds
    elif scenario.columnar:
        mds = None
    else:
        mds = write_mds(args.dir, scenario, path) if "streaming" in args.loaders else None

    def tune(loader, choices, what):
        """The fastest of `choices` for `loader`'s workers (meshload: its
        staging threads), one short run each, printed."""
        best, best_rate = None, -1.0
        tried = []
        for w in choices:
            r = runner.run(loader, scenario, path, procs, tune_seconds, workers=w, mds=mds, samples=samples)
            tried.append("%d: %.0f/s" % (w, r["rate"]))
            if r["rate"] > best_rate:
                best, best_rate = w, r["rate"]
        print("  %s %s tried (samples/s): %s -> %d" % (loader, what, ", ".join(tried), best), flush=True)
        return best

    configs = []  # (label, loader, workers (meshload: staging threads), consumer)
    if "meshload" in args.loaders:
        best = tune("meshload", (1, 2), "staging threads")
        configs.append(("meshload", "meshload", best, "numpy"))
        if not args.no_jax and not scenario.variable and not scenario.records and not scenario.columnar:
            configs.append(("meshload-jax", "meshload", best, "jax"))
    worker_choices = (0, 2) if args.quick else (0, 1, 2, 4)
    for peer in peers_of(scenario):
        if peer not in args.loaders:
            continue
        best = tune(peer, worker_choices, "workers")
        configs.append(("%s (%d workers)" % (peer, best), peer, best, "numpy"))
    if "numpy" in args.loaders and not scenario.records and not scenario.columnar:
        configs.append(("numpy memmap loop", "numpy", 0, "numpy"))

    rounds = {label: [] for label, *_ in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for label, loader, workers, consumer in order:
            rounds[label].append(runner.run(loader, scenario, path, procs, seconds, workers, consumer, mds, samples))
    print("  %-26s %12s %8s %10s %10s %9s %10s %9s" % ("loader", "samples/s", "GB/s", "wait p50", "wait p99",
                                                      "1st batch", "CPU s/GB", "peak RSS"))
    figures = {}
    for label, *_ in configs:
        runs = sorted(rounds[label], key=lambda x: x["rate"])
        m = runs[len(runs) // 2]
        figures[label] = m
        print("  %-26s %12.0f %8.2f %10s %10s %9s %10.2f %6.0f MiB   (rounds: %s)"
              % (label, m["rate"], m["gbs"], fmt_s(m["wait_p50"]), fmt_s(m["wait_p99"]), fmt_s(m["ttfb"]),
                 m["cpu_per_gb"], m["peak_rss"] / MiB, ", ".join("%.0f" % x["rate"] for x in rounds[label])),
              flush=True)
    if scenario.columnar and figures.get("meshload", {}).get("amplification") is not None:
        print("  meshload read amplification: %.3f (column-chunk bytes fetched per byte delivered, over a run of "
              "several epochs: each row group decoded once and kept); hf-map reads each row's bytes in place, "
              "hf-iterable and grain-parquet every file once an epoch (about 1)" % figures["meshload"]["amplification"])
    peers = {k: v for k, v in figures.items() if k.split(" ")[0] in PEERS}
    line = None
    if "meshload" in figures and peers:
        best = max(peers, key=lambda k: peers[k]["rate"])
        ml = figures["meshload"]
        ratio = ml["rate"] / peers[best]["rate"]
        target = TARGETS[scenario.name]
        lower_wait = all(ml["wait_p99"] < v["wait_p99"] for v in peers.values())
        print("  meshload / best peer: %.2fx (target >= %.1fx: %s); trainer wait p99 %s than every peer's"
              % (ratio, target, "met" if ratio >= target else "NOT met", "lower" if lower_wait else "NOT lower"))
        line = "%s: meshload %.0f samples/s, best peer %s %.0f samples/s, ratio %.2f" % (
            name, ml["rate"], best.split(" ")[0], peers[best]["rate"], ratio)
    return line


def versions(tf_python=None):
    out = ["python %s" % platform.python_version()]
    for mod in ("numpy", "torch", "grain", "streaming", "megatron.core", "webdataset", "datasets", "pyarrow", "jax",
                "meshload"):
        try:
            m = importlib.import_module(mod)
            out.append("%s %s" % (mod, getattr(m, "__version__", "?")))
        except ImportError:
            out.append("%s missing" % mod)
    if tf_python:
        tf = subprocess.run([tf_python, "-c", "import tensorflow as tf; print(tf.__version__)"], capture_output=True,
                            text=True)
        out.append("tensorflow %s" % (tf.stdout.strip() or "missing"))
    return ", ".join(out)


def main():
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 prints every thread's stack
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--quick", action="store_true",
                    help="128 MiB datasets, 2 s runs, 1 round, workers 0 and 2: a few minutes")
    ap.add_argument("--only", help="one scenario: " + ", ".join(SCENARIOS))
    ap.add_argument("--procs", default="1,2", help="trainer process counts (default 1,2)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--loaders",
                    default="meshload,dataloader,grain,streaming,megatron,webdataset,tfdata,hf-map,hf-iterable,grain-parquet,numpy")
    ap.add_argument("--no-jax", action="store_true", help="leave out meshload's JAX consumer")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "meshload-bench-peers"))
    ap.add_argument("--meshload", help="the meshload CLI (default: beside the sidecar's build tree)")
    ap.add_argument("--tf-python", help="the Python of an environment with TensorFlow: the TFRecord scenario's "
                    "writer and its tf.data peer (scripts/bench-peers makes it)")
    args = ap.parse_args()
    if args.meshload is None:
        args.meshload = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.sidecar))), "tools",
                                     "meshload")
    args.loaders = args.loaders.split(",")
    if args.tf_python is None:  # no TensorFlow: no TFRecord scenario (it needs TensorFlow's writer and peer)
        skip = [n for n, s in SCENARIOS.items() if s.format == "TFRecord"]
        if args.only in skip:
            ap.error("%s needs --tf-python" % args.only)
        print("bench-peers: no --tf-python: leaving out %s" % ", ".join(skip))
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    os.makedirs(args.dir, exist_ok=True)
    print("bench-peers: %s; %d cores; %s" % (platform.node(), os.cpu_count(), versions(args.tf_python)))
    runner = Runner(args, args.dir)
    lines = []
    try:
        for name, scenario in SCENARIOS.items():
            if args.only and name != args.only or scenario.format == "TFRecord" and args.tf_python is None:
                continue
            for procs in [int(x) for x in args.procs.split(",")]:
                line = scenario_run(runner, scenario, procs, args)
                if line:
                    lines.append(line)
    except Failed as e:
        print("\nbench-peers: FAILED: %s" % e, flush=True)
        return 1
    print()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
