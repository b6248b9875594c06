"""The image scenarios' samples as TFRecord files, written by TensorFlow.

    python write_tfrecords.py WDS_DIR OUT_DIR [GZIP|ZLIB]

Runs in an environment with TensorFlow (tests/formats/requirements-tfrecord-writers.txt).
Each WebDataset shard WDS_DIR/shard-NNNNNN.tar becomes OUT_DIR/shard-NNNNNN.tfrecord:
one tf.train.Example per sample, in the shard's order, with the features
`jpg` (bytes_list: the image's bytes) and `cls` (int64_list: the class,
parsed from the sample's `cls` member), written by tf.io.TFRecordWriter
(uncompressed, or with the compression_type given: shard-NNNNNN.tfrecord.gz
or .zlib). The indexes are `meshload index`'s to write.
"""

import os
import sys
import tarfile

import tensorflow as tf


def samples(tar_path):
    """(jpg bytes, class) per sample of a WebDataset shard, in order."""
    key, parts = None, {}
    with tarfile.open(tar_path) as tar:
        for m in tar:
            if not m.isfile():
                continue
            k, _, ext = m.name.partition(".")
            if key is not None and k != key:
                yield parts["jpg"], int(parts["cls"])
                parts = {}
            key = k
            parts[ext] = tar.extractfile(m).read()
    if key is not None:
        yield parts["jpg"], int(parts["cls"])


def main():
    wds_dir, out_dir = sys.argv[1], sys.argv[2]
    compression = sys.argv[3] if len(sys.argv) > 3 else ""
    suffix = {"": "", "GZIP": ".gz", "ZLIB": ".zlib"}[compression]
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(wds_dir)):
        if not name.endswith(".tar"):
            continue
        out = os.path.join(out_dir, name[:-len(".tar")] + ".tfrecord" + suffix)
        with tf.io.TFRecordWriter(out + ".tmp", options=tf.io.TFRecordOptions(compression_type=compression)) as w:
            for jpg, cls in samples(os.path.join(wds_dir, name)):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "jpg": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpg])),
                    "cls": tf.train.Feature(int64_list=tf.train.Int64List(value=[cls])),
                }))
                w.write(ex.SerializeToString())
        os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
