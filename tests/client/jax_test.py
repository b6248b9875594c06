#!/usr/bin/env python3
"""meshload.jax with JAX from PyPI on the CPU, against real sidecars.

    PYTHONPATH=<build>/client/python .venv/bin/python jax_test.py \
        --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

Each scenario starts one sidecar per job process and one JAX process
(tests/client/jax_worker.py) per sidecar; multi-process scenarios join the
JAX processes with jax.distributed.initialize on loopback. Every worker
checks, at every step, in jitted functions, that the global jax.Array equals
the planner's global batch (`meshload plan`) and that replicas hold identical
data, and that JAX holds the staged slots without a copy. CTest runs this as
`python.jax` (tests/client/CMakeLists.txt).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import unittest

import numpy as np

import harness

SIDECAR = MESHLOAD = None
TMP = None
N_RECORDS = 96  # 12 steps per epoch at a global batch of 8
STEPS = 14  # into the second epoch
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scenario(harness.SidecarGroup):
    """A job, its sidecars and the planner's global batches."""

    def __init__(self, name, processes, devices_per_process, axes, batch_axes=None, replication=None,
                 sidecar_processes=None):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        data = harness.write_dataset(os.path.join(self.dir, "data.bin"), N_RECORDS)
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(harness.job_yaml(name, data, processes, devices_per_process, axes, batch_axes,
                                     replication=replication))
        plan = harness.planned_global_batches(MESHLOAD, self.job, STEPS)
        rows = harness.records(N_RECORDS)
        self.expected = os.path.join(self.dir, "expected.npy")
        np.save(self.expected, np.stack([rows[plan[s]] for s in range(STEPS)]))
        # Which meshload process each sidecar serves (default: one each).
        self.sidecar_processes = sidecar_processes or list(range(processes))
        self.sidecars = [
            harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(self.dir, "s%d.sock" % i),
                                   os.path.join(self.dir, "sidecar%d.log" % i))
            for i, p in enumerate(self.sidecar_processes)]

    def run(self, cpu_devices, distributed=None, user_mesh="none", steps=STEPS):
        """Runs one worker per sidecar; returns their reports."""
        self.runs = getattr(self, "runs", 0) + 1
        report = [os.path.join(self.dir, "report-%d-%d.json" % (self.runs, i)) for i in range(len(self.sidecars))]
        self.run_each(
            lambda i, s: [WORKER, "--socket", s.sock, "--cpu-devices", str(cpu_devices), "--steps", str(steps),
                          "--expected", self.expected, "--user-mesh", user_mesh, "--report", report[i]],
            distributed, report)
        return harness.read_json_files(report)

    def run_each(self, argv_of, distributed, reports=None):
        """Runs `python argv_of(i, sidecar)` per sidecar, joined by
        jax.distributed when `distributed`; returns the JSON objects each
        printed. The objects are found wherever they are on a line: JAX's
        Gloo collectives print to stdout from their own threads, on the
        same lines. With `reports` (files the processes write), a process
        must write its file instead of printing."""
        coordinator = "127.0.0.1:%d" % free_port() if distributed else None
        procs = []
        for i, s in enumerate(self.sidecars):
            argv = [sys.executable] + argv_of(i, s)
            if coordinator:
                argv += ["--coordinator", coordinator, "--num-processes", str(len(self.sidecars)),
                         "--process-id", str(i)]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=harness.die_with_parent))
        outputs = []
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=240)
            objects = harness.json_objects(out)
            wrote = os.path.exists(reports[i]) if reports else bool(objects)
            if p.returncode != 0 or not wrote:
                raise AssertionError("%s exited with %d:\n%s\n%s" % (p.args[1], p.returncode, out, err[-4000:]))
            outputs.append(objects)
        return outputs


