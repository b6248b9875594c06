"""One trainer process of scripts/bench-peers: one loader, one configuration.

    python worker.py '{"loader": "dataloader", "scenario": "fixed-4KiB", ...}'

Reads batches of the trainer's share of the global batch through the
loader, reads every byte of every batch (a checksum: the same consumer for
every loader) for `seconds` after the first batch, and prints one JSON line:
samples, elapsed seconds after the first batch, the trainer's wait for each batch (p50, p99), time
to first batch (from `t0`, when the loader was started, CLOCK_MONOTONIC),
the loader's CPU seconds (its processes' and threads', the consumer's own
time taken out), and the peak RSS of the trainer and the loader's processes.
"""

import faulthandler
import gc
import json
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scenarios import SCENARIOS, sample_view  # noqa: E402


def clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / clock_ticks()


def peak_rss(pid):
    """VmHWM of a process, in bytes (0 when it is gone)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child_pids(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid):
    out = []
    for c in child_pids(pid):
        out += [c] + descendants(c)
    return out


class Consumer:
    """Reads every byte of a batch; its own CPU time is kept apart."""

    def __init__(self, kind):
        self.kind = kind
        self.cpu = 0.0
        self.sink = 0
        self.bytes = 0  # every byte read
        if kind == "jax":
            import jax
            import jax.numpy as jnp

            def words_sum(x):
                # Every byte, read as 32-bit words (XLA vectorizes those;
                # a uint8 -> uint32 sum runs bytewise).
                per_word = 4 // x.dtype.itemsize
                w = jax.lax.bitcast_convert_type(x.reshape(-1, per_word), jnp.uint32) if per_word > 1 else x
                return jnp.sum(w.reshape(-1), dtype=jnp.uint32)

            self.jax_sum = jax.jit(words_sum)

    def __call__(self, batch):
        # JAX computes on its own threads: its CPU is the process's while it
        # runs (nothing else of the loader runs in this process then).
        clock = time.process_time if self.kind == "jax" else time.thread_time
        t = clock()
        if self.kind == "jax":
            self.sink ^= int(self.jax_sum(batch))
            self.bytes += batch.size * batch.dtype.itemsize
        elif isinstance(batch, list):  # variable-size samples, one array each
            for x in batch:
                self._read(x)
        else:
            self._read(batch)
        self.cpu += clock() - t

    def _read(self, x):
        a = np.asarray(x).reshape(-1).view(np.uint8)
        self.bytes += a.size
        if a.size % 8 == 0:
            a = a.view(np.uint64)
        self.sink ^= int(np.add.reduce(a, dtype=np.uint64))


# ---- loaders: each yields the trainer's batches as arrays ---------------------


def shard_indices(perm, batch, rank, procs):
    """This rank's part of each global batch of a permutation, as index arrays."""
    per = batch // procs
    for s in range(len(perm) // batch):
        g = perm[s * batch:(s + 1) * batch]
        yield g[rank * per:(rank + 1) * per]


def numpy_loader(cfg, view):
    """The NumPy memmap loop: a global shuffle, fancy-indexed gathers (for
    variable-size documents, a view of each)."""
    rng = np.random.default_rng(cfg["seed"])
    variable = SCENARIOS[cfg["scenario"]].variable
    while True:
        perm = rng.permutation(len(view))
        for idx in shard_indices(perm, cfg["batch"], cfg["rank"], cfg["procs"]):
            if variable:
                yield [view[int(i)] for i in idx]
            else:
                yield view[np.sort(idx)] if cfg.get("sorted") else view[idx]


def batched_dataloader(cfg, dataset, n):
    """A PyTorch DataLoader over `dataset` (n samples) whose batch sampler
    hands each worker this rank's share of a global batch of a seeded global
    shuffle (a new permutation per epoch), gathered by the dataset's
    __getitems__. Persistent workers."""
    from torch.utils.data import DataLoader, Sampler

    class GlobalShuffleShard(Sampler):
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            rng = np.random.default_rng(cfg["seed"] + self.epoch)
            self.epoch += 1
            for idx in shard_indices(rng.permutation(n), cfg["batch"], cfg["rank"], cfg["procs"]):
                yield idx.tolist()

        def __len__(self):
            return n // cfg["batch"]

    workers = cfg["workers"]
    return DataLoader(dataset, batch_sampler=GlobalShuffleShard(), collate_fn=lambda b: b, num_workers=workers,
                      persistent_workers=workers > 0, prefetch_factor=4 if workers else None)


def megatron_loader(cfg, view):
    """Megatron-LM's own IndexedDataset (megatron-core, mmap) in a PyTorch
    DataLoader: the batch sampler hands each worker a batch of indices, each
    document comes back as a tensor (through shared memory from workers),
    a batch is the list of them. Persistent workers."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from torch.utils.data import Dataset

    prefix = cfg["path"]

    class Documents(Dataset):
        def __init__(self):
            self.ds = None  # opened in each worker

        def _d(self):
            if self.ds is None:
                self.ds = IndexedDataset(prefix, mmap=True)
            return self.ds

        def __len__(self):
            return len(view)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(self._d()[i]))

        def __getitems__(self, idx):
            d = self._d()
            return [torch.from_numpy(np.array(d[int(i)])) for i in idx]

    while True:
        for b in batched_dataloader(cfg, Documents(), len(view)):
            yield [x.numpy() for x in b]


def dataloader_loader(cfg, view):
    """PyTorch DataLoader over a memory-mapped map-style dataset: the batch
    sampler hands each worker a batch of indices, __getitems__ gathers them
    (one fancy-indexed read, the fast path), tensors come back through shared
    memory. Persistent workers."""
    import torch
    from torch.utils.data import Dataset

    path = cfg["path"]
    scenario = SCENARIOS[cfg["scenario"]]

    class Samples(Dataset):
        def __init__(self):
            self.view = None  # mapped in each worker

        def _v(self):
            if self.view is None:
                self.view = sample_view(path, scenario)
            return self.view

        def __len__(self):
            return len(view)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(self._v()[i]))

        def __getitems__(self, idx):
            return torch.from_numpy(self._v()[np.asarray(idx)])

    while True:
        for b in batched_dataloader(cfg, Samples(), len(view)):
            yield b.numpy()


def grain_loader(cfg, view):
    """Grain's DataLoader: a random-access source over the mapped file, its
    index sampler (global shuffle, this rank's shard), Batch."""
    import grain.python as grain
    from absl import flags as absl_flags

    if not absl_flags.FLAGS.is_parsed():  # Grain reads absl flags; a program without absl.app must parse them
        absl_flags.FLAGS.mark_as_parsed()
    scenario = SCENARIOS[cfg["scenario"]]
    path = cfg["path"]

    class Source(grain.RandomAccessDataSource):
        def __init__(self):
            self.n = len(view)
            self.view = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.view is None:
                self.view = sample_view(path, scenario)
            return np.array(self.view[i])

    per = cfg["batch"] // cfg["procs"]
    sampler = grain.IndexSampler(
        num_records=len(view),
        shard_options=grain.ShardOptions(shard_index=cfg["rank"], shard_count=cfg["procs"], drop_remainder=True),
        shuffle=True, num_epochs=None, seed=cfg["seed"])
    loader = grain.DataLoader(data_source=Source(), sampler=sampler,
                              operations=[grain.Batch(per, drop_remainder=True)], worker_count=cfg["workers"],
                              read_options=grain.ReadOptions(num_threads=cfg.get("threads", 16), prefetch_buffer_size=64))
    for b in loader:
        yield b


def webdataset_loader(cfg, view):
    """webdataset as its users run it: this rank's shards (every procs-th),
    shuffled, a sample shuffle buffer of 1,000, the image and class members
    (the class decoded from its text), batched in the pipeline, through a
    DataLoader whose workers split the shards. Persistent workers."""
    import braceexpand
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = list(braceexpand.braceexpand(cfg["path"]))[cfg["rank"]::cfg["procs"]]
    per = cfg["batch"] // cfg["procs"]

    def collate(samples):
        return Ragged([np.frombuffer(j, np.uint8) for j, _ in samples] +
                      [np.array([int(c) for _, c in samples], np.int64)], len(samples))

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=cfg["seed"], empty_check=False)
          .shuffle(1000, seed=cfg["seed"]).to_tuple("jpg", "cls").batched(per, collation_fn=collate, partial=False))
    workers = cfg["workers"]
    dl = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0,
                    prefetch_factor=4 if workers else None)
    while True:
        for b in dl:
            yield b


