#!/usr/bin/env python3
"""Records of several fields end to end: WebDataset shards written by
webdataset's TarWriter (indexed by Energon's prepare) and an MDS dataset
written by Streaming's MDSWriter (tests/formats/data/, with what each
format's own reader returned for every sample in the expected.json files),
served by real sidecars to the Python client.

    PYTHONPATH=<build>/client/python python3 fields_test.py \\
        --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

Every step of two epochs: `Batch.fields` names the job's fields,
`Batch.tensors` holds a dict per device, `Batch.field(name)` a field's
tensor per device; a field of bytes is a meshload.Ragged whose views are
exactly the reader's bytes, a decoded field a dense Tensor of one value per
sample. A job that skips samples without a field gets fewer samples on that
device, the same count in every field. CTest runs this as `python.fields`.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np

import harness
import meshload

SIDECAR = MESHLOAD = None
TMP = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "formats", "data")


def webdataset_expected():
    """Per global sample id: {extension: bytes}, in shard order."""
    out = []
    for shard in ("shard-000000", "shard-000001"):
        with open(os.path.join(DATA, "webdataset", shard + ".expected.json")) as f:
            for s in json.load(f)["samples"]:
                out.append({k: bytes.fromhex(v) for k, v in s["fields"].items()})
    return out


def mds_expected(codec="raw"):
    """Per global sample id: {column: bytes as MDS encodes them}."""
    with open(os.path.join(DATA, "mds", codec, "expected.json")) as f:
        doc = json.load(f)
    return [{c: bytes.fromhex(v) for c, v in row["columns"].items()} for shard in doc["shards"] for row in shard]


def tfrecord_expected():
    """Per global sample id: {feature: bytes as the sidecar stages them} (a
    bytes_list's value; int64 and float values little-endian, back to back)."""
    with open(os.path.join(DATA, "tfrecord", "expected.json")) as f:
        doc = json.load(f)
    out = []
    for file in doc["files"]:
        for record in file["records"]:
            fields = {}
            for name, feature in record["features"].items():
                if feature["kind"] == "int64":
                    fields[name] = np.array(feature["values"], np.int64).tobytes()
                else:
                    fields[name] = b"".join(bytes.fromhex(v) for v in feature["values"])
            out.append(fields)
    return out


def planned(job, first, last):
    """{step: {global device: [sample ids]}} from `meshload plan`."""
    out = subprocess.run([MESHLOAD, "plan", "-f", job, "--steps", "%d:%d" % (first, last), "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    return {s["step"]: {d["device"]: d["samples"] for d in s["devices"]} for s in json.loads(out)["steps"]}


class Run(harness.SidecarGroup):
    def __init__(self, name, fmt, uri, fields, processes, devices_per_process, axes, batch_axes=None,
                 replication=None, missing_field=None, cache=False, compression=None):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        self.job = os.path.join(self.dir, "job.yaml")
        self.fields = [f[0] for f in fields]
        with open(self.job, "w") as f:
            f.write(harness.job_yaml(name, uri, processes, devices_per_process, axes, batch_axes,
                                     replication=replication, dataset_format=fmt, fields=fields,
                                     missing_field=missing_field, compression=compression))
        self.sidecars = [
            harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(self.dir, "s%d.sock" % p),
                                   os.path.join(self.dir, "sidecar%d.log" % p),
                                   extra=["--cache-dir", os.path.join(self.dir, "cache")] if cache else [])
            for p in range(processes)]

    def batches(self, first, last):
        """{step: {global device: [one tuple of field values per sample]}};
        a ragged field's values as bytes, a dense one's as a NumPy array."""
        out = {}
        clients = [meshload.Client(s.sock, start_step=first) for s in self.sidecars]
        try:
            for step in range(first, last):
                out[step] = {}
                for c in clients:
                    b = c.next(timeout=60)
                    assert b.step == step, (b.step, step)
                    assert b.fields == tuple(self.fields), b.fields
                    assert "fields=%d" % len(self.fields) in repr(b), repr(b)
                    for d, per_field in enumerate(b.tensors):
                        assert list(per_field) == self.fields, per_field
                        columns, counts = [], set()
                        for name in self.fields:
                            t = per_field[name]
                            assert t is b.field(name)[d]
                            if isinstance(t, meshload.Ragged):
                                values = np.from_dlpack(t.values)
                                views = t.to_list()
                                counts.add(t.samples)
                                columns.append([v.tobytes() for v in views])
                                device = t.global_device
                                assert values.dtype.itemsize * sum(len(v) for v in views) == values.nbytes
                            else:
                                a = np.from_dlpack(t).copy()
                                counts.add(a.shape[0])
                                columns.append(list(a))
                                device = t.global_device
                        assert len(counts) == 1, "every field holds as many samples: %s" % counts
                        out[step][device] = list(zip(*columns))
                    del b
        finally:
            for c in clients:
                c.close()
        return out


class FieldsTest(unittest.TestCase):
    def check(self, run, expected, decode, first, last, replicas=False):
        """Every device's samples are the planned ones that have every field,
        each field equal to the reader's value (`decode(field, bytes)`)."""
        plan = planned(run.job, first, last)
        got = run.batches(first, last)
        skipped = 0
        for step in range(first, last):
            self.assertEqual(sorted(got[step]), sorted(plan[step]), "step %d's devices" % step)
            for device, ids in plan[step].items():
                want = []
                for i in ids:
                    if all(f in expected[i] for f in run.fields):
                        want.append(tuple(decode(f, expected[i][f]) for f in run.fields))
                    else:
                        skipped += 1
                have = got[step][device]
                self.assertEqual(len(have), len(want), "step %d device %d" % (step, device))
                for h, w in zip(have, want):
                    for name, a, b in zip(run.fields, h, w):
                        if isinstance(b, bytes):
                            self.assertEqual(a, b, "step %d device %d field %s" % (step, device, name))
                        else:
                            np.testing.assert_array_equal(a, b, "step %d device %d field %s" % (step, device, name))
        return got, skipped

    def webdataset(self):
        d = os.path.join(TMP, "shards")
        if not os.path.isdir(d):
            os.makedirs(d)
            for shard in ("shard-000000", "shard-000001"):
                for ext in (".tar", ".tar.idx"):
                    shutil.copy(os.path.join(DATA, "webdataset", shard + ext), d)
        return os.path.join(d, "shard-{000000..000001}.tar")

    @staticmethod
    def wds_decode(field, b):
        return np.int64(int(b.decode())) if field == "cls" else b

    def test_webdataset_images_and_classes_over_two_epochs(self):
        expected = webdataset_expected()
        with Run("wds", "WebDataset", self.webdataset(), [("jpg", None), ("cls", "int64")], 4, 1,
                 [("data", 4)]) as run:
            _, skipped = self.check(run, expected, self.wds_decode, 0, 6)  # 21 samples: 2 steps an epoch
            self.assertEqual(skipped, 0)

    def test_webdataset_replicas_hold_the_same_fields(self):
        expected = webdataset_expected()
        with Run("wds-replicas", "WebDataset", self.webdataset(), [("cls", "int32"), ("jpg", None)], 2, 2,
                 [("data", 2), ("model", 2)], ["data"], "Partial") as run:
            got, _ = self.check(run, expected, lambda f, b: np.int32(int(b.decode())) if f == "cls" else b, 0, 4)
            for step, devices in got.items():
                for d in (0, 2):
                    self.assertEqual(len(devices[d]), len(devices[d + 1]))
                    for a, b in zip(devices[d], devices[d + 1]):
                        self.assertEqual(a[1], b[1])
                        self.assertEqual(a[0], b[0])

    def test_samples_without_a_field_are_skipped_when_the_job_says_so(self):
        expected = webdataset_expected()
        with Run("wds-skip", "WebDataset", self.webdataset(), [("json", None), ("cls", "int64")], 2, 1,
                 [("data", 2)], missing_field="Skip") as run:
            _, skipped = self.check(run, expected, self.wds_decode, 0, 4)
            self.assertGreater(skipped, 0)

    @staticmethod
    def mds_decode(field, b):
        if field == "label":
            return np.frombuffer(b, np.int64)[0]
        if field == "score":
            return np.frombuffer(b, np.float32)[0]
        if field == "box":
            return np.frombuffer(b, np.uint16)
        if field == "tokens":  # a variable-shape ndarray: its elements, after the shape header
            n = 1 + (b[0] >> 2) * (1 << (b[0] & 3))
            return b[n:]
        return b

    def test_compressed_mds_through_the_block_cache_and_in_memory(self):
        """zstd and brotli shards (MDSWriter's), decompressed into the block
        cache (--cache-dir: one block per shard, on disk) or, without one, in
        memory: the same columns as Streaming's reader returns."""
        fields = [("image", None), ("label", "int64"), ("tokens", "int32")]
        for codec, cache in (("zstd", True), ("br", False)):
            with self.subTest(codec=codec, cache=cache):
                with Run("mds-" + codec, "MDS", os.path.join(DATA, "mds", codec), fields, 2, 1, [("data", 2)],
                         cache=cache) as run:
                    self.check(run, mds_expected(codec), self.mds_decode, 0, 10)
                    log = run.sidecars[0].log_text()
                    if cache:
                        blocks = glob.glob(os.path.join(run.dir, "cache", "meshload-blocks-v1", "*", "*"))
                        self.assertEqual(len(blocks), 4, blocks)  # one per shard
                    else:
                        self.assertIn("decompressed in memory", log)
                        # With the decompressed bytes an epoch keeps in use
                        # (at most the 4 shards' 30161), which the default
                        # capacity holds: no decompressing again.
                        line = next(json.loads(x) for x in log.splitlines() if "decompressed in memory" in x)
                        self.assertTrue(0 < line["in_use_bytes"] <= 30161, line)
                        self.assertNotIn("again within each epoch", line["msg"])

    def test_tfrecord_features_as_bytes_and_ragged_lists(self):
        """TFRecord files TensorFlow wrote: bytes, int64 and float32 features
        over two epochs, each a ragged field of the dtype the job names."""
        fields = [("image", None), ("label", "int64"), ("input_ids", "int64"), ("box", "float32")]
        with Run("tfrecord", "TFRecord", os.path.join(DATA, "tfrecord", "*.tfrecord"), fields, 2, 1,
                 [("data", 2)]) as run:
            self.check(run, tfrecord_expected(), lambda f, b: b, 0, 8)  # 30 records, batch 8: two epochs
            c = meshload.Client(run.sidecars[0].sock)
            try:
                b = c.next(timeout=60)
                self.assertIsInstance(b.field("label")[0], meshload.Ragged)
                self.assertEqual(str(np.from_dlpack(b.field("label")[0].values).dtype), "int64")
                self.assertEqual(str(np.from_dlpack(b.field("box")[0].values).dtype), "float32")
                del b
            finally:
                c.close()

    def test_tfrecord_files_tensorflow_compressed_read_through_the_cache_or_in_memory(self):
        """TFRecord files TensorFlow wrote with compression_type GZIP and ZLIB:
        the sidecar decompresses each whole, into its block cache (with a
        cache directory) or in memory, and delivers every feature the
        second reader read, over two epochs."""
        fields = [("image", None), ("label", "int64", []), ("input_ids", "int64")]

        def decode(f, b):
            return np.frombuffer(b, np.int64)[0] if f == "label" else b

        for kind, pattern in (("GZIP", "gzip/*.gz"), ("ZLIB", "zlib/*.zlib")):
            for cache in (True, False):
                with self.subTest(kind=kind, cache=cache):
                    with Run("tfrecord-%s-%s" % (kind.lower(), "cache" if cache else "memory"), "TFRecord",
                             os.path.join(DATA, "tfrecord", pattern), fields, 2, 1, [("data", 2)], cache=cache,
                             compression=kind) as run:
                        self.check(run, tfrecord_expected(), decode, 0, 8)
                        log = run.sidecars[0].log_text()
                        if cache:
                            blocks = glob.glob(os.path.join(run.dir, "cache", "meshload-blocks-v1", "*", "*"))
                            self.assertEqual(len(blocks), 3, blocks)  # one per file, decompressed
                            self.assertNotIn("decompressed in memory", log)
                        else:
                            self.assertIn("decompressed in memory", log)

    def test_tfrecord_lists_of_a_fixed_shape_are_dense_tensors(self):
        """With a shape (tf.io.FixedLenFeature's), an int64_list or float_list
        is a dense Tensor of [n, *shape]: label [] and box [4]."""
        fields = [("image", None), ("label", "int64", []), ("box", "float32", [4])]

        def decode(f, b):
            if f == "label":
                return np.frombuffer(b, np.int64)[0]
            return np.frombuffer(b, np.float32) if f == "box" else b

        with Run("tfrecord-dense", "TFRecord", os.path.join(DATA, "tfrecord", "*.tfrecord"), fields, 2, 1,
                 [("data", 2)]) as run:
            self.check(run, tfrecord_expected(), decode, 0, 8)
            c = meshload.Client(run.sidecars[0].sock)
            try:
                b = c.next(timeout=60)
                self.assertEqual(b.field("label")[0].shape, (4,))
                self.assertEqual(b.field("label")[0].dtype, "int64")
                self.assertEqual(b.field("box")[0].shape, (4, 4))
                self.assertEqual(b.field("box")[0].dtype, "float32")
                del b
            finally:
                c.close()

    def test_mds_columns_as_bytes_scalars_and_arrays(self):
        expected = mds_expected()
        decode = self.mds_decode
        fields = [("text", None), ("label", "int64"), ("box", "uint16"), ("score", "float32"), ("tokens", "int32")]
        with Run("mds", "MDS", os.path.join(DATA, "mds", "raw"), fields, 2, 2, [("data", 4)]) as run:
            self.check(run, expected, decode, 0, 10)  # 40 samples: 5 steps an epoch
            c = meshload.Client(run.sidecars[0].sock)
            try:
                b = c.next(timeout=60)
                self.assertEqual(b.field("box")[0].shape, (2, 4))
                self.assertEqual(b.field("tokens")[0].dtype, "int32")
                with self.assertRaisesRegex(KeyError, "no field 'image' in this batch"):
                    b.field("image")
                del b
            finally:
                c.close()


def main():
    return harness.run_unittests(globals(), __doc__, "mlfields-")


if __name__ == "__main__":
    sys.exit(main())
