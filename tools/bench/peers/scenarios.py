"""The benchmark's scenarios and their data, shared by every loader.

A scenario is a dataset (files that meshload reads as FixedRecord,
TokenStream or MegatronIndexed), the samples the trainer asks for and a
global batch size. The peers read the very same files (memory-mapped, or
through Megatron's own IndexedDataset) or, for MosaicML Streaming, MDS
shards written from the very same samples. The Megatron scenario's dataset
is written by megatron-core's own IndexedDatasetBuilder. The image
scenarios' samples (an encoded image of 20 to 500 KiB and a class) are
written by webdataset's TarWriter (with Energon's .tar.idx), by Streaming's
MDSWriter (raw shards, and shards compressed with zstd) and by TensorFlow's
TFRecordWriter (tf.train.Example records, with DALI's tfrecord2idx index,
which `meshload index` writes), the same samples in each; meshload reads the
one the scenario names. The columnar scenarios' rows (a tokenized document's
input_ids, 100 to 2,048 int32 tokens, and an int64 label) are written by
Hugging Face `datasets` itself: Parquet files by Dataset.to_parquet (what the
Hub serves) and a Dataset's folder by save_to_disk (Arrow IPC streams).
"""

import os
from dataclasses import dataclass

import numpy as np

MiB = 1 << 20


@dataclass(frozen=True)
class Scenario:
    name: str
    format: str  # "FixedRecord", "TokenStream" or "MegatronIndexed"
    sample_bytes: int  # bytes of one delivered sample (MegatronIndexed: the mean)
    record_bytes: int = 0  # FixedRecord
    seq: int = 0  # TokenStream: sequence length (a sample is seq + 1 uint16 tokens)
    batch: int = 32  # global batch
    min_tokens: int = 0  # MegatronIndexed: documents of min_tokens..max_tokens uint16 tokens
    max_tokens: int = 0
    min_bytes: int = 0  # WebDataset, MDS, TFRecord: images of min_bytes..max_bytes
    max_bytes: int = 0
    compression: str = ""  # MDS: the shards' codec ("" for raw shards); TFRecord: GZIP or ZLIB

    @property
    def columnar(self):
        """Parquet and Arrow: rows of input_ids (min_tokens..max_tokens int32) and a label."""
        return self.format in ("Parquet", "Arrow")

    @property
    def variable(self):
        return self.format == "MegatronIndexed"

    @property
    def records(self):
        """WebDataset, MDS and TFRecord: samples of two fields, an image and its class."""
        return self.format in ("WebDataset", "MDS", "TFRecord")

    def samples_in(self, dataset_bytes):
        if self.variable or self.records or self.columnar:
            return dataset_bytes // self.sample_bytes
        if self.format == "FixedRecord":
            return dataset_bytes // self.record_bytes
        return (dataset_bytes // 2 - 1) // self.seq

    def file_bytes(self, samples):
        if self.format == "FixedRecord":
            return samples * self.record_bytes
        return (samples * self.seq + 1) * 2


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("tokens-u16-2048", "TokenStream", sample_bytes=2049 * 2, seq=2048, batch=32),
        Scenario("fixed-4KiB", "FixedRecord", sample_bytes=4096, record_bytes=4096, batch=256),
        Scenario("fixed-1MiB", "FixedRecord", sample_bytes=MiB, record_bytes=MiB, batch=16),
        Scenario("megatron-docs-100-8000", "MegatronIndexed", sample_bytes=(100 + 8000), batch=32,
                 min_tokens=100, max_tokens=8000),
        Scenario("wds-images-20-500KiB", "WebDataset", sample_bytes=260 * 1024, batch=32, min_bytes=20 * 1024,
                 max_bytes=500 * 1024),
        Scenario("mds-images-20-500KiB", "MDS", sample_bytes=260 * 1024, batch=32, min_bytes=20 * 1024,
                 max_bytes=500 * 1024),
        Scenario("mds-zstd-images-20-500KiB", "MDS", sample_bytes=260 * 1024, batch=32, min_bytes=20 * 1024,
                 max_bytes=500 * 1024, compression="zstd"),
        Scenario("tfrecord-images-20-500KiB", "TFRecord", sample_bytes=260 * 1024, batch=32, min_bytes=20 * 1024,
                 max_bytes=500 * 1024),
        Scenario("tfrecord-gzip-images-20-500KiB", "TFRecord", sample_bytes=260 * 1024, batch=32,
                 min_bytes=20 * 1024, max_bytes=500 * 1024, compression="GZIP"),
        Scenario("parquet-tokens-100-2048", "Parquet", sample_bytes=4 * 1074 + 8, batch=32, min_tokens=100,
                 max_tokens=2048),
        Scenario("saved-tokens-100-2048", "Arrow", sample_bytes=4 * 1074 + 8, batch=32, min_tokens=100,
                 max_tokens=2048),
    )
}