def tfdata_loader(cfg, view):
    """tf.data as TensorFlow's input-pipeline guide has it: this rank's
    TFRecord files (every procs-th), shuffled, read interleaved
    (cycle_length and parallel reads = workers, 1 when 0), a 1,000-record
    shuffle buffer, batched, the batch parsed by tf.io.parse_example
    (vectorized; num_parallel_calls = workers, sequential when 0),
    prefetched (AUTOTUNE); the image's bytes and the class as NumPy."""
    import glob

    import tensorflow as tf

    tf.random.set_seed(cfg["seed"])
    # The files of the pattern meshload reads (shard-{000000..N}.tfrecord, or
    # .tfrecord.gz: compression_type GZIP): all of the folder's.
    compression = "GZIP" if cfg["path"].endswith(".gz") else "ZLIB" if cfg["path"].endswith(".zlib") else ""
    suffix = cfg["path"].rsplit("}", 1)[1]
    files = sorted(glob.glob(os.path.join(os.path.dirname(cfg["path"]), "*" + suffix)))[cfg["rank"]::cfg["procs"]]
    per = cfg["batch"] // cfg["procs"]
    workers = cfg["workers"]
    features = {"jpg": tf.io.FixedLenFeature([], tf.string), "cls": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=cfg["seed"]).repeat()
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression), cycle_length=max(1, workers),
                       num_parallel_calls=workers if workers else None, deterministic=False)
    ds = ds.shuffle(1000, seed=cfg["seed"]).batch(per, drop_remainder=True)
    ds = ds.map(lambda x: tf.io.parse_example(x, features), num_parallel_calls=workers if workers else None)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    for b in ds.as_numpy_iterator():
        yield Ragged([np.frombuffer(j, np.uint8) for j in b["jpg"]] + [b["cls"]], per)


