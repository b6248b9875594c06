#!/usr/bin/env python3
"""The meshload Python client with PyTorch (CPU), against real sidecars.

    scripts/torch-check            # makes the PyTorch environment, then runs this

or, in an environment with torch and the meshload package installed:

    python torch_test.py --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

torch.from_dlpack on host-staged batches (zero-copy, every byte checked,
lifetime across releases), meshload.interop.torch_tensors, a tiny causal
language model trained on packed rows (spec.tokens Pack), the
DistributedDataParallel example trainer (examples/python/torch_ddp_trainer.py)
in two processes against two sidecars, its per-step batch sums compared with
the planner's global batches, and the JPEG example trainer
(examples/python/torch_jpeg_trainer.py) on WebDataset shards of JPEGs.
"""

import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import harness
import meshload
from meshload import interop

SIDECAR = MESHLOAD = None
TMP = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_RECORDS = 96
STEPS = 14
ROWS = harness.records(N_RECORDS)


class OneSidecar(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=TMP)
        data = harness.write_dataset(os.path.join(self.dir, "data.bin"), N_RECORDS)
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(harness.job_yaml("torch-one", data, 1, 2, [("data", 2)]))
        self.sidecar = harness.SidecarProcess(SIDECAR, self.job, 0, os.path.join(self.dir, "s.sock"),
                                              os.path.join(self.dir, "sidecar.log")).start()

    def tearDown(self):
        gc.collect()
        self.sidecar.stop()

    def check_rows(self, x):
        words = x.numpy().view("<u8")
        for row in words:
            np.testing.assert_array_equal(row, ROWS[int(row[0])])
        return [int(i) for i in words[:, 0]]

    def test_from_dlpack_is_a_zero_copy_view_of_the_slot(self):
        with meshload.Client(self.sidecar.sock) as c:
            for _ in range(STEPS):
                b = c.next(timeout=30)
                for t in b.tensors:
                    x = torch.from_dlpack(t)
                    self.assertEqual(x.data_ptr(), t.data_ptr)
                    self.assertEqual(x.dtype, torch.uint8)
                    self.assertEqual(tuple(x.shape), (4, harness.RECORD_BYTES))
                    self.assertEqual(x.device.type, "cpu")
                    self.check_rows(x)

    def test_interop_helper_and_lifetime(self):
        with meshload.Client(self.sidecar.sock) as c:
            b = c.next(timeout=30)
            xs = interop.torch_tensors(b)
            copies = [x.clone() for x in xs]
            ids = [self.check_rows(x) for x in xs]
            del b  # the tensors keep the slot: the sidecar must not restage it
            for _ in range(6):  # twice round the 3 slots
                later = c.next(timeout=30)
                for x in interop.torch_tensors(later):
                    self.check_rows(x)
                del later
            for x, copy in zip(xs, copies):
                self.assertTrue(torch.equal(x, copy), "a slot was restaged under a live tensor")
            self.assertEqual(ids, [self.check_rows(x) for x in xs])


class RaggedTest(unittest.TestCase):
    """A Megatron indexed dataset megatron-core wrote: each device's ragged
    batch into PyTorch, values and offsets zero-copy, every document equal
    to Megatron's own reading of it."""

    def test_values_and_offsets_are_views_and_every_document_is_megatrons(self):
        prefix = os.path.join(ROOT, "tests", "formats", "data", "megatron", "tokens_uint16")
        with open(prefix + ".expected.json") as f:
            sequences = json.load(f)["sequences"]
        d = tempfile.mkdtemp(dir=TMP)
        job = os.path.join(d, "job.yaml")
        with open(job, "w") as f:
            f.write(harness.job_yaml("torch-ragged", prefix, 1, 2, [("data", 2)], dataset_format="MegatronIndexed"))
        plan = harness.planned_global_batches(MESHLOAD, job, STEPS)
        sidecar = harness.SidecarProcess(SIDECAR, job, 0, os.path.join(d, "s.sock"),
                                         os.path.join(d, "sidecar.log")).start()
        try:
            with meshload.Client(sidecar.sock) as c:
                for step in range(STEPS):
                    b = c.next(timeout=30)
                    pairs = interop.torch_tensors(b)
                    ids = iter(plan[step])
                    for r, (values, offsets) in zip(b.tensors, pairs):
                        self.assertEqual(values.data_ptr(), r.values.data_ptr)
                        self.assertEqual(offsets.data_ptr(), r.offsets.data_ptr)
                        self.assertEqual(values.dtype, torch.uint16)
                        self.assertEqual(offsets.dtype, torch.int64)
                        o = offsets.tolist()
                        for k in range(r.samples):
                            want = sequences[next(ids)]
                            self.assertEqual(values[o[k]:o[k + 1]].tolist(), want, "step %d" % step)
                    del b, pairs, values, offsets
        finally:
            gc.collect()
            sidecar.stop()


