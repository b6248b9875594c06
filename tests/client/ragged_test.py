#!/usr/bin/env python3
"""Variable-size samples end to end: Megatron indexed datasets written by
megatron-core's own IndexedDatasetBuilder (tests/formats/data/megatron/,
with what Megatron's IndexedDataset returned for every sequence in
*.expected.json), served by real sidecars to meshload.Ragged batches.

    PYTHONPATH=<build>/client/python .venv/bin/python ragged_test.py \\
        --sidecar <build>/sidecar/meshload-sidecar --meshload <build>/tools/meshload

For every step of two epochs, every device's Ragged holds exactly the
planned samples (`meshload plan`), each equal to Megatron's own reading of
it; `to_list()` views the slot without a copy and `padded()` pads or cuts.
A run resized from 4 processes to 8 and resumed mid-epoch gets the same
global batches. CTest runs this as `python.ragged`.
"""

import json
import os
import subprocess
import sys
import time
import unittest

import numpy as np

import harness
import meshload

SIDECAR = MESHLOAD = None
TMP = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEGATRON = os.path.join(ROOT, "tests", "formats", "data", "megatron")


def expected(prefix):
    with open(os.path.join(MEGATRON, prefix + ".expected.json")) as f:
        e = json.load(f)
    return [np.asarray(s, dtype=e["dtype"]) for s in e["sequences"]], e["dtype"]


