"""meshload against MosaicML Streaming on object storage, in one run.

    scripts/bench-s3 [--quick] [--rounds N] [--only SCENARIO] [--dir DIR] [--json FILE] [--block-bytes 2,4,...]
                     [--loaders meshload,...] [--keep]

The same MDS shards (written by Streaming's MDSWriter, no compression)
served by the same S3 server (versitygw with its POSIX backend, on
loopback), read for two epochs with a global shuffle by one trainer through:

  streaming  StreamingDataset(remote=s3://..., local=its cache), in a PyTorch
             DataLoader (the issue's worker counts: 2 for small samples, 0 for
             large ones), its default shuffle (py1e over shard blocks)
  meshload   a sidecar reading s3:// through its block cache (--cache-dir),
             the Python client; spec.shuffle Global, or Window (one cache
             block's samples a block, 4 blocks a window) with a cache of
             three windows (meshload-window) or of one (meshload-window1)
  meshload-file  the same sidecar on the local copy of the shards (the
             second epoch's ceiling: a cached dataset should read like local
             files)

Both caches get the same capacity (the dataset and a quarter, at least the
four largest shards Streaming asks for). Each trainer reads every byte of
every batch (a sum over uint64 words; the same consumer for all) and
reports, per epoch: samples/s (the first epoch from the loader's start: a
cold start), its wait for each batch (p99), and the time to its first batch
from the loader's start; the loader's fetched bytes per byte delivered
(meshload: its counters, each block counted to the epoch whose step it was
fetched for; Streaming: the bytes its cache directory received), per epoch
and over both, meshload's fill rate over its fills' span, and the
peak disk its cache took. --block-bytes adds meshload runs with other block
sizes.

The ceiling is the server's own throughput for a plain parallel download of
the same objects (boto3, 16 threads, 8 MiB ranges): into files, one per
object, as the AWS CLI's `s3 cp --recursive` does (a loader that caches on
the node's disk stores every byte it fetches, as this does), and into
memory (bytes nobody keeps: Python's allocator hands the same pages back
for each range, where a cache's or a download's bytes need pages the
machine has not touched yet). Both are measured right before and right
after each meshload run (the machine's speed drifts between minutes; the
printed ceilings are the medians of all). Rounds alternate the loaders; the
median round is reported, with the ratios meshload / Streaming (targets: >=
2 in both epochs), first-epoch bytes/s over the mean of its own round's two
ceilings (target >= 0.8 of the download into files; the median of the
rounds' ratios), and second-epoch samples/s over meshload-file's in the
same round (target >= 0.8; the median of the rounds' ratios). A loader that
fails stops the program (exit 1), except Streaming's known IndexError on a
shard it is still downloading, which is said and run once more.
"""

import argparse
import glob
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

MiB = 1 << 20
ACCESS, SECRET = "BENCHKEY", "bench-secret-key-0123456789"


class Scenario:
    def __init__(self, name, samples, sample_bytes, batch, streaming_workers):
        self.name, self.samples, self.sample_bytes = name, samples, sample_bytes
        self.batch, self.streaming_workers = batch, streaming_workers

    @property
    def steps_per_epoch(self):
        return self.samples // self.batch


SCENARIOS = {
    "mds-4KiB": Scenario("mds-4KiB", 40960, 4096, 256, 2),
    "mds-256KiB": Scenario("mds-256KiB", 2048, 256 << 10, 32, 0),
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def write_mds(out, sc):
    """The scenario's samples (random bytes) as MDS shards by MDSWriter."""
    from streaming import MDSWriter

    if os.path.exists(os.path.join(out, "index.json")):
        return
    rng = np.random.default_rng(2026)
    with MDSWriter(out=out, columns={"x": "bytes"}, compression=None) as w:
        for _ in range(sc.samples):
            w.write({"x": rng.integers(0, 256, size=sc.sample_bytes, dtype=np.uint8).tobytes()})


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                        region_name="us-east-1", config=Config(max_pool_connections=32))