class PackedLanguageModelTest(unittest.TestCase):
    """A tiny causal language model in PyTorch trained on packed rows
    (spec.tokens Pack) from one sidecar: the attention mask from the
    segment ids, the loss falls, and every step's batch is the planner's
    rows (tests/client/lm_test.py does the same in JAX across processes and
    a resize)."""

    STEPS = 150
    DATA = os.path.join(ROOT, "tests", "formats", "data", "megatron", "lm_uint16")

    def test_a_tiny_model_learns_from_packed_rows(self):
        directory = tempfile.mkdtemp(dir=TMP)
        job = os.path.join(directory, "job.yaml")
        with open(job, "w") as f:
            f.write(harness.packed_job_yaml("torch-lm", self.DATA, 1, 1))
        want = harness.planned_packed_digests(MESHLOAD, job, self.DATA, self.STEPS)
        sidecar = harness.SidecarProcess(SIDECAR, job, 0, os.path.join(directory, "s.sock"),
                                         os.path.join(directory, "sidecar.log")).start()
        torch.manual_seed(0)
        vocab, width, length = 64, 64, 64
        embed, pos = torch.nn.Embedding(vocab, width), torch.nn.Embedding(length, width)
        attn = torch.nn.MultiheadAttention(width, 1, batch_first=True)
        mlp, out = torch.nn.Linear(width, width), torch.nn.Linear(width, vocab)
        params = [p for m in (embed, pos, attn, mlp, out) for p in m.parameters()]
        opt = torch.optim.Adam(params, lr=3e-3)
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
        losses, got = [], []
        try:
            with meshload.Client(sidecar.sock) as client:
                for _ in range(self.STEPS):
                    batch = client.next()
                    fields = {name: torch.from_dlpack(batch.field(name)[0]) for name in batch.fields}
                    tokens = fields["tokens"].to(torch.int64)
                    segments, positions = fields["segment_ids"], fields["positions"]
                    got.append(harness.packed_batch_digest(fields["tokens"].numpy(), segments.numpy(),
                                                           positions.numpy()))
                    # Attention stays inside a document and off padding;
                    # a padding query attends to itself alone (no empty row).
                    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
                    allowed = (causal[None] & same) | torch.eye(length, dtype=torch.bool)[None]
                    x = embed(tokens) + pos(positions.to(torch.int64))
                    a, _ = attn(x, x, x, attn_mask=~allowed, need_weights=False)
                    x = x + a
                    x = x + torch.relu(mlp(x))
                    logits = out(x)[:, :-1]
                    valid = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
                    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1),
                                                            reduction="none").reshape(valid.shape)
                    loss = (nll * valid).sum() / valid.sum().clamp(min=1)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                    del fields, tokens, segments, positions, batch
        finally:
            gc.collect()
            sidecar.stop()
        self.assertEqual(got, want, "the batches are not the planner's rows")
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print("loss: first 20 steps %.3f, last 20 steps %.3f" % (first, last))
        self.assertLess(last, 0.5 * first, losses)