def streaming_loader(cfg, view):
    """MosaicML Streaming: a StreamingDataset over MDS shards of the same
    samples, its global shuffle, through a DataLoader. Raw shards are read
    where they are (local); compressed ones are its remote, decompressed
    into a fresh local cache of the run's (as Streaming reads compressed
    shards), as meshload decompresses them into its own."""
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    # The ranks of one node, as torchrun would set them.
    os.environ.update(RANK=str(cfg["rank"]), WORLD_SIZE=str(cfg["procs"]), LOCAL_RANK=str(cfg["rank"]),
                      LOCAL_WORLD_SIZE=str(cfg["procs"]), NODE_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(cfg.get("port", 29517)))
    per = cfg["batch"] // cfg["procs"]
    if cfg.get("local"):
        ds = StreamingDataset(remote=cfg["mds"], local=cfg["local"], batch_size=per, shuffle=True,
                              shuffle_seed=cfg["seed"], predownload=None, num_canonical_nodes=1)
    else:
        ds = StreamingDataset(local=cfg["mds"], remote=None, batch_size=per, shuffle=True, shuffle_seed=cfg["seed"],
                              predownload=None, num_canonical_nodes=1)
    sb = SCENARIOS[cfg["scenario"]].sample_bytes
    variable = SCENARIOS[cfg["scenario"]].variable
    records = SCENARIOS[cfg["scenario"]].records

    def collate(samples):
        if records:  # the image's bytes and the class, as the trainer reads them
            return Ragged([np.frombuffer(s["jpg"], np.uint8) for s in samples] +
                          [np.array([s["cls"] for s in samples], np.int64)], len(samples))
        if variable:
            return [np.frombuffer(s["x"], dtype=np.uint16) for s in samples]
        out = np.empty((len(samples), sb), dtype=np.uint8)
        for i, s in enumerate(samples):
            out[i] = np.frombuffer(s["x"], dtype=np.uint8)
        return out

    workers = cfg["workers"]
    dl = DataLoader(ds, batch_size=per, collate_fn=collate, num_workers=workers, persistent_workers=workers > 0,
                    drop_last=True)
    while True:
        for b in dl:
            yield b