def ceiling(endpoint, bucket, prefix, into=None):
    """bytes/s of a 16-thread download of every object under prefix: into
    memory, or, with `into` (a directory), into one file per object there,
    as the AWS CLI's `s3 cp --recursive` does (the files are removed
    afterwards, outside the timing)."""
    c = s3_client(endpoint)
    keys = [(o["Key"], o["Size"]) for o in c.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    # Objects over 8 MiB in 8 MiB ranges, so 16 threads share them.
    parts = []
    for k, n in keys:
        for off in range(0, n, 8 * MiB):
            parts.append((k, off, min(n, off + 8 * MiB) - 1))
    lock = threading.Lock()
    total = [0]
    fds = {}
    if into:
        os.makedirs(into, exist_ok=True)

    def work():
        while True:
            with lock:
                if not parts:
                    return
                k, a, b = parts.pop()
                if into and k not in fds:
                    fds[k] = os.open(os.path.join(into, k.replace("/", "_")), os.O_WRONLY | os.O_CREAT, 0o644)
            body = c.get_object(Bucket=bucket, Key=k, Range="bytes=%d-%d" % (a, b))["Body"].read()
            if into:
                os.pwrite(fds[k], body, a)
            with lock:
                total[0] += len(body)

    t0 = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = total[0] / (time.monotonic() - t0)
    for fd in fds.values():
        os.close(fd)
    if into:
        shutil.rmtree(into)
    return rate


WORKER = r'''
import json, os, sys, time, urllib.request
import numpy as np
cfg = json.loads(sys.argv[1])
K, B = cfg["steps"], cfg["batch"]
t0 = cfg.get("launched") or time.monotonic()  # the loader's start (CLOCK_MONOTONIC, shared by processes)


def consume(a):
    a = np.asarray(a)
    n = a.nbytes // 8 * 8
    return int(a.reshape(-1)[:n].view(np.uint64).sum()) if n else 0


def progress():
    if not cfg.get("port"):
        return {}
    with urllib.request.urlopen("http://127.0.0.1:%d/progress" % cfg["port"], timeout=10) as r:
        return json.loads(r.read())["cache"]


if cfg["loader"] == "streaming":
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["mport"]))
    ds = StreamingDataset(remote=cfg["remote"], local=cfg["local"], batch_size=B, shuffle=True, shuffle_seed=1,
                          cache_limit=cfg["cache_limit"], num_canonical_nodes=1)
    sb = cfg["sample_bytes"]

    def collate(samples):
        out = np.empty((len(samples), sb), dtype=np.uint8)
        for i, s in enumerate(samples):
            out[i] = np.frombuffer(s["x"], dtype=np.uint8)
        return out

    w = cfg["workers"]
    dl = DataLoader(ds, batch_size=B, collate_fn=collate, num_workers=w, persistent_workers=w > 0, drop_last=True)

    def batches():
        while True:
            for b in dl:
                yield b
    it = batches()
    fetched = lambda: 0
else:
    import meshload
    client = meshload.Client(cfg["socket"])

    def batches():
        while True:
            b = client.next()
            yield np.from_dlpack(b.tensors[0]["x"].values)
            del b
    it = batches()

epochs = []
first = None
waits = []
before = {}  # the loader's counters start at 0 when it starts
start = t0  # the first epoch counts from the loader's start (a cold start: its start-up and first fetches in it)
for e in range(2):
    n = 0
    for s in range(K):
        a = time.monotonic()
        b = next(it)
        now = time.monotonic()
        if first is None:
            first = now - t0
        else:
            waits.append(now - a)
        consume(b)
        n += B
        del b
    el = time.monotonic() - start
    start = time.monotonic()
    after = progress()
    epochs.append({"samples": n, "seconds": el, "fetch_span": after.get("fetchSpanSeconds", 0),
                   "fetched": after.get("fetchedBytes", 0) - before.get("fetchedBytes", 0),
                   "delivered": after.get("deliveredBytes", 0) - before.get("deliveredBytes", 0),
                   "resident": after.get("residentBytes", 0), "p99": float(np.quantile(waits, 0.99)) if waits else 0})
    before = after
    waits = []
# meshload counts each fetched block to the epoch of the step it was fetched
# for (the fetch-ahead takes the second epoch's first blocks while the first
# runs): per-epoch amplification is what each epoch's steps cost.
by_epoch = {x["epoch"]: x["bytes"] for x in progress().get("fetchedBytesByEpoch", [])}
if by_epoch:
    for e, rec in enumerate(epochs):
        rec["fetched_window"] = rec["fetched"]  # fetched while the epoch ran
        rec["fetched"] = by_epoch.get(e, 0)
print(json.dumps({"first": first, "epochs": epochs}), flush=True)
os._exit(0)
'''


class Bench:
    def __init__(self, args):
        self.args = args
        self.root = args.dir or tempfile.mkdtemp(prefix="meshload-bench-s3-")
        self.gw_dir = os.path.join(self.root, "gw")
        os.makedirs(os.path.join(self.gw_dir, "bench"), exist_ok=True)
        self.port = free_port()
        self.endpoint = "http://127.0.0.1:%d" % self.port
        self.gw = subprocess.Popen([args.versitygw, "--access", ACCESS, "--secret", SECRET, "--port",
                                    "127.0.0.1:%d" % self.port, "--keep-alive", "--quiet", "posix", self.gw_dir],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.05)
        self.env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET,
                        AWS_ENDPOINT_URL_S3=self.endpoint, AWS_REGION="us-east-1", S3_ENDPOINT_URL=self.endpoint)

    def close(self):
        self.gw.terminate()
        self.gw.wait()
        if not self.args.dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def worker(self, cfg):
        p = subprocess.run([sys.executable, "-c", WORKER, json.dumps(cfg)], env=self.env, capture_output=True,
                           text=True, timeout=900)
        if cfg["loader"] == "streaming" and p.returncode != 0 and "is not present in the shard" in p.stderr:
            # Streaming 0.13.0 now and then fails with "IndexError: Relative
            # sample index N is not present in the shard.NNNNN.mds file" (a
            # worker reads a shard it is still downloading): said, then run
            # again in a new cache directory.
            print("  (streaming failed with its IndexError on a shard being downloaded; run again)", flush=True)
            shutil.rmtree(cfg["local"], ignore_errors=True)
            cfg = dict(cfg, launched=time.monotonic(), mport=free_port())
            p = subprocess.run([sys.executable, "-c", WORKER, json.dumps(cfg)], env=self.env, capture_output=True,
                               text=True, timeout=900)
        if p.returncode != 0 or not p.stdout.strip():
            log = open(cfg["log"]).read()[-3000:] if "log" in cfg else ""
            sys.exit("bench-s3: the %s trainer failed:\n%s\n%s\n%s" % (cfg["loader"], p.stdout[-2000:],
                                                                      p.stderr[-4000:], log))
        return json.loads(p.stdout.strip().splitlines()[-1])

    def job(self, sc, uri, shuffle, cache):
        path = os.path.join(self.root, "%s-%d.yaml" % (sc.name, abs(hash((uri, shuffle, cache)))))
        with open(path, "w") as f:
            f.write("""apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: bench-s3}
spec:
  mesh: {processes: 1, devicesPerProcess: 1, axes: [{name: data, size: 1}]}
  strategy: PerProcess
  dataset: {uri: %s, format: MDS, fields: [{name: x}], cache: {%s}}
  batch: {globalBatchSize: %d, prefetch: 4}
  shuffle: {%s}
""" % (uri, cache, sc.batch, shuffle))
        return path

    def meshload(self, sc, uri, shuffle, cache):
        run = tempfile.mkdtemp(dir=self.root, prefix="run-")
        sock, log = os.path.join(run, "s.sock"), os.path.join(run, "sidecar.log")
        port = free_port()
        args = [self.args.sidecar, "--job", self.job(sc, uri, shuffle, cache), "--process", "0", "--socket", sock,
                "--staging", "host", "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--cache-dir",
                os.path.join(run, "cache"), "--log-level", "info"]
        # The sidecar and the trainer start together, as the containers of
        # one pod do (the client connects once the socket is there).
        t0 = time.monotonic()
        sc_proc = subprocess.Popen(args, env=self.env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        cfg = {"loader": "meshload", "socket": sock, "port": port, "steps": sc.steps_per_epoch, "batch": sc.batch,
               "log": log, "launched": t0}
        try:
            r = self.worker(cfg)
            r["peak_disk"] = dir_bytes(os.path.join(run, "cache"))
        finally:
            sc_proc.terminate()
            sc_proc.wait()
        if self.args.keep:
            shutil.rmtree(os.path.join(run, "cache"), ignore_errors=True)
            print("  (kept %s)" % run)
        else:
            shutil.rmtree(run, ignore_errors=True)
        return r

    def streaming(self, sc, capacity):
        local = tempfile.mkdtemp(dir=self.root, prefix="streaming-")
        shutil.rmtree(local)
        cfg = {"loader": "streaming", "remote": "s3://bench/" + sc.name, "local": local, "batch": sc.batch,
               "steps": sc.steps_per_epoch, "workers": sc.streaming_workers, "cache_limit": capacity,
               "sample_bytes": sc.sample_bytes, "mport": free_port(), "launched": time.monotonic()}
        r = self.worker(cfg)
        downloaded = dir_bytes(local)
        r["peak_disk"] = downloaded
        # Streaming downloads whole shards into its cache (its epochs then
        # read them there): what the cache received is what it fetched.
        r["epochs"][0]["fetched"] = downloaded
        for e in r["epochs"]:
            e["delivered"] = sc.steps_per_epoch * sc.batch * sc.sample_bytes
        shutil.rmtree(local, ignore_errors=True)
        return r

    def scenario(self, sc):
        src = os.path.join(self.root, "mds", sc.name)
        write_mds(src, sc)
        dst = os.path.join(self.gw_dir, "bench", sc.name)
        if not os.path.exists(dst):
            shutil.copytree(src, dst)
        data = sum(os.path.getsize(f) for f in glob.glob(os.path.join(src, "*")))
        # The same cache for both: the dataset and a quarter, at least the
        # four largest shards Streaming asks for.
        largest = max(os.path.getsize(f) for f in glob.glob(os.path.join(src, "*.mds")))
        capacity = max(int(data * 1.25) + 16 * MiB, 4 * largest + 16 * MiB)
        # Window: blocks of one cache block's samples, 4 a window; a cache
        # of three windows (below the dataset) and two blocks of lookahead,
        # and a cache of one window (what fetching each byte once needs).
        block_samples = max(1, (8 * MiB) // sc.sample_bytes)
        window = "mode: Window, seed: 1, blockSize: %d, windowBlocks: 4" % block_samples
        window_cache = "capacityBytes: %d, lookaheadBytes: %d" % (3 * 4 * 8 * MiB + MiB, 16 * MiB)
        window1_cache = "capacityBytes: %d, lookaheadBytes: %d" % (4 * 8 * MiB + MiB, 16 * MiB)
        same = "capacityBytes: %d" % capacity
        loaders = {
            "streaming": lambda: self.streaming(sc, capacity),
            "meshload": lambda: self.meshload(sc, "s3://bench/%s/" % sc.name, "mode: Global, seed: 1", same),
            "meshload-window": lambda: self.meshload(sc, "s3://bench/%s/" % sc.name, window, window_cache),
            "meshload-window1": lambda: self.meshload(sc, "s3://bench/%s/" % sc.name, window, window1_cache),
            "meshload-file": lambda: self.meshload(sc, src, "mode: Global, seed: 1", same),
        }
        for bb in self.args.block_bytes or []:
            loaders["meshload-%dMiB" % (bb // MiB)] = lambda bb=bb: self.meshload(
                sc, "s3://bench/%s/" % sc.name, "mode: Global, seed: 1",
                "%s, blockBytes: %d, wholeObjectBytes: %d" % (same, bb, bb))
        if self.args.loaders:
            loaders = {k: v for k, v in loaders.items() if k in self.args.loaders}
        results = {k: [] for k in loaders}
        ceilings, file_ceilings = [], []
        for r in range(self.args.rounds):
            order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
            for name in order:
                if name != "meshload":
                    results[name].append(loaders[name]())
                    continue
                # The ceiling right before and right after meshload's run:
                # the machine's speed drifts between minutes, so the
                # first epoch is compared with the ceiling of its own time.
                files = os.path.join(self.root, "ceiling-files")
                before = ceiling(self.endpoint, "bench", sc.name + "/")
                before_files = ceiling(self.endpoint, "bench", sc.name + "/", into=files)
                x = loaders[name]()
                after_files = ceiling(self.endpoint, "bench", sc.name + "/", into=files)
                after = ceiling(self.endpoint, "bench", sc.name + "/")
                x["ceiling"] = (before + after) / 2
                x["ceiling_files"] = (before_files + after_files) / 2
                ceilings += [before, after]
                file_ceilings += [before_files, after_files]
                results[name].append(x)
        return data, (ceilings, file_ceilings), results

    def report(self, sc, data, ceilings, results):
        ceilings, file_ceilings = ceilings
        ceil = statistics.median(ceilings) if ceilings else float("nan")
        ceil_files = statistics.median(file_ceilings) if file_ceilings else float("nan")
        def med(name, f):
            return statistics.median(f(x) for x in results[name])

        def rate(name, e):
            return med(name, lambda x: x["epochs"][e]["samples"] / x["epochs"][e]["seconds"])

        def amp(name, e):
            return med(name, lambda x: x["epochs"][e]["fetched"] / max(1, x["epochs"][e]["delivered"]))

        def amp_both(name):
            return med(name, lambda x: sum(e["fetched"] for e in x["epochs"]) /
                       max(1, sum(e["delivered"] for e in x["epochs"])))

        out = {"scenario": sc.name, "samples": sc.samples, "sampleBytes": sc.sample_bytes, "batch": sc.batch,
               "datasetBytes": data, "ceilingBytesPerSecond": ceil,
               "ceilingIntoFilesBytesPerSecond": ceil_files, "loaders": {}}
        print("\n%s: %d samples x %d B (%.1f MiB of MDS shards), batch %d, S3 ceiling (16-thread download) %.0f MB/s"
              " into memory, %.0f into files (medians; %.0f to %.0f and %.0f to %.0f in this run)" % (
                  sc.name, sc.samples, sc.sample_bytes, data / MiB, sc.batch, ceil / 1e6, ceil_files / 1e6,
                  min(ceilings or [ceil]) / 1e6, max(ceilings or [ceil]) / 1e6,
                  min(file_ceilings or [ceil_files]) / 1e6, max(file_ceilings or [ceil_files]) / 1e6))
        print("  %-16s %14s %14s %10s %10s %10s %12s %12s %12s" % (
            "loader", "epoch 1 /s", "epoch 2 /s", "amplif. 1", "amplif. 2", "both", "first batch", "wait p99",
            "peak disk"))
        for name in results:
            row = {"epoch1": rate(name, 0), "epoch2": rate(name, 1), "amp1": amp(name, 0),
                   "amp2": amp(name, 1),
                   "amp_both": amp_both(name),
                   "fetch_rate": med(name, lambda x: x["epochs"][0].get("fetched_window", x["epochs"][0]["fetched"]) /
                                     x["epochs"][0]["fetch_span"]
                                     if x["epochs"][0].get("fetch_span") else 0.0),
                   "first": med(name, lambda x: x["first"]),
                   "p99": med(name, lambda x: max(e["p99"] for e in x["epochs"])),
                   "disk": med(name, lambda x: x["peak_disk"])}
            out["loaders"][name] = row
            print("  %-16s %14s %14s %10.2f %10.2f %10.2f %10.0f ms %9.2f ms %9.1f MiB" % (
                name, "{:,.0f}".format(row["epoch1"]), "{:,.0f}".format(row["epoch2"]), row["amp1"], row["amp2"],
                row["amp_both"], row["first"] * 1e3, row["p99"] * 1e3, row["disk"] / MiB))
        if set(out["loaders"]) < {"meshload", "streaming", "meshload-file", "meshload-window", "meshload-window1"}:
            return out  # --loaders: no ratios
        def epoch1_bytes_per_s(x):
            return x["epochs"][0]["samples"] * sc.sample_bytes / x["epochs"][0]["seconds"]

        def fill_rate(x):
            e = x["epochs"][0]
            return e.get("fetched_window", e["fetched"]) / e["fetch_span"] if e.get("fetch_span") else 0.0

        m, s, f = out["loaders"]["meshload"], out["loaders"]["streaming"], out["loaders"]["meshload-file"]
        w, w1 = out["loaders"]["meshload-window"], out["loaders"]["meshload-window1"]
        ratios = {
            "epoch1 meshload/streaming": m["epoch1"] / s["epoch1"],
            "epoch2 meshload/streaming": m["epoch2"] / s["epoch2"],
            "epoch1 bytes/s over the S3 ceiling into files (from the loader's start)": med("meshload", lambda x: (
                epoch1_bytes_per_s(x) / x["ceiling_files"])),
            "epoch1 bytes/s over the S3 ceiling into memory (from the loader's start)": med("meshload", lambda x: (
                epoch1_bytes_per_s(x) / x["ceiling"])),
            "epoch1 fetch rate over the S3 ceiling into files (its fills' span)": med("meshload", lambda x: (
                fill_rate(x) / x["ceiling_files"])),
            "epoch1 fetch rate over the S3 ceiling into memory (its fills' span)": med("meshload", lambda x: (
                fill_rate(x) / x["ceiling"])),
            # Paired by round (the two ran a few seconds apart; an epoch of a
            # cached dataset lasts a tenth of a second, so minutes apart the
            # machine's drift would decide it).
            "epoch2 over meshload-file": statistics.median(
                (a["epochs"][1]["samples"] / a["epochs"][1]["seconds"]) /
                (b["epochs"][1]["samples"] / b["epochs"][1]["seconds"])
                for a, b in zip(results["meshload"], results["meshload-file"])),
            "window amplification (epoch 1, 2; both)": "%.2f, %.2f; %.2f" % (w["amp1"], w["amp2"], w["amp_both"]),
            "window amplification, a cache of one window (epoch 1, 2; both)": "%.2f, %.2f; %.2f" % (
                w1["amp1"], w1["amp2"], w1["amp_both"]),
        }
        out["ratios"] = ratios
        for k, v in ratios.items():
            print("  %-72s %s" % (k, v if isinstance(v, str) else "%.2f" % v))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--versitygw", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round")
    ap.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    ap.add_argument("--dir", help="keep the datasets here (default: a temporary directory)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep meshload's run directories (the sidecar's log)")
    ap.add_argument("--loaders", type=lambda v: v.split(","),
                    help="only these loaders (comma-separated; for profiling: the ratios need all five)")
    ap.add_argument("--block-bytes", type=lambda v: [int(x) * MiB for x in v.split(",")],
                    help="also meshload with these blockBytes (MiB, comma-separated; objects cut likewise)")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
    import streaming

    print("bench-s3: %d cores, %s, Python %s, mosaicml-streaming %s, versitygw on loopback, %d rounds (median)" % (
        os.cpu_count(), platform.machine(), platform.python_version(), streaming.__version__, args.rounds))
    b = Bench(args)
    out = []
    try:
        for name in args.only or list(SCENARIOS):
            sc = SCENARIOS[name]
            data, ceilings, results = b.scenario(sc)
            out.append(b.report(sc, data, ceilings, results))
    finally:
        b.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