def planned_devices(job, first, last):
    """{step: {global device: [sample ids]}} from `meshload plan`."""
    out = subprocess.run([MESHLOAD, "plan", "-f", job, "--steps", "%d:%d" % (first, last), "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    plan = json.loads(out)
    return {s["step"]: {d["device"]: d["samples"] for d in s["devices"]} for s in plan["steps"]}, plan


class Run(harness.SidecarGroup):
    """A MegatronIndexed job over fixture `prefix` and a sidecar per process."""

    def __init__(self, name, prefix, processes, devices_per_process, axes, batch_axes=None, replication=None,
                 global_batch=8, balance_tolerance=None, mixture=None):
        self.dir = os.path.join(TMP, name)
        os.makedirs(self.dir)
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(harness.job_yaml(name, os.path.join(MEGATRON, prefix), processes, devices_per_process, axes,
                                     batch_axes, replication=replication, dataset_format="MegatronIndexed",
                                     global_batch=global_batch, balance_tolerance=balance_tolerance,
                                     mixture=mixture))
        self.sidecars = [
            harness.SidecarProcess(SIDECAR, self.job, p, os.path.join(self.dir, "s%d.sock" % p),
                                   os.path.join(self.dir, "sidecar%d.log" % p))
            for p in range(processes)]

    def batches(self, first, last):
        """{step: {global device: [the samples as arrays]}} read through
        the clients, steps [first, last); also checks every Ragged's shape."""
        out = {}
        clients = [meshload.Client(s.sock, start_step=first) for s in self.sidecars]
        try:
            for step in range(first, last):
                out[step] = {}
                for c in clients:
                    b = c.next(timeout=60)
                    assert b.step == step, (b.step, step)
                    for r in b.tensors:
                        assert isinstance(r, meshload.Ragged), r
                        views = r.to_list()
                        offsets = np.from_dlpack(r.offsets)
                        values = np.from_dlpack(r.values)
                        assert len(views) == r.samples == len(offsets) - 1 == len(r)
                        assert offsets[0] == 0 and offsets[-1] == values.shape[0], (offsets, values.shape)
                        # Views, not copies: each sample's first element is in the slot.
                        for v, a in zip(views, offsets[:-1]):
                            if v.size:
                                assert v.__array_interface__["data"][0] == values.__array_interface__["data"][0] + \
                                    int(a) * values.itemsize
                        out[step][r.global_device] = [v.copy() for v in views]
                    del b
        finally:
            for c in clients:
                c.close()
        return out


class RaggedTest(unittest.TestCase):
    def check_against_megatron(self, run, prefix, first, last):
        sequences, dtype = expected(prefix)
        planned, _ = planned_devices(run.job, first, last)
        got = run.batches(first, last)
        for step in range(first, last):
            self.assertEqual(sorted(got[step]), sorted(planned[step]), "step %d's devices" % step)
            for device, ids in planned[step].items():
                samples = got[step][device]
                self.assertEqual(len(samples), len(ids), "step %d device %d" % (step, device))
                for sample_id, a in zip(ids, samples):
                    self.assertEqual(str(a.dtype), dtype)
                    np.testing.assert_array_equal(a, sequences[sample_id],
                                                  "step %d device %d sample %d" % (step, device, sample_id))
        return got

    def test_two_epochs_of_megatron_sequences_on_four_processes(self):
        for prefix in ("tokens_uint16", "tokens_int32"):
            with self.subTest(prefix=prefix), Run("four-" + prefix.replace("_", "-"), prefix, 4, 1,
                                                   [("data", 4)]) as run:
                _, plan = planned_devices(run.job, 0, 1)
                self.assertIsNone(plan["sampleBytes"])
                self.assertEqual(plan["stepsPerEpoch"], 7)  # 61 sequences, a global batch of 8
                self.check_against_megatron(run, prefix, 0, 14)

    def test_replicas_in_a_process_get_the_same_ragged_batch(self):
        # 2 processes x 2 devices; `model` replicates each shard inside a process.
        with Run("replicas", "tokens_uint16", 2, 2, [("data", 2), ("model", 2)], ["data"], "Partial") as run:
            got = self.check_against_megatron(run, "tokens_uint16", 0, 9)
            for step, devices in got.items():
                for d in (0, 2):
                    for a, b in zip(devices[d], devices[d + 1]):
                        np.testing.assert_array_equal(a, b, "step %d devices %d and %d" % (step, d, d + 1))

    def test_a_resize_from_four_to_eight_processes_resumes_with_the_same_global_batches(self):
        with Run("before", "tokens_uint16", 4, 1, [("data", 4)]) as before:
            first = before.batches(0, 9)
        with Run("after", "tokens_uint16", 8, 1, [("data", 8)]) as after:
            resumed = self.check_against_megatron(after, "tokens_uint16", 9, 14)
        _, plan4 = planned_devices(os.path.join(TMP, "before", "job.yaml"), 0, 14)
        _, plan8 = planned_devices(os.path.join(TMP, "after", "job.yaml"), 0, 14)

        def global_batches(plan):
            return {s["step"]: [i for d in sorted(s["devices"], key=lambda d: d["shard"]) for i in d["samples"]]
                    for s in plan["steps"]}

        self.assertEqual(global_batches(plan4), global_batches(plan8))
        self.assertEqual(sorted(first), list(range(9)))
        self.assertEqual(sorted(resumed), list(range(9, 14)))

    def test_token_balanced_shards_hold_the_same_samples_with_even_tokens_before_and_after_a_resize(self):
        # 61 sequences of 2 to 2,000 tokens, a global batch of 16 (3 steps an
        # epoch): dealt by tokens, each step's devices carry nearly the same
        # tokens, from exactly the samples the sampler drew.
        def steps(job, first, last):
            _, plan = planned_devices(job, first, last)
            return {s["step"]: s for s in plan["steps"]}, plan

        with Run("balanced", "tokens_uint16", 4, 1, [("data", 4)], global_batch=16, balance_tolerance=0.02) as run:
            got = self.check_against_megatron(run, "tokens_uint16", 0, 6)
            planned, plan = steps(run.job, 0, 6)
        self.assertEqual(plan["balance"], {"mode": "Tokens", "tolerance": 0.02, "applied": True})
        with Run("sampler-order", "tokens_uint16", 4, 1, [("data", 4)], global_batch=16) as plain:
            plain_planned, plain_plan = steps(plain.job, 0, 6)
        self.assertNotIn("balance", plain_plan)
        improved = 0
        for step in range(6):
            tokens = [sum(len(a) for a in got[step][d]) for d in range(4)]
            shard_tokens = planned[step]["shardTokens"]
            self.assertEqual((min(tokens), max(tokens)), (shard_tokens["after"]["min"], shard_tokens["after"]["max"]))
            # The sampler's order, as the unbalanced job deals it.
            plain_tokens = [sum(len(expected("tokens_uint16")[0][i]) for i in plain_planned[step]["devices"][d]["samples"])
                            for d in range(4)]
            self.assertEqual((min(plain_tokens), max(plain_tokens)),
                             (shard_tokens["before"]["min"], shard_tokens["before"]["max"]))
            self.assertLessEqual(max(tokens) - min(tokens), max(plain_tokens) - min(plain_tokens))
            improved += max(tokens) - min(tokens) < max(plain_tokens) - min(plain_tokens)
            self.assertEqual(sorted(i for d in planned[step]["devices"] for i in d["samples"]),
                             sorted(i for d in plain_planned[step]["devices"] for i in d["samples"]), "step %d" % step)
        self.assertGreater(improved, 0, "the sampler's order was even already: the test proves nothing")
        # Resized to 2 processes and resumed at step 4: the same samples each step.
        with Run("balanced-resized", "tokens_uint16", 2, 1, [("data", 2)], global_batch=16,
                 balance_tolerance=0.02) as resized:
            self.check_against_megatron(resized, "tokens_uint16", 4, 6)
            resized_planned, _ = steps(resized.job, 4, 6)
        for step in (4, 5):
            self.assertEqual(sorted(i for d in resized_planned[step]["devices"] for i in d["samples"]),
                             sorted(i for d in planned[step]["devices"] for i in d["samples"]), "step %d" % step)

    def test_a_mixture_of_two_corpora_follows_its_weights_and_schedule_and_resumes_resized(self):
        # tokens_uint16 (61 sequences) and code_uint16 (a corpus of other
        # documents), 3:1 until step 4, then 3:3; every sample is the one
        # Megatron reads from its own corpus, in every step's planned counts.
        mixture = [("web", "tokens_uint16", 3, []), ("code", "code_uint16", 1, [(4, 3)])]
        web, dtype = expected("tokens_uint16")
        code, _ = expected("code_uint16")

        def check(run, first, last):
            planned, plan = planned_devices(run.job, first, last)
            self.assertEqual([(m["name"], m["firstSample"]) for m in plan["mixture"]], [("web", 0), ("code", 61)])
            steps = {s["step"]: s for s in plan["steps"]}
            got = run.batches(first, last)
            for step in range(first, last):
                counts = {d["name"]: d["samples"] for d in steps[step]["datasets"]}
                self.assertEqual(counts, {"web": 12, "code": 4} if step < 4 else {"web": 8, "code": 8}, step)
                ids = [i for d in sorted(planned[step]) for i in planned[step][d]]
                self.assertEqual(sum(i >= 61 for i in ids), counts["code"], "step %d" % step)
                for device, samples in planned[step].items():
                    for sample_id, a in zip(samples, got[step][device]):
                        want = web[sample_id] if sample_id < 61 else code[sample_id - 61]
                        self.assertEqual(str(a.dtype), dtype)
                        np.testing.assert_array_equal(a, want, "step %d device %d sample %d" % (step, device, sample_id))
            return {step: sorted(i for d in planned[step] for i in planned[step][d]) for step in range(first, last)}

        with Run("mixture", "", 2, 1, [("data", 2)], global_batch=16, mixture=mixture) as run:
            before = check(run, 0, 8)
            # Per dataset: the sidecars' counters add up to every consumed
            # sample once and its tokens; /progress says what the job took.
            lengths = {i: len(web[i]) if i < 61 else len(code[i - 61]) for s in before.values() for i in s}
            want = {"web": [0, 0], "code": [0, 0]}
            for ids in before.values():
                for i in ids:
                    want["web" if i < 61 else "code"][0] += 1
                    want["web" if i < 61 else "code"][1] += lengths[i]
            deadline = time.monotonic() + 10
            while True:
                progress = [json.loads(s.http_get("/progress")) for s in run.sidecars]
                if all(p["consumedStep"] == 7 for p in progress) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            got = {"web": [0, 0], "code": [0, 0]}
            for s in run.sidecars:
                for line in s.http_get("/metrics").splitlines():
                    for name, k in (("meshload_dataset_samples_total", 0), ("meshload_dataset_tokens_total", 1)):
                        for d in got:
                            if line.startswith('%s{dataset="%s"} ' % (name, d)):
                                got[d][k] += int(float(line.split()[-1]))
            self.assertEqual(got, want)
            for p in progress:
                self.assertEqual(p["consumedStep"], 7)
                self.assertEqual([(d["name"], d["samplesConsumed"]) for d in p["datasets"]],
                                 [("web", want["web"][0]), ("code", want["code"][0])])
                self.assertEqual([d["weight"] for d in p["datasets"]], [0.5, 0.5])
        with Run("mixture-resized", "", 4, 1, [("data", 4)], global_batch=16, mixture=mixture) as run:
            after = check(run, 5, 8)
        for step in range(5, 8):
            self.assertEqual(after[step], before[step], "step %d" % step)

    def test_padded_pads_or_cuts_each_sample_and_says_how_long_it_is(self):
        with Run("padded", "tokens_uint16", 1, 1, [("data", 1)]) as run:
            c = meshload.Client(run.sidecars[0].sock)
            try:
                b = c.next(timeout=60)
                r = b.tensors[0]
                views = r.to_list()
                lengths = [len(v) for v in views]
                x, kept = r.padded()
                self.assertEqual(x.shape, (r.samples, max(lengths)))
                self.assertEqual(kept.tolist(), lengths)
                for k, v in enumerate(views):
                    np.testing.assert_array_equal(x[k, :len(v)], v)
                    self.assertTrue(np.all(x[k, len(v):] == 0))
                x, kept = r.padded(3, pad_value=7)
                self.assertEqual(x.shape, (r.samples, 3))
                self.assertEqual(kept.tolist(), [min(n, 3) for n in lengths])
                for k, v in enumerate(views):
                    np.testing.assert_array_equal(x[k, :min(len(v), 3)], v[:3])
                    self.assertTrue(np.all(x[k, len(v):] == 7))
                with self.assertRaises(ValueError):
                    r.padded(-1)
                self.assertIn("meshload.Ragged", repr(r))
                del b, r, views, x
            finally:
                c.close()


def main():
    return harness.run_unittests(globals(), __doc__, "mlragged-")


if __name__ == "__main__":
    sys.exit(main())