class DDPExampleTest(unittest.TestCase):
    def test_two_ranks(self):
        d = tempfile.mkdtemp(dir=TMP)
        data = harness.write_dataset(os.path.join(d, "data.bin"), N_RECORDS)
        job = os.path.join(d, "job.yaml")
        with open(job, "w") as f:
            f.write(harness.job_yaml("torch-ddp", data, 2, 1, [("data", 2)]))
        plan = harness.planned_global_batches(MESHLOAD, job, STEPS)
        want = [int(ROWS[plan[s]].view(np.uint8).sum(dtype=np.int64)) for s in range(STEPS)]
        sidecars = [harness.SidecarProcess(SIDECAR, job, p, os.path.join(d, "s%d.sock" % p),
                                           os.path.join(d, "sidecar%d.log" % p)).start() for p in range(2)]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            example = os.path.join(ROOT, "examples", "python", "torch_ddp_trainer.py")
            procs = []
            for rank in range(2):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), MESHLOAD_SOCKET=sidecars[rank].sock)
                procs.append(subprocess.Popen([sys.executable, example, "--steps", str(STEPS)], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              preexec_fn=harness.die_with_parent))
            outs = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                self.assertEqual(p.returncode, 0, err[-3000:])
                outs.append(out)
        finally:
            for s in sidecars:
                s.stop()
        steps = harness.json_objects(outs[0])
        self.assertEqual([r["step"] for r in steps], list(range(STEPS)))
        self.assertEqual([r["batch_sum"] for r in steps], want)
        self.assertTrue(all(np.isfinite(r["loss"]) for r in steps))
        self.assertEqual(outs[1].strip(), "")  # rank 1 prints nothing


class JpegExampleTest(unittest.TestCase):
    """The JPEG example trainer (examples/python/torch_jpeg_trainer.py) on
    WebDataset shards webdataset's TarWriter wrote (JPEGs encoded by
    torchvision, the class as text; indexed by `meshload index`): each
    step's labels and decoded pixels are those of the planner's samples,
    decoded here by torchvision from the same files, and the loss is finite."""

    def test_the_example_decodes_the_planned_jpegs_and_trains(self):
        import webdataset
        from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

        d = tempfile.mkdtemp(dir=TMP)
        rng = np.random.default_rng(36)
        files, labels = [], []
        with webdataset.TarWriter(os.path.join(d, "train-000000.tar")) as w:
            for i in range(40):
                h, wd = (int(x) for x in rng.integers(8, 48, size=2))
                img = torch.from_numpy(rng.integers(0, 256, size=(3, h, wd), dtype=np.uint8))
                jpg = encode_jpeg(img, quality=90).numpy().tobytes()
                files.append(jpg)
                labels.append(int(rng.integers(0, 1000)))
                w.write({"__key__": "%06d" % i, "jpg": jpg, "cls": str(labels[-1]).encode()})
        subprocess.run([MESHLOAD, "index", os.path.join(d, "train-000000.tar")], check=True, capture_output=True)
        job = os.path.join(d, "job.yaml")
        with open(job, "w") as f:
            f.write(harness.job_yaml("torch-jpeg", os.path.join(d, "train-{000000..000000}.tar"), 1, 1, [("data", 1)],
                                     dataset_format="WebDataset", fields=[("jpg", None), ("cls", "int64")]))
        steps = 8  # 40 images, 8 a step: into the second epoch
        plan = harness.planned_global_batches(MESHLOAD, job, steps)
        sidecar = harness.SidecarProcess(SIDECAR, job, 0, os.path.join(d, "s.sock"),
                                         os.path.join(d, "sidecar.log")).start()
        try:
            example = os.path.join(ROOT, "examples", "python", "torch_jpeg_trainer.py")
            p = subprocess.run([sys.executable, example, "--socket", sidecar.sock, "--steps", str(steps)],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        finally:
            sidecar.stop()
        rows = harness.json_objects(p.stdout)
        self.assertEqual([r["step"] for r in rows], list(range(steps)))
        for r in rows:
            ids = plan[r["step"]]
            self.assertEqual(r["images"], len(ids))
            self.assertEqual(r["label_sum"], sum(labels[i] for i in ids), "step %d" % r["step"])
            want = sum(int(decode_jpeg(torch.frombuffer(bytearray(files[i]), dtype=torch.uint8),
                                       mode=ImageReadMode.RGB).to(torch.int64).sum()) for i in ids)
            self.assertEqual(r["pixel_sum"], want, "step %d" % r["step"])
            self.assertTrue(np.isfinite(r["loss"]))
            self.assertEqual(r["decoded_on"], "cpu")


def main():
    return harness.run_unittests(globals(), __doc__, "mltorch-", banner="torch %s, meshload %s from %s" % (
        torch.__version__, meshload.__version__, meshload.__file__))


if __name__ == "__main__":
    sys.exit(main())
