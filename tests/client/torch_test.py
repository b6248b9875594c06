#!/usr/bin/env python3
"""The meshload Python client with PyTorch (CPU), against real sidecars.

    scripts/torch-check            # makes the PyTorch environment, then runs this

or, in an environment with torch and the meshload package installed:

    python torch_test.py --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

torch.from_dlpack on host-staged batches (zero-copy, every byte checked,
lifetime across releases), meshload.interop.torch_tensors, and the
DistributedDataParallel example trainer (examples/python/torch_ddp_trainer.py)
in two processes against two sidecars, its per-step batch sums compared with
the planner's global batches.
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


def main():
    return harness.run_unittests(globals(), __doc__, "mltorch-", banner="torch %s, meshload %s from %s" % (
        torch.__version__, meshload.__version__, meshload.__file__))


if __name__ == "__main__":
    sys.exit(main())