IMAGES = "images-20-500KiB"  # the image scenarios' shared folder


def make_images(root, scenario, dataset_bytes, meshload, tf_python=None):
    """The image scenarios' samples (random bytes standing for encoded
    images of min_bytes..max_bytes, a class in 0..999), written unless they
    are there: WebDataset shards by webdataset's TarWriter with Energon's
    .tar.idx beside each (written by `meshload`, the CLI), an MDS dataset by
    MDSWriter (raw shards) and another with zstd-compressed shards, and
    (with `tf_python`, the interpreter of an environment with TensorFlow)
    TFRecord files by TensorFlow's TFRecordWriter, one per tar shard
    (compressed with the scenario's GZIP: shard-N.tfrecord.gz), with the
    .idx `meshload index` writes. Returns (what meshload's job reads: the
    shard pattern, the MDS folder or the TFRecord pattern; samples; the MDS
    folder of the scenario's compression, which Streaming reads)."""
    samples = scenario.samples_in(dataset_bytes)
    base = os.path.join(root, IMAGES)
    wds_dir, mds_dir = os.path.join(base, "wds"), os.path.join(base, "mds")
    zstd_dir = os.path.join(base, "mds-zstd")
    tfr_dir = os.path.join(base, "tfrecord" + ("-" + scenario.compression.lower() if scenario.format == "TFRecord"
                                               and scenario.compression else ""))
    done = os.path.join(base, ".complete-v2-%d" % samples)
    shard_bytes = 64 * MiB
    if not os.path.exists(done):
        import shutil

        import subprocess

        import webdataset
        from streaming import MDSWriter

        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(wds_dir)
        rng = np.random.default_rng(2026)
        sizes = rng.integers(scenario.min_bytes, scenario.max_bytes + 1, size=samples)
        shard, written, tar = 0, 0, None
        columns = {"jpg": "bytes", "cls": "int"}
        with MDSWriter(out=mds_dir, columns=columns, compression=None, size_limit=shard_bytes) as mds, \
                MDSWriter(out=zstd_dir, columns=columns, compression="zstd", size_limit=shard_bytes) as mds_zstd:
            for i, n in enumerate(sizes):
                if tar is None or written >= shard_bytes:
                    if tar is not None:
                        tar.close()
                        shard += 1
                    tar = webdataset.TarWriter(os.path.join(wds_dir, "shard-%06d.tar" % shard))
                    written = 0
                jpg = rng.integers(0, 256, size=int(n), dtype=np.uint8).tobytes()
                cls = int(rng.integers(0, 1000))
                tar.write({"__key__": "%09d" % i, "jpg": jpg, "cls": str(cls).encode()})
                mds.write({"jpg": jpg, "cls": cls})
                mds_zstd.write({"jpg": jpg, "cls": cls})
                written += int(n) + 1536
        tar.close()
        # Energon's .tar.idx, as `meshload index` writes it (byte for byte
        # Energon's prepare's: tests/formats/index_cli_test.sh).
        subprocess.run([meshload, "index", os.path.join(wds_dir, "shard-{000000..%06d}.tar" % shard)], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(base, "shards"), "w") as f:
            f.write(str(shard + 1))
        open(done, "w").close()
    with open(os.path.join(base, "shards")) as f:
        shards = int(f.read())
    pattern = os.path.join(wds_dir, "shard-{000000..%06d}.tar" % (shards - 1))
    suffix = {"GZIP": ".gz", "ZLIB": ".zlib"}.get(scenario.compression, "") if scenario.format == "TFRecord" else ""
    tfr_pattern = os.path.join(tfr_dir, "shard-{000000..%06d}.tfrecord%s" % (shards - 1, suffix))
    if scenario.format == "TFRecord" and not os.path.exists(os.path.join(tfr_dir, ".complete")):
        import shutil
        import subprocess

        if tf_python is None:
            raise SystemExit("the TFRecord scenario needs TensorFlow's environment (--tf-python)")
        shutil.rmtree(tfr_dir, ignore_errors=True)
        subprocess.run([tf_python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "write_tfrecords.py"),
                        wds_dir, tfr_dir] + ([scenario.compression] if scenario.compression else []), check=True)
        subprocess.run([meshload, "index"] + (["--compression", scenario.compression] if scenario.compression else [])
                       + [tfr_pattern], check=True, stdout=subprocess.DEVNULL)
        open(os.path.join(tfr_dir, ".complete"), "w").close()
    if scenario.format == "WebDataset":
        return pattern, samples, mds_dir
    if scenario.format == "TFRecord":
        return tfr_pattern, samples, None
    mds = zstd_dir if scenario.compression else mds_dir
    return mds, samples, mds