def columnar_files(cfg):
    """The columnar scenario's files: the Parquet files, or the saved Dataset's Arrow files."""
    import glob

    scenario = SCENARIOS[cfg["scenario"]]
    return sorted(glob.glob(os.path.join(cfg["path"], "*.parquet" if scenario.format == "Parquet" else "*.arrow")))


def arrow_batch(table):
    """A batch of rows (a pyarrow Table) as the trainer reads it: the
    input_ids' tokens back to back and the labels."""
    ids = table.column("input_ids").combine_chunks()
    values = ids.values.to_numpy(zero_copy_only=False)
    labels = table.column("label").to_numpy()
    return Ragged([values, labels], table.num_rows)


def hf_map_loader(cfg, view):
    """Hugging Face datasets' map-style Dataset in a PyTorch DataLoader: the
    saved Dataset by load_from_disk, the Parquet files by Dataset.from_parquet
    (which converts them into its Arrow cache first, outside the timed
    part), in Arrow format (no per-row Python objects), a batch gathered by
    one take of a global shuffle's indices. Best num_workers."""
    import datasets

    scenario = SCENARIOS[cfg["scenario"]]
    if scenario.format == "Arrow":
        ds = datasets.load_from_disk(cfg["path"])
    else:
        ds = datasets.Dataset.from_parquet(columnar_files(cfg), cache_dir=os.path.join(cfg["barrier"], "hf-cache"))
    ds = ds.with_format("arrow")

    class Rows:
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return ds[i]

        def __getitems__(self, idx):
            return arrow_batch(ds[idx])

    dl = batched_dataloader(cfg, Rows(), len(ds))
    while True:
        for b in dl:
            yield b


def hf_iterable_loader(cfg, view):
    """Hugging Face datasets' IterableDataset, as its docs stream a dataset:
    the Parquet files read as they are (load_dataset("parquet",
    streaming=True)) or the saved Dataset's to_iterable_dataset, this rank's
    share (split_dataset_by_node), a 1,000-row shuffle buffer, Arrow format,
    batched in a DataLoader. Best num_workers."""
    import datasets
    from datasets.distributed import split_dataset_by_node
    from torch.utils.data import DataLoader

    scenario = SCENARIOS[cfg["scenario"]]
    files = columnar_files(cfg)
    if scenario.format == "Arrow":
        ds = datasets.load_from_disk(cfg["path"]).to_iterable_dataset(num_shards=len(files) * 8)
    else:
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    ds = split_dataset_by_node(ds, rank=cfg["rank"], world_size=cfg["procs"])
    ds = ds.shuffle(seed=cfg["seed"], buffer_size=1000).with_format("arrow")
    per = cfg["batch"] // cfg["procs"]
    workers = cfg["workers"]
    dl = DataLoader(ds, batch_size=per, collate_fn=lambda rows: arrow_batch(__import__("pyarrow").concat_tables(rows)),
                    num_workers=workers, persistent_workers=workers > 0, prefetch_factor=4 if workers else None,
                    drop_last=True)
    epoch = 0
    while True:
        ds.set_epoch(epoch)
        epoch += 1
        for b in dl:
            yield b


