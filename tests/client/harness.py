"""Test harness for the Python client's end-to-end tests: real sidecar
processes, self-describing datasets, and the planner's answer to compare with.

Only the standard library and numpy.

Dataset: record i (RECORD_BYTES = 256 bytes) is 32 little-endian uint64
words, word 0 = i and word k = i * 1000003 + k, so every delivered byte can be
checked against the sample it claims to be.
"""

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

RECORD_BYTES = 256
WORDS = RECORD_BYTES // 8
MASK = 0xFFFFFFFFFFFFFFFF


def records(n):
    """The dataset's n records as an (n, 32) uint64 array."""
    i = np.arange(n, dtype=np.uint64)[:, None]
    k = np.arange(WORDS, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        out = i * np.uint64(1000003) + k
    out[:, 0] = i[:, 0]
    return out.astype("<u8")


def write_dataset(path, n):
    records(n).tofile(path)
    return path


def job_yaml(name, data, processes, devices_per_process, axes, batch_axes=None, global_batch=8,
             prefetch=3, seed=7, replication=None, strategy="PerProcess", dataset_format="FixedRecord",
             fields=None, missing_field=None, balance_tolerance=None, mixture=None, compression=None):
    """A DataLoadJob over `data`: FixedRecord records of RECORD_BYTES, or
    another format whose files say their samples' sizes (MegatronIndexed),
    or whose samples are records of `fields` ([(name, dtype or None)]:
    WebDataset, MDS). With `balance_tolerance`, token-balanced shards. With
    `mixture` ([(name, uri, weight, [(step, weight)])]), several datasets
    under `data` mixed by weight."""
    lines = [
        "apiVersion: meshload.io/v1alpha1",
        "kind: DataLoadJob",
        "metadata:",
        "  name: %s" % name,
        "spec:",
        "  mesh:",
        "    processes: %d" % processes,
        "    devicesPerProcess: %d" % devices_per_process,
        "    axes:",
    ]
    lines += ["      - {name: %s, size: %d}" % a for a in axes]
    if batch_axes is not None:
        lines.append("    batchAxes: [%s]" % ", ".join(batch_axes))
    if replication:
        lines += ["  replication:", "    mode: %s" % replication]
    lines += [
        "  strategy: %s" % strategy,
        "  dataset:",
        "    uri: %s" % data,
        "    format: %s" % dataset_format,
    ]
    if dataset_format == "FixedRecord":
        lines.append("    recordBytes: %d" % RECORD_BYTES)
    if fields:
        lines.append("    fields:")
        # (name, dtype or None[, shape]): a shape makes a TFRecord list dense.
        lines += ["      - {name: %s%s%s}" % (f[0], ", dtype: %s" % f[1] if f[1] else "",
                                             ", shape: %s" % list(f[2]) if len(f) > 2 else "") for f in fields]
    if missing_field:
        lines.append("    missingField: %s" % missing_field)
    if compression:
        lines.append("    compression: %s" % compression)
    if mixture:
        lines += ["  mixture:", "    datasets:"]
        for name, uri, weight, schedule in mixture:
            entry = "      - {name: %s, uri: %s, weight: %g" % (name, uri, weight)
            if schedule:
                entry += ", schedule: [%s]" % ", ".join("{step: %d, weight: %g}" % s for s in schedule)
            lines.append(entry + "}")
    lines += [
        "  batch:",
        "    globalBatchSize: %d" % global_batch,
        "    prefetch: %d" % prefetch,
    ]
    if balance_tolerance is not None:
        lines.append("    balance: {mode: Tokens, tolerance: %g}" % balance_tolerance)
    lines += [
        "  shuffle:",
        "    mode: Global",
        "    seed: %d" % seed,
        "",
    ]
    return "\n".join(lines)


def packed_job_yaml(name, data, processes, devices, resume=0, length=64):
    """A MegatronIndexed job over `data` whose samples are packed rows of
    `length` tokens (spec.tokens Pack, BestFit, 0 the end-of-document and
    padding token), batch 8, one data axis; with `resume`, spec.resume.step."""
    yaml = job_yaml(name, data, processes, devices, [("data", processes * devices)],
                    dataset_format="MegatronIndexed", prefetch=4)
    yaml += ("  tokens: {mode: Pack, sequenceLength: %d, endOfDocument: {token: 0, append: Always},"
             " padToken: 0, packing: BestFit, window: 64}\n" % length)
    if resume:
        yaml += "  resume: {step: %d}\n" % resume
    return yaml


def packed_batch_digest(tokens, segment_ids, positions):
    """SHA-256 of a global batch of packed rows (numpy arrays), as the
    trainers of the tests hash what they received."""
    digest = hashlib.sha256()
    for name, whole in (("tokens", tokens), ("segment_ids", segment_ids), ("positions", positions)):
        digest.update(name.encode() + str(whole.dtype).encode() + str(whole.shape).encode())
        digest.update(whole.tobytes())
    return digest.hexdigest()


def planned_packed_digests(meshload, job_path, data, steps, length=64):
    """Each step's global batch of packed rows rebuilt from `meshload plan`'s
    rows (their document pieces) and the documents as Megatron's reader
    returns them (DATA.expected.json), hashed by packed_batch_digest."""
    out = subprocess.run([meshload, "plan", "-f", job_path, "--steps", "0:%d" % steps, "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    with open(data + ".expected.json") as f:
        documents = json.load(f)["sequences"]
    batches = planned_global_batches(meshload, job_path, steps)
    digests = []
    for step in json.loads(out)["steps"]:
        pieces = {r["row"]: r["pieces"] for r in step["rows"]}
        rows = batches[step["step"]]
        tokens = np.zeros((len(rows), length), np.uint16)
        segments = np.zeros((len(rows), length), np.int32)
        positions = np.zeros((len(rows), length), np.int32)
        for i, row in enumerate(rows):
            at = 0
            for j, p in enumerate(pieces[row]):
                doc = documents[p["document"]][p["offset"]:p["offset"] + p["tokens"]] + ([0] if p["eod"] else [])
                tokens[i, at:at + len(doc)] = doc
                segments[i, at:at + len(doc)] = j + 1
                positions[i, at:at + len(doc)] = np.arange(len(doc))
                at += len(doc)
        digests.append(packed_batch_digest(tokens, segments, positions))
    return digests


def planned_global_batches(meshload, job_path, steps):
    """{step: [sample ids of the global batch, shard 0 first]} from `meshload plan`."""
    out = subprocess.run([meshload, "plan", "-f", job_path, "--steps", "0:%d" % steps, "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    plan = json.loads(out)
    batches = {}
    for step in plan["steps"]:
        by_shard = {}
        for d in step["devices"]:
            by_shard.setdefault(d["shard"], d["samples"])
        batches[step["step"]] = [i for s in sorted(by_shard) for i in by_shard[s]]
    return batches


def die_with_parent():
    """In the forked child: SIGKILL when the test process dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class SidecarProcess:
    """One meshload-sidecar serving `process` of `job` on `sock`."""

    def __init__(self, binary, job, process, sock, log_path, extra=()):
        self.binary, self.job, self.process, self.sock = binary, job, process, sock
        self.log_path = log_path
        self.extra = list(extra)
        self.proc = None

    def start(self, timeout=20.0):
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--job", self.job, "--process", str(self.process), "--socket", self.sock,
                 "--staging", "host", "--metrics-port", "0", "--metrics-address", "127.0.0.1"] + self.extra,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.sock) and '"sidecar started"' in self.log_text():
                return self
            if self.proc.poll() is not None:
                raise AssertionError("meshload-sidecar exited with %d:\n%s" % (self.proc.returncode, self.log_text()))
            time.sleep(0.01)
        raise AssertionError("meshload-sidecar did not start in %.0f s:\n%s" % (timeout, self.log_text()))

    def log_text(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def http_get(self, path):
        """GET `path` (/metrics, /progress) from the sidecar's metrics port, as text."""
        import re
        import urllib.request
        port = re.search(r'"metrics_port":(\d+)', self.log_text())
        assert port, "the sidecar logged no metrics port:\n" + self.log_text()
        with urllib.request.urlopen("http://127.0.0.1:%s%s" % (port.group(1), path), timeout=10) as r:
            return r.read().decode()

    def stop(self):
        stop_process(self.proc)


class SidecarGroup:
    """A mixin for a scenario with a list `self.sidecars` (SidecarProcess):
    a context manager that starts them all and stops them all."""

    def __enter__(self):
        for s in self.sidecars:
            s.start()
        return self

    def __exit__(self, *exc):
        for s in self.sidecars:
            s.stop()


def read_json_files(paths):
    """The JSON object in each file, in order."""
    out = []
    for path in paths:
        with open(path) as f:
            out.append(json.load(f))
    return out


def write_json_atomically(path, obj):
    """Writes `obj` as JSON to `path` whole or not at all (a temporary file, then a rename)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def stop_process(proc):
    """SIGTERM, and SIGKILL when it has not exited after 10 s."""
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def summary(result):
    """The `N passed, N failed` line of a unittest result; skips are not passes."""
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - failed - len(result.skipped)
    skipped = ", %d skipped" % len(result.skipped) if result.skipped else ""
    return "%d passed, %d failed%s" % (passed, failed, skipped)


def json_objects(text):
    """The JSON objects in `text`, wherever they start: other output may
    share their lines (Gloo, under JAX and torch.distributed, prints to
    stdout from its own threads)."""
    decoder, objects, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            obj, end = decoder.raw_decode(text, at)
            objects.append(obj)
            at = text.find("{", end)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
    return objects


def run_unittests(caller_globals, doc, tmp_prefix, banner=None):
    """main() of the tests that take --sidecar and --meshload: sets the
    caller's SIDECAR, MESHLOAD and TMP (a fresh directory, kept with --keep
    or when a test fails), runs its tests, prints the summary line; returns
    the exit code (1 when a test failed or none ran)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--meshload", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args, rest = ap.parse_known_args()
    tmp = tempfile.mkdtemp(prefix=tmp_prefix)
    caller_globals.update(SIDECAR=os.path.abspath(args.sidecar), MESHLOAD=os.path.abspath(args.meshload), TMP=tmp)
    if banner:
        print(banner)
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    print(summary(program.result))
    if program.result.wasSuccessful() and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("logs and data kept in " + tmp)
    return 0 if program.result.wasSuccessful() and program.result.testsRun > 0 else 1