def make_columnar(root, scenario, dataset_bytes):
    """The columnar scenarios' rows, written by Hugging Face datasets unless
    they are there: Parquet files of about 64 MiB (at least 8) by
    Dataset.to_parquet (its default row groups), and the same rows saved by
    save_to_disk in as many Arrow streams. Returns (the Parquet folder or the saved
    Dataset's folder, rows)."""
    samples = scenario.samples_in(dataset_bytes)
    base = os.path.join(root, "columnar-tokens")
    pq_dir, saved_dir = os.path.join(base, "parquet"), os.path.join(base, "saved")
    # At least 8 files: Grain's Parquet reader gives each worker whole files.
    shards = max(8, samples * 4 * (scenario.min_tokens + scenario.max_tokens) // 2 // (64 * MiB))
    done = os.path.join(base, ".complete-%d-%d" % (samples, shards))
    if not os.path.exists(done):
        import shutil

        import pyarrow as pa
        from datasets import Dataset

        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(pq_dir)
        rng = np.random.default_rng(2027)
        lengths = rng.integers(scenario.min_tokens, scenario.max_tokens + 1, size=samples)
        offsets = np.zeros(samples + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 50000, size=int(offsets[-1]), dtype=np.int32)
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
                          "label": pa.array(rng.integers(0, 1000, size=samples), pa.int64())})
        ds = Dataset(table)
        for k in range(shards):
            ds.shard(num_shards=shards, index=k, contiguous=True).to_parquet(
                os.path.join(pq_dir, "train-%05d-of-%05d.parquet" % (k, shards)))
        ds.save_to_disk(saved_dir, num_shards=shards)
        open(done, "w").close()
    return (pq_dir if scenario.format == "Parquet" else saved_dir), samples