class GlobalArrayTest(unittest.TestCase):
    def assert_all_ok(self, reports, devices_per_process, replicas):
        for i, r in enumerate(reports):
            self.assertTrue(r["ok"], "worker %d: %s" % (i, r))
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["zero_copy"], STEPS * devices_per_process)
            self.assertEqual(r["replica_checks"], STEPS if replicas else 0)
            self.assertTrue(r["from_dlpack_zero_copy"], r)

    def test_one_process_four_cpu_devices(self):
        with Scenario("one-process", 1, 4, [("data", 4)]) as sc:
            reports = sc.run(cpu_devices=4)
        self.assert_all_ok(reports, 4, replicas=False)
        self.assertEqual(reports[0]["global_shape"], [8, harness.RECORD_BYTES])

    def test_one_process_with_a_model_axis(self):
        with Scenario("one-process-tp", 1, 4, [("data", 2), ("model", 2)], ["data"], "Partial") as sc:
            reports = sc.run(cpu_devices=4)
        self.assert_all_ok(reports, 4, replicas=True)

    def test_two_processes_data_parallel(self):
        with Scenario("dp", 2, 2, [("data", 4)]) as sc:
            reports = sc.run(cpu_devices=2, distributed=True)
        self.assert_all_ok(reports, 2, replicas=False)

    def test_two_processes_hybrid_with_replicas_across_processes(self):
        # model is the slow axis: process 0 holds model 0, process 1 model 1,
        # so every shard's replicas live in different processes.
        with Scenario("hybrid", 2, 2, [("model", 2), ("data", 2)], ["data"], "Partial") as sc:
            reports = sc.run(cpu_devices=2, distributed=True)
            self.assert_all_ok(reports, 2, replicas=True)
            # The caller's own mesh works when it is the job's.
            self.assert_all_ok(sc.run(cpu_devices=2, distributed=True, user_mesh="job", steps=STEPS), 2, True)


class RaggedScenario(Scenario):
    """A MegatronIndexed job over a dataset megatron-core wrote
    (tests/formats/data/megatron/tokens_uint16), its sidecars, and the
    planner's global batches padded to PAD_TO with their lengths."""

    PAD_TO = 48

    def __init__(self, name, processes, devices_per_process, axes):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        prefix = os.path.join(ROOT, "tests", "formats", "data", "megatron", "tokens_uint16")
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(harness.job_yaml(name, prefix, processes, devices_per_process, axes,
                                     dataset_format="MegatronIndexed"))
        with open(prefix + ".expected.json") as f:
            sequences = json.load(f)["sequences"]
        plan = harness.planned_global_batches(MESHLOAD, self.job, STEPS)
        values = np.zeros((STEPS, 8, self.PAD_TO), dtype=np.uint16)
        lengths = np.zeros((STEPS, 8), dtype=np.int64)
        for step in range(STEPS):
            for row, sample in enumerate(plan[step]):
                kept = sequences[sample][:self.PAD_TO]
                values[step, row, :len(kept)] = kept
                lengths[step, row] = len(kept)
        self.expected = os.path.join(self.dir, "expected.npz")
        np.savez(self.expected, values=values, lengths=lengths)
        self.sidecar_processes = list(range(processes))
        self.sidecars = [
            harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(self.dir, "s%d.sock" % p),
                                   os.path.join(self.dir, "sidecar%d.log" % p))
            for p in self.sidecar_processes]

    def run_ragged(self, cpu_devices, distributed=None):
        report = [os.path.join(self.dir, "report-%d.json" % i) for i in range(len(self.sidecars))]
        self.run_each(
            lambda i, s: [WORKER, "--socket", s.sock, "--cpu-devices", str(cpu_devices), "--steps", str(STEPS),
                          "--expected", self.expected, "--pad-to", str(self.PAD_TO), "--report", report[i]],
            distributed, report)
        return harness.read_json_files(report)


class RaggedTest(unittest.TestCase):
    def test_padded_global_arrays_of_megatron_sequences_in_two_processes(self):
        with RaggedScenario("ragged", 2, 2, [("data", 4)]) as sc:
            reports = sc.run_ragged(cpu_devices=2, distributed=True)
        for i, r in enumerate(reports):
            self.assertTrue(r["ok"], "worker %d: %s" % (i, r))
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["global_shape"], [8, RaggedScenario.PAD_TO])


class FieldsScenario(RaggedScenario):
    """A WebDataset job over the shards webdataset's TarWriter wrote
    (tests/formats/data/webdataset/, indexed by Energon's prepare): the
    encoded images (ragged, padded to PAD_TO bytes) and the classes (int64),
    the planner's global batches of both as webdataset read them."""

    def __init__(self, name, processes, devices_per_process, axes):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        samples = []
        for shard in ("shard-000000", "shard-000001"):
            src = os.path.join(ROOT, "tests", "formats", "data", "webdataset", shard)
            for ext in (".tar", ".tar.idx"):
                shutil.copy(src + ext, self.dir)
            with open(src + ".expected.json") as f:
                samples += json.load(f)["samples"]
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(harness.job_yaml(name, os.path.join(self.dir, "shard-{000000..000001}.tar"), processes,
                                     devices_per_process, axes, dataset_format="WebDataset",
                                     fields=[("jpg", None), ("cls", "int64")]))
        plan = harness.planned_global_batches(MESHLOAD, self.job, STEPS)
        values = np.zeros((STEPS, 8, self.PAD_TO), dtype=np.uint8)
        lengths = np.zeros((STEPS, 8), dtype=np.int64)
        classes = np.zeros((STEPS, 8), dtype=np.int64)
        for step in range(STEPS):
            for row, sample in enumerate(plan[step]):
                jpg = bytes.fromhex(samples[sample]["fields"]["jpg"])[:self.PAD_TO]
                values[step, row, :len(jpg)] = np.frombuffer(jpg, np.uint8)
                lengths[step, row] = len(jpg)
                classes[step, row] = int(bytes.fromhex(samples[sample]["fields"]["cls"]).decode())
        self.expected = os.path.join(self.dir, "expected.npz")
        np.savez(self.expected, **{"jpg.values": values, "jpg.lengths": lengths, "cls": classes})
        self.sidecar_processes = list(range(processes))
        self.sidecars = [
            harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(self.dir, "s%d.sock" % p),
                                   os.path.join(self.dir, "sidecar%d.log" % p))
            for p in self.sidecar_processes]