def _rows_batch(rows):
    """A Grain batch of Parquet rows (dicts of NumPy values): the tokens back
    to back, the labels, the count (plain arrays: it crosses processes)."""
    return (np.concatenate([np.asarray(r["input_ids"], dtype=np.int32) for r in rows]),
            np.array([r["label"] for r in rows], dtype=np.int64), len(rows))


def grain_parquet_loader(cfg, view):
    """Grain's Parquet source (grain.experimental.ParquetIterDataset: a file
    read row group by row group through pyarrow), this rank's files
    interleaved, a 1,000-row window shuffle, batched; with workers, Grain's
    multiprocess prefetch (a slice of the files each). Best worker count."""
    import grain.python as grain
    from grain import experimental as gx
    from absl import flags as absl_flags

    if not absl_flags.FLAGS.is_parsed():
        absl_flags.FLAGS.mark_as_parsed()
    files = columnar_files(cfg)[cfg["rank"]::cfg["procs"]]
    per = cfg["batch"] // cfg["procs"]
    epoch = 0
    while True:
        ds = gx.ParquetIterDataset(files)  # interleaved, at most 16 at a time
        ds = gx.WindowShuffleIterDataset(ds, window_size=1000, seed=cfg["seed"] + epoch)
        ds = ds.batch(per, drop_remainder=True, batch_fn=_rows_batch)
        if cfg["workers"]:
            # Each worker reads a slice of the files.
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg["workers"]))
        for values, labels, n in ds:
            yield Ragged([values, labels], n)
        epoch += 1


def meshload_loader(cfg, view):
    """meshload: this process's sidecar (started by the driver), the Python
    client, the batch viewed in place (NumPy) or imported into JAX."""
    import meshload

    client = meshload.Client(cfg["socket"])
    if SCENARIOS[cfg["scenario"]].columnar:
        # Named fields: the input_ids (a meshload.Ragged: the tokens back to
        # back) and the labels (an int64 Tensor), viewed in place.
        while True:
            b = client.next()
            d = b.tensors[0]
            ids, label = d["input_ids"], d["label"]
            yield Ragged([np.from_dlpack(ids.values), np.from_dlpack(label)], ids.samples)
            del b, d, ids, label
    if SCENARIOS[cfg["scenario"]].records:
        # Named fields: the images' bytes (a meshload.Ragged's values) and
        # the classes (an int64 Tensor; a TFRecord int64 list is a Ragged),
        # viewed in place.
        while True:
            b = client.next()
            d = b.tensors[0]
            jpg, cls = d["jpg"], d["cls"]
            cls = np.from_dlpack(cls.values if isinstance(cls, meshload.Ragged) else cls)
            yield Ragged([np.from_dlpack(jpg.values), cls], jpg.samples)
            del b, d, jpg, cls
    if SCENARIOS[cfg["scenario"]].variable:
        # A meshload.Ragged: the documents' tokens back to back (values) and
        # their offsets, viewed in place; the values are what is read.
        while True:
            b = client.next()
            r = b.tensors[0]
            yield Ragged(np.from_dlpack(r.values), r.samples)
            del b, r
        import jax.numpy as jnp

        while True:
            b = client.next()
            yield jnp.from_dlpack(b.tensors[0])
            del b
    while True:
        b = client.next()
        yield np.from_dlpack(b.tensors[0])
        del b


class Ragged:
    """A ragged batch as the consumer reads it: its values, and how many samples."""

    __slots__ = ("values", "samples")

    def __init__(self, values, samples):
        self.values = values
        self.samples = samples


LOADERS = {
    "hf-map": hf_map_loader,
    "hf-iterable": hf_iterable_loader,
    "grain-parquet": grain_parquet_loader,
    "webdataset": webdataset_loader,
    "megatron": megatron_loader,
    "numpy": numpy_loader,
    "dataloader": dataloader_loader,
    "grain": grain_loader,
    "streaming": streaming_loader,
    "tfdata": tfdata_loader,
    "meshload": meshload_loader,
}


