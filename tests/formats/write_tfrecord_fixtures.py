#!/usr/bin/env python3
"""Writes tests/formats/data/tfrecord/ with TensorFlow's TFRecordWriter and
tf.train.Example, indexes the files with the `tfrecord` package's
tfrecord2idx (DALI's index format: a line "offset length" per record), and
reads them back with a second reader (every record's framing and masked
CRC32C checked with the `crc32c` package, each Example parsed with the
`tfrecord` package's protobuf) to write what each record holds.

The fixtures are committed (CI installs neither TensorFlow nor `tfrecord`):
this script is how they were made, in the environment
tests/formats/requirements-tfrecord-writers.txt pins (tensorflow-cpu 2.21.0,
tfrecord 1.14.6, crc32c 2.9.post0; TensorFlow and tfrecord cannot be
imported into one interpreter, their protobuf descriptors clash, so the
script runs itself once per step):

    python tests/formats/write_tfrecord_fixtures.py tests/formats/data/tfrecord
    # or only the compressed copies of the committed files, then the check:
    python tests/formats/write_tfrecord_fixtures.py compress tests/formats/data/tfrecord
    python tests/formats/write_tfrecord_fixtures.py read tests/formats/data/tfrecord

part-0000{0,1,2}.tfrecord: 30 records over three files (the last file
empty of records is not made: 12, 11 and 7 records), each a tf.train.Example
with a bytes feature `image` (0 to 700 random bytes), an int64 `label`
(one value), an int64 list `input_ids` (0 to 40 values, some negative and
some above 2^32), a float list `box` (4 values) and a bytes `text`; record
17 has no `text`. expected.json: per file, per record, its byte offset and
length, and per feature its kind and values (bytes in hex, int64 values as
numbers, floats as their little-endian float32 bytes in hex).

gzip/part-0000{0,1,2}.tfrecord.gz and zlib/part-0000{0,1,2}.tfrecord.zlib:
the same records, read back by tf.data.TFRecordDataset and written again by
TFRecordWriter with TFRecordOptions(compression_type="GZIP") and "ZLIB";
checked by a second reader (Python's gzip and zlib decompress each to
exactly the uncompressed file's bytes), so each one's index, FILE.idx (the
records' offsets in its decompressed bytes), is the uncompressed file's.
"""
import json
import os
import random
import struct
import subprocess
import sys


def write(out):
    import tensorflow as tf

    rng = random.Random(52)
    counts = (12, 11, 7)
    n = 0
    for f, count in enumerate(counts):
        path = os.path.join(out, "part-%05d.tfrecord" % f)
        with tf.io.TFRecordWriter(path) as w:
            for _ in range(count):
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[bytes(rng.randrange(256) for _ in range(rng.choice([0, 17, 700])))])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[rng.randrange(-3, 1000)])),
                    "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[rng.choice([rng.randrange(50000), -rng.randrange(5), 2**40 + rng.randrange(9)])
                               for _ in range(rng.choice([0, 1, 9, 40]))])),
                    "box": tf.train.Feature(float_list=tf.train.FloatList(value=[rng.random() for _ in range(4)])),
                }
                if n != 17:
                    feature["text"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[("record %d " % n + "x" * rng.randrange(30)).encode()]))
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
                n += 1
    compress(out)


def compress(out):
    """gzip/ and zlib/ from the uncompressed files in `out` (alone: from the
    committed ones; TensorFlow serializes an Example's feature map in no
    fixed order, so writing the records again changes their bytes)."""
    import tensorflow as tf

    for kind, suffix in (("GZIP", "gz"), ("ZLIB", "zlib")):
        os.makedirs(os.path.join(out, kind.lower()), exist_ok=True)
        for f in range(3):
            src = os.path.join(out, "part-%05d.tfrecord" % f)
            dst = os.path.join(out, kind.lower(), "part-%05d.tfrecord.%s" % (f, suffix))
            with tf.io.TFRecordWriter(dst, options=tf.io.TFRecordOptions(compression_type=kind)) as w:
                for record in tf.data.TFRecordDataset(src):
                    w.write(record.numpy())


def masked_crc(data):
    import crc32c

    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read(out):
    from tfrecord import example_pb2
    from tfrecord.tools.tfrecord2idx import create_index

    files = sorted(p for p in os.listdir(out) if p.endswith(".tfrecord"))
    doc = {"writer": "tensorflow.io.TFRecordWriter (tensorflow-cpu 2.21.0); read back by this script's framing "
                     "check (crc32c's masked CRC32C) and the tfrecord package's Example",
           "files": []}
    for name in files:
        path = os.path.join(out, name)
        create_index(path, path + ".idx")  # DALI's name would be part-00000.idx; meshload reads both
        with open(path + ".idx") as f:
            extents = [tuple(map(int, line.split())) for line in f]
        with open(path, "rb") as f:
            data = f.read()
        records = []
        for offset, length in extents:
            (n,) = struct.unpack_from("<Q", data, offset)
            assert struct.unpack_from("<I", data, offset + 8)[0] == masked_crc(data[offset:offset + 8])
            payload = data[offset + 12:offset + 12 + n]
            assert struct.unpack_from("<I", data, offset + 12 + n)[0] == masked_crc(payload)
            assert length == 16 + n
            example = example_pb2.Example()
            example.ParseFromString(payload)
            features = {}
            for k, v in example.features.feature.items():
                kind = v.WhichOneof("kind")
                if kind == "bytes_list":
                    features[k] = {"kind": "bytes", "values": [x.hex() for x in v.bytes_list.value]}
                elif kind == "int64_list":
                    features[k] = {"kind": "int64", "values": list(v.int64_list.value)}
                else:
                    features[k] = {"kind": "float", "values": [struct.pack("<f", x).hex() for x in v.float_list.value]}
            records.append({"offset": offset, "length": length, "features": features})
        doc["files"].append({"name": name, "records": records})
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
        f.write("\n")
    import gzip
    import shutil
    import zlib

    for kind, suffix, decompress in (("gzip", "gz", gzip.decompress), ("zlib", "zlib", zlib.decompress)):
        for name in files:
            path = os.path.join(out, kind, name + "." + suffix)
            with open(path, "rb") as f, open(os.path.join(out, name), "rb") as g:
                assert decompress(f.read()) == g.read(), path
            shutil.copyfile(os.path.join(out, name + ".idx"), path + ".idx")


def main():
    if len(sys.argv) == 3:
        {"write": write, "compress": compress, "read": read}[sys.argv[1]](sys.argv[2])
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    import shutil

    for p in os.listdir(out):
        if os.path.isdir(os.path.join(out, p)):
            shutil.rmtree(os.path.join(out, p))
        else:
            os.remove(os.path.join(out, p))
    subprocess.run([sys.executable, __file__, "write", out], check=True)
    subprocess.run([sys.executable, __file__, "read", out], check=True)


if __name__ == "__main__":
    main()