class FieldsTest(unittest.TestCase):
    def test_a_dict_of_global_arrays_of_webdataset_fields_in_two_processes(self):
        with FieldsScenario("fields", 2, 2, [("data", 4)]) as sc:
            reports = sc.run_ragged(cpu_devices=2, distributed=True)
        for i, r in enumerate(reports):
            self.assertTrue(r["ok"], "worker %d: %s" % (i, r))
            self.assertEqual(r["steps"], STEPS)
            self.assertEqual(r["field_shapes"], {"jpg": [8, RaggedScenario.PAD_TO], "cls": [8]})


class ExampleTest(unittest.TestCase):
    def test_the_jax_example_trainer_in_two_processes(self):
        example = os.path.join(ROOT, "examples", "python", "jax_trainer.py")
        with Scenario("example", 2, 2, [("data", 2), ("model", 2)], ["data"], "Partial") as sc:
            outputs = sc.run_each(lambda i, s: [example, "--socket", s.sock, "--cpu-devices", "2",
                                                "--steps", str(STEPS)], distributed=True)
            expected = np.load(sc.expected).view(np.uint8)
        want = [int(expected[s].sum(dtype=np.int64)) for s in range(STEPS)]
        for i, steps in enumerate(outputs):
            self.assertEqual([r["step"] for r in steps], list(range(STEPS)), "process %d" % i)
            self.assertEqual([r["batch_sum"] for r in steps], want, "process %d" % i)
            self.assertTrue(all(np.isfinite(r["loss"]) for r in steps))


class MismatchTest(unittest.TestCase):
    def assert_error(self, reports, *fragments):
        for i, r in enumerate(reports):
            self.assertFalse(r["ok"], "worker %d: %s" % (i, r))
            self.assertEqual(r["error"], "MeshMismatch", r)
            for fragment in fragments:
                self.assertIn(fragment, r["message"])

    def test_wrong_device_count(self):
        with Scenario("device-count", 1, 2, [("data", 2)]) as sc:
            self.assert_error(sc.run(cpu_devices=3),
                              "job 'device-count' gives each process 2 devices (spec.mesh.devicesPerProcess), "
                              "but JAX has 3 local CPU devices", "jax_num_cpu_devices=2")

    def test_a_multi_process_job_in_one_jax_process(self):
        with Scenario("not-distributed", 2, 2, [("data", 4)], sidecar_processes=[0]) as sc:
            self.assert_error(sc.run(cpu_devices=2),
                              "job 'not-distributed' has 2 processes (spec.mesh.processes), but JAX runs 1",
                              "jax.distributed.initialize")

    def test_two_jax_processes_fed_by_the_same_meshload_process(self):
        with Scenario("same-process", 2, 2, [("data", 4)], sidecar_processes=[0, 0]) as sc:
            self.assert_error(sc.run(cpu_devices=2, distributed=True),
                              "JAX processes 0 and 1 are both fed by the sidecar of meshload process 0")

    def test_a_mesh_with_other_axes(self):
        with Scenario("axes", 1, 4, [("data", 2), ("model", 2)], ["data"], "Partial") as sc:
            self.assert_error(sc.run(cpu_devices=4, user_mesh="axes-swapped"),
                              "the given mesh has axes model=2, data=2, but job 'axes''s mesh is "
                              "(data=2, model=2), batch axes (data)")

    def test_a_mesh_in_another_device_order(self):
        with Scenario("order", 1, 4, [("data", 4)]) as sc:
            self.assert_error(sc.run(cpu_devices=4, user_mesh="devices-reversed"),
                              "the given mesh puts the job's global device 0 on", "build the mesh in the job's "
                              "global device order")


def main():
    return harness.run_unittests(globals(), __doc__, "mljax-")


if __name__ == "__main__":
    sys.exit(main())