def main():
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 prints every thread's stack
    cfg = json.loads(sys.argv[1])
    scenario = SCENARIOS[cfg["scenario"]]
    view = sample_view(cfg["path"], scenario, cfg.get("samples", 0))
    consumer = Consumer(cfg.get("consumer", "numpy"))
    me = os.getpid()
    loader_pids = [p for p in cfg.get("loader_pids", [])]
    it = LOADERS[cfg["loader"]](cfg, view)
    waits = []
    per = cfg["batch"] // cfg["procs"]
    gc.disable()  # the same for every loader: no collection pauses inside the timed loop

    def take():
        b = next(it)
        n = b.samples if isinstance(b, Ragged) else (len(b) if isinstance(b, list) else b.shape[0])
        if n != per:
            raise SystemExit("%s delivered a batch of %d samples, expected %d" % (cfg["loader"], n, per))
        return b.values if isinstance(b, Ragged) else b

    # The first batch: set-up (imports, starting workers, the sidecar's
    # start, JAX's compilation of the consumer) counts in the time to first
    # batch; rates, waits and CPU count from the end of its step.
    b = take()
    ttfb = time.monotonic() - cfg["t0"]
    consumer(b)
    del b
    first = time.monotonic()
    cpu0 = proc_cpu(me)
    child_cpu0 = {p: proc_cpu(p) for p in child_pids(me)}
    loader_cpu0 = {p: proc_cpu(p) for p in loader_pids}
    consumer.cpu = 0.0
    untimed_bytes = consumer.bytes  # the first batch's
    consumer.bytes = 0
    # Runs for `seconds` (and at least `min_steps` steps): fast and slow
    # loaders get measured over the same stretch of time.
    steps = 0
    deadline = first + cfg["seconds"]
    while steps < cfg["min_steps"] or time.monotonic() < deadline:
        t = time.monotonic()
        b = take()
        waits.append(time.monotonic() - t)
        consumer(b)
        del b
        steps += 1
    end = time.monotonic()
    timed_bytes = consumer.bytes
    # Ranks leave together, and keep reading (uncounted) until every rank's
    # time is up: as in training, no rank stops while another still steps
    # (Streaming's workers of all ranks meet at epoch boundaries, so a rank
    # that stops reading early can block the others).
    if cfg["procs"] > 1:
        open(os.path.join(cfg["barrier"], "done.%d" % cfg["rank"]), "w").close()
        give_up = time.monotonic() + 120
        while len([f for f in os.listdir(cfg["barrier"]) if f.startswith("done.")]) < cfg["procs"]:
            if time.monotonic() > give_up:
                raise SystemExit("the other trainers did not finish within 120 s")
            consumer(take())
    children = child_pids(me)
    # Loader CPU: this process's (the loop, the client, in-process workers)
    # without the consumer's, plus the worker processes' and the sidecar's.
    cpu = proc_cpu(me) - cpu0 - consumer.cpu
    cpu += sum(proc_cpu(p) - child_cpu0.get(p, 0.0) for p in children if os.path.exists("/proc/%d" % p))
    cpu += sum(proc_cpu(p) - loader_cpu0[p] for p in loader_pids)
    rss = peak_rss(me) + sum(peak_rss(p) for p in children + loader_pids)
    waits.sort()
    print(json.dumps({
        "samples": steps * per,
        "bytes": timed_bytes,
        "all_bytes": untimed_bytes + consumer.bytes,  # every batch this trainer read, the untimed ones too
        "elapsed": end - first,
        "wait_p50": waits[len(waits) // 2],
        "wait_p99": waits[min(len(waits) - 1, int(len(waits) * 0.99))],
        "ttfb": ttfb,
        "loader_cpu": cpu,
        "consumer_cpu": consumer.cpu,
        "peak_rss": rss,
        "checksum": consumer.sink,
    }), flush=True)
    # The loaders' worker processes (spawned ones outlive their parent and
    # hold its stdout) and threads are not waited for: every descendant goes.
    for pid in descendants(me):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