class Records:
    """The image scenarios' samples, only counted (no loader here reads them
    by index)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return self.samples


def data_file(root, scenario):
    if scenario.variable:
        return os.path.join(root, scenario.name, "docs")  # the prefix: docs.bin and docs.idx
    return os.path.join(root, scenario.name, "part-00000." + ("tok" if scenario.format == "TokenStream" else "bin"))


def document_lengths(scenario, samples):
    """The Megatron scenario's document lengths in tokens (seeded, spread
    evenly over [min_tokens, max_tokens])."""
    rng = np.random.default_rng(4321)
    return rng.integers(scenario.min_tokens, scenario.max_tokens + 1, size=samples)


def make_megatron(root, scenario, dataset_bytes):
    """Writes the scenario's Megatron indexed dataset with megatron-core's own
    IndexedDatasetBuilder (random uint16 tokens) unless it is there."""
    samples = scenario.samples_in(dataset_bytes)
    prefix = data_file(root, scenario)
    done = prefix + ".complete-%d" % samples
    if not os.path.exists(done):
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        rng = np.random.default_rng(1234)
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        import torch

        for n in document_lengths(scenario, samples):
            builder.add_document(torch.from_numpy(rng.integers(0, 65536, size=int(n), dtype=np.uint16)), [int(n)])
        builder.finalize(prefix + ".idx")
        open(done, "w").close()
    return prefix, samples


def make_dataset(root, scenario, dataset_bytes):
    """Writes the scenario's file (random bytes) unless it is there with the
    right size; returns (path, samples)."""
    if scenario.variable:
        return make_megatron(root, scenario, dataset_bytes)
    samples = scenario.samples_in(dataset_bytes)
    path = data_file(root, scenario)
    size = scenario.file_bytes(samples)
    if not (os.path.exists(path) and os.path.getsize(path) == size):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = np.random.default_rng(1234)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            left = size
            while left:
                n = min(left, 64 * MiB)
                f.write(rng.integers(0, 256, size=n, dtype=np.uint8).tobytes())
                left -= n
        os.replace(tmp, path)
    return path, samples


class DocumentView:
    """A Megatron scenario's documents, by index, as views of the mapped
    .bin (what the NumPy loop reads; Megatron's reader is in the worker)."""

    def __init__(self, prefix):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        index = IndexedDataset(prefix, mmap=True)
        # Copies: the arrays view the .idx mapping, which goes with `index`.
        self.lengths = np.array(index.sequence_lengths, dtype=np.int64)
        self.pointers = np.array(index.index.sequence_pointers, dtype=np.int64)
        self.bin = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        a = int(self.pointers[i])
        return self.bin[a:a + 2 * int(self.lengths[i])].view(np.uint16)


def sample_view(path, scenario, samples=0):
    """The dataset as an (N, sample_bytes) uint8 array view of the mapped file
    (TokenStream: overlapping windows of seq + 1 tokens, as meshload reads them;
    MegatronIndexed: a DocumentView)."""
    if scenario.variable:
        return DocumentView(path)
    if scenario.records or scenario.columnar:
        return Records(samples)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    if scenario.format == "FixedRecord":
        return mm.reshape(-1, scenario.record_bytes)
    n = scenario.samples_in(mm.size)
    return np.lib.stride_tricks.as_strided(mm, shape=(n, scenario.sample_bytes), strides=(scenario.seq * 2, 1),
                                           writeable=False)


def job_yaml(name, path, scenario, processes, prefetch=4, seed=1):
    """The DataLoadJob meshload runs for a scenario: one device per process,
    the global batch sharded over the processes, global shuffle."""
    if scenario.format == "FixedRecord":
        fmt = "recordBytes: %d" % scenario.record_bytes
    elif scenario.variable:
        fmt = "dtype: uint16"
    elif scenario.columnar:
        # Decoded row groups (batches) kept: twice the rows' bytes, so a
        # global shuffle decodes each once an epoch.
        fmt = ("fields: [{name: input_ids, dtype: int32, maxBytes: %d}, {name: label, dtype: int64}], "
               "cache: {capacityBytes: %d}" % (4 * scenario.max_tokens, 2 * (1 << 30)))
    elif scenario.records:
        fmt = "fields: [{name: jpg}, {name: cls, dtype: int64}]"
        if scenario.format == "TFRecord" and scenario.compression:
            fmt += ", compression: " + scenario.compression
    else:
        fmt = "dtype: uint16, sequenceLength: %d" % scenario.seq
    return (
        "apiVersion: meshload.io/v1alpha1\n"
        "kind: DataLoadJob\n"
        "metadata: {name: %(name)s}\n"
        "spec:\n"
        "  mesh: {processes: %(p)d, devicesPerProcess: 1, axes: [{name: data, size: %(p)d}]}\n"
        "  strategy: PerProcess\n"
        "  dataset: {uri: \"%(uri)s\", format: %(format)s, %(fmt)s}\n"
        "  batch: {globalBatchSize: %(batch)d, prefetch: %(prefetch)d}\n"
        "  shuffle: {mode: Global, seed: %(seed)d}\n"
    ) % {"name": name, "p": processes, "uri": path, "format": scenario.format, "fmt": fmt,
         "batch": scenario.batch, "prefetch": prefetch, "seed": seed}
