#!/usr/bin/env python3
"""A tiny causal language model trained in JAX on packed meshload rows, across a resize.

    PYTHONPATH=<build>/client/python .venv/bin/python lm_test.py \
        --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

The data is a Megatron indexed dataset written by megatron-core's
IndexedDatasetBuilder (tests/formats/data/megatron/lm_uint16: 400 documents
that count up modulo 63). The job packs its documents into rows of 64
tokens (spec.tokens Pack, BestFit) with segment ids and positions; the
worker (tests/client/lm_worker.py) trains a one-layer transformer on them
with the attention mask built from the segment ids.

- An uninterrupted run: two JAX processes of two CPU devices each (two
  sidecars), STEPS steps: every step's global batch is the planner's rows
  (`meshload plan`'s pieces filled from Megatron's reading of the
  documents), and the loss falls.
- The same job killed at step RESUME_AT (the sidecars and trainers stop),
  then resumed there (spec.resume.step) on a resized mesh, one JAX process
  of two devices: its input batches are bit-identical (SHA-256 of the
  gathered arrays) to the uninterrupted run's steps from RESUME_AT on.

CTest runs this as `python.lm` (tests/client/CMakeLists.txt).
"""

import os
import socket
import subprocess
import sys
import unittest

import harness

SIDECAR = MESHLOAD = None
TMP = None
STEPS = 200
RESUME_AT = 100
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "formats", "data", "megatron", "lm_uint16")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(name, processes, devices, resume=0):
    path = os.path.join(TMP, name + ".yaml")
    with open(path, "w") as f:
        f.write(harness.packed_job_yaml(name, DATA, processes, devices, resume))
    return path


class Run(harness.SidecarGroup):
    """A job's sidecars and one JAX worker each, joined by jax.distributed."""

    def __init__(self, name, processes, devices, resume=0):
        self.name, self.devices = name, devices
        self.job = job(name, processes, devices, resume)
        self.sidecars = [harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(TMP, "%s-%d.sock" % (name, p)),
                                                os.path.join(TMP, "%s-sidecar%d.log" % (name, p)))
                         for p in range(processes)]

    def train(self, steps):
        n = len(self.sidecars)
        coordinator = "127.0.0.1:%d" % free_port()
        reports = [os.path.join(TMP, "%s-report%d.json" % (self.name, i)) for i in range(n)]
        procs = []
        for i, s in enumerate(self.sidecars):
            argv = [sys.executable, WORKER, "--socket", s.sock, "--steps", str(steps), "--cpu-devices",
                    str(self.devices), "--report", reports[i]]
            if n > 1:
                argv += ["--coordinator", coordinator, "--num-processes", str(n), "--process-id", str(i)]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=harness.die_with_parent))
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=500)
            if not os.path.exists(reports[i]):
                raise AssertionError("worker %d exited with %d and no report:\n%s\n%s" % (i, p.returncode, out,
                                                                                          err[-4000:]))
        return harness.read_json_files(reports)


class PackedTrainingTest(unittest.TestCase):
    def test_a_tiny_model_learns_from_packed_rows_and_a_resized_resume_gets_the_same_batches(self):
        with Run("whole", 2, 2) as run:
            whole = run.train(STEPS)
        for i, r in enumerate(whole):
            self.assertTrue(r["ok"], "worker %d: %s" % (i, r))
            self.assertEqual(r["steps"], list(range(STEPS)))
        # Both processes saw the same global batches, the planner's rows,
        # and the same loss.
        self.assertEqual(whole[0]["digests"], whole[1]["digests"])
        self.assertEqual(whole[0]["digests"], harness.planned_packed_digests(MESHLOAD, job("plan", 2, 2), DATA, STEPS),
                         "the batches are not the planner's rows")
        self.assertEqual(whole[0]["losses"], whole[1]["losses"])
        losses = whole[0]["losses"]
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        print("loss: first 20 steps %.3f, last 20 steps %.3f" % (first, last))
        self.assertLess(last, 0.5 * first, "the loss did not fall: %s" % losses)

        # Killed at RESUME_AT: the first part runs RESUME_AT steps and stops.
        with Run("before", 2, 2) as run:
            before = run.train(RESUME_AT)
            for s in run.sidecars:  # killed, not stopped: nothing of theirs is kept
                s.proc.kill()
                s.proc.wait()
        self.assertEqual(before[0]["digests"], whole[0]["digests"][:RESUME_AT])
        # Resumed there on a resized mesh: one process of two devices.
        with Run("after", 1, 2, resume=RESUME_AT) as run:
            after = run.train(STEPS - RESUME_AT)
        self.assertTrue(after[0]["ok"], after[0])
        self.assertEqual(after[0]["steps"], list(range(RESUME_AT, STEPS)))
        self.assertEqual(after[0]["digests"], whole[0]["digests"][RESUME_AT:],
                         "the resumed run's batches differ from the uninterrupted run's")


def main():
    return harness.run_unittests(globals(), __doc__, "mllm-")


if __name__ == "__main__":
    sys.exit(main())
