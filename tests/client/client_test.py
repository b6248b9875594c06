#!/usr/bin/env python3
"""End-to-end tests of the meshload Python client against the real sidecar.

    PYTHONPATH=<build>/client/python /usr/bin/python3 client_test.py \
        --sidecar <build>/sidecar/meshload-sidecar [unittest args, e.g. -v or a test name]

The sidecar binary may also come from $MESHLOAD_SIDECAR. CTest runs this as
`python.client` (registered in client/python/CMakeLists.txt).

Longer than the ~700-line rule on purpose: one unittest module is what
`pip wheel`'s test (tests/client/package_test.sh) runs against the
installed wheel as well, so every case of the Python API lives here.

The dataset is synthetic and self-describing: record i (256 bytes) is 32
little-endian uint64 words, word 0 = i and word k = i * 1000003 + k, so every
delivered byte can be checked against the sample index it claims to be.
The job shuffles globally, so the step -> samples map is only known to the
planner; tests that need it record a first run and compare later runs.

Only the standard library and numpy (Debian's python3-numpy) are used.
"""

import argparse
import ctypes
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import numpy as np

import harness
import meshload

SIDECAR = None  # set in main()
FAKE_CUDA = None  # the stand-in libcuda (--fake-cuda), for the GPU staging tests
TMP = None  # set in setUpModule()
JOB = None
N_RECORDS = 64
RECORD_BYTES = 256
WORDS = RECORD_BYTES // 8
GLOBAL_BATCH = 8
PER_DEVICE = 4  # global batch over the 2-way data axis
PREFETCH = 3
STEPS_PER_EPOCH = N_RECORDS // GLOBAL_BATCH
MASK = 0xFFFFFFFFFFFFFFFF


def record_words(i):
    return [i] + [(i * 1000003 + k) & MASK for k in range(1, WORDS)]


EXPECTED = np.array([record_words(i) for i in range(N_RECORDS)], dtype="<u8")

JOB_YAML = """\
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata:
  name: pytest-job
spec:
  mesh:
    processes: 1
    devicesPerProcess: 2
    axes:
      - {{name: data, size: 2}}
  strategy: PerProcess
  dataset:
    uri: {data}
    format: FixedRecord
    recordBytes: 256
  batch:
    globalBatchSize: 8
    prefetch: 3
  shuffle:
    mode: Global
    seed: 7
"""


def setUpModule():
    global TMP, JOB
    # Short: a Unix socket path must fit in 108 bytes.
    TMP = tempfile.mkdtemp(prefix="mlpy-")
    EXPECTED.tofile(os.path.join(TMP, "data.bin"))
    JOB = os.path.join(TMP, "job.yaml")
    with open(JOB, "w") as f:
        f.write(JOB_YAML.format(data=os.path.join(TMP, "data.bin")))


# ---- the sidecar process ---------------------------------------------------


class Sidecar:
    """One meshload-sidecar on a socket; start() again after kill() restarts it
    with the same arguments (a new log file each time)."""

    starts = 0

    def __init__(self, name, staging="host"):
        self.sock = os.path.join(TMP, name + ".sock")
        self.name = name
        self.staging = staging
        self.proc = None
        self.log_path = None
        self.metrics_port = None

    def start(self, timeout=20.0):
        Sidecar.starts += 1
        self.log_path = os.path.join(TMP, "%s.%d.log" % (self.name, Sidecar.starts))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [SIDECAR, "--job", JOB, "--process", "0", "--socket", self.sock, "--staging", self.staging,
                 "--metrics-port", "0", "--metrics-address", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                preexec_fn=harness.die_with_parent)
        # "sidecar started" is logged after the socket listens. The socket
        # file alone proves nothing on a restart: a killed sidecar leaves it.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = self.find_log("sidecar started")
            if started and os.path.exists(self.sock):
                self.metrics_port = int(started["metrics_port"])
                return self
            if self.proc.poll() is not None:
                raise AssertionError("meshload-sidecar exited with %d:\n%s"
                                     % (self.proc.returncode, self.log_text()))
            time.sleep(0.01)
        raise AssertionError("meshload-sidecar did not start in %.0f s:\n%s"
                             % (timeout, self.log_text()))

    def log_text(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def log_lines(self):
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a non-JSON line (a usage error)
        return out

    def find_log(self, msg):
        for entry in self.log_lines():
            if entry.get("msg") == msg:
                return entry
        return None

    def kill(self):
        """SIGKILL: no cleanup, the socket file stays behind."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self):
        harness.stop_process(self.proc)

    def metrics(self):
        """{name{labels}: value} from /metrics."""
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values


class PackageDocTest(unittest.TestCase):
    def test_the_package_docstring_names_every_public_member(self):
        # help(meshload) is the reference a trainer author reads first.
        for cls in (meshload.Batch, meshload.Tensor, meshload.JobMesh, meshload.Client, meshload.Ragged):
            missing = [n for n in dir(cls) if not n.startswith("_")
                       and "." + n not in meshload.__doc__ and n + "(" not in meshload.__doc__]
            self.assertEqual(missing, [], "meshload's docstring does not name %s.%s" % (cls.__name__, missing))


class SidecarTest(unittest.TestCase):
    """A fresh sidecar per test (unless a test starts its own)."""

    socket_name = None

    def setUp(self):
        self.sidecar = Sidecar(self.socket_name or self.id().rsplit(".", 1)[-1][:40])
        if self.socket_name is not None:
            self.sidecar.start()

    def tearDown(self):
        gc.collect()
        self.sidecar.stop()


# ---- decoding --------------------------------------------------------------


def decode(testcase, tensor):
    """The sample ids a tensor holds, after checking every byte of it."""
    a = np.from_dlpack(tensor)
    testcase.assertEqual(a.shape, (PER_DEVICE, RECORD_BYTES))
    testcase.assertEqual(a.dtype, np.uint8)
    # Zero-copy: the array views the slot itself.
    testcase.assertEqual(a.ctypes.data, tensor.data_ptr)
    words = a.view("<u8")
    ids = [int(x) for x in words[:, 0]]
    for row, i in enumerate(ids):
        testcase.assertLess(i, N_RECORDS, "row %d claims sample %d" % (row, i))
        np.testing.assert_array_equal(words[row], EXPECTED[i],
                                      "row %d (sample %d) is corrupt" % (row, i))
    return ids


def snapshot(batch):
    """What a batch delivered, for comparing runs: per device (ids checksum, bytes)."""
    return [(t.ids_checksum, np.array(np.from_dlpack(t), copy=True)) for t in batch.tensors]


def next_in_a_thread(client):
    """Starts a thread that calls client.next() without a timeout; returns
    the thread and a dict whose "result" is then "a batch" or the
    MeshloadError next() raised."""
    outcome = {}

    def run():
        try:
            client.next()
            outcome["result"] = "a batch"
        except meshload.MeshloadError as e:
            outcome["result"] = e

    th = threading.Thread(target=run)
    th.start()
    return th, outcome


# ---- ctypes views of the DLPack structs (the consumer's side of the ABI) ----


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


# A foreign function pointer: ctypes drops the GIL while it runs, so calling
# it also proves the deleter needs no GIL.
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# PyCapsule_SetName keeps the pointer, so the names must live for ever.
USED_DLTENSOR = b"used_dltensor"
USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"


def capsule_name(capsule):
    return _api.PyCapsule_GetName(capsule).decode()


def consume(capsule, versioned):
    """Takes the managed tensor out of a capsule as a DLPack consumer does:
    renames the capsule "used_..." so its destructor leaves it alone."""
    name = b"dltensor_versioned" if versioned else b"dltensor"
    ptr = _api.PyCapsule_GetPointer(capsule, name)
    assert ptr, "capsule has no %r pointer" % name
    used = USED_DLTENSOR_VERSIONED if versioned else USED_DLTENSOR
    if _api.PyCapsule_SetName(capsule, used) != 0:
        raise AssertionError("PyCapsule_SetName failed")
    struct = DLManagedTensorVersioned if versioned else DLManagedTensor
    return ptr, struct.from_address(ptr)


def under_asan():
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# ---- the tests ---------------------------------------------------------------


class StreamTest(SidecarTest):
    socket_name = "stream"

    def test_client_describes_the_job(self):
        with meshload.Client(self.sidecar.sock) as c:
            self.assertEqual(c.job, "pytest-job")
            self.assertEqual(c.process, 0)
            self.assertEqual(c.devices, [{"global_index": 0, "kind": 1, "uuid": ""},
                                         {"global_index": 1, "kind": 1, "uuid": ""}])
            self.assertEqual(c.next_step, 0)
            self.assertEqual(c.reconnects, 0)
            self.assertEqual(c.slots, PREFETCH)
            self.assertEqual(c.steps_per_epoch, STEPS_PER_EPOCH)
            self.assertEqual(c.global_batch, GLOBAL_BATCH)
            self.assertEqual(c.socket_path, self.sidecar.sock)
            self.assertFalse(c.closed)
            # The job's mesh, from the hello (protocol version 2).
            mesh = c.mesh
            self.assertEqual(mesh.processes, 1)
            self.assertEqual(mesh.devices_per_process, 2)
            self.assertEqual(mesh.axes, (("data", 2),))
            self.assertEqual(mesh.batch_axes, ("data",))
            self.assertIn("axes=(data=2) batch_axes=(data)", repr(mesh))
            batch = c.next()
            self.assertIs(batch.mesh, mesh)  # one object for the whole connection
            self.assertEqual(batch.mesh, mesh)
            self.assertEqual((batch.job, batch.process), ("pytest-job", 0))
            self.assertEqual(hash(batch.mesh), hash(mesh))

    def test_two_epochs_in_order_each_sample_once(self):
        with meshload.Client(self.sidecar.sock) as c:
            epochs = []
            for epoch in range(2):
                order = []
                for step in range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH):
                    b = c.next(timeout=10)
                    self.assertEqual(b.step, step)
                    self.assertEqual(c.next_step, step + 1)
                    self.assertGreaterEqual(b.wait_seconds, 0.0)
                    self.assertEqual(len(b.tensors), 2)
                    per_device = []
                    for dev, t in enumerate(b.tensors):
                        self.assertIs(b.tensors[dev], t)  # the same objects every time
                        self.assertEqual(t.shape, (PER_DEVICE, RECORD_BYTES))
                        self.assertEqual(t.ndim, 2)
                        self.assertEqual(t.dtype, "uint8")
                        self.assertEqual(t.nbytes, PER_DEVICE * RECORD_BYTES)
                        self.assertEqual(t.global_device, dev)
                        self.assertEqual(t.device, (1, 0))
                        self.assertEqual(t.step, step)
                        self.assertEqual(t.data_ptr % 256, 0)
                        self.assertIsInstance(t.ids_checksum, int)
                        per_device.append(decode(self, t))
                    # The two devices hold different shards of the step.
                    self.assertFalse(set(per_device[0]) & set(per_device[1]), per_device)
                    ids = per_device[0] + per_device[1]
                    self.assertEqual(len(set(ids)), GLOBAL_BATCH, ids)
                    order.extend(ids)
                    del b, t
                self.assertEqual(sorted(order), list(range(N_RECORDS)), "epoch %d" % epoch)
                epochs.append(order)
            # Global shuffle: a new order every epoch.
            self.assertNotEqual(epochs[0], epochs[1])

    def test_iteration(self):
        with meshload.Client(self.sidecar.sock) as c:
            self.assertIs(iter(c), c)
            steps = []
            for b in c:
                steps.append(b.step)
                decode(self, b.tensors[0])
                if len(steps) == 5:
                    break
            self.assertEqual(steps, [0, 1, 2, 3, 4])

    def test_next_releases_the_gil(self):
        with meshload.Client(self.sidecar.sock) as c:
            held = [c.next(timeout=10) for _ in range(PREFETCH)]  # nothing more can be staged
            outcome = []

            def blocked():
                try:
                    c.next(timeout=1.0)
                    outcome.append("batch")
                except TimeoutError:
                    outcome.append("timeout")

            th = threading.Thread(target=blocked)
            th.start()
            spins = 0
            while th.is_alive():
                spins += 1
            th.join()
            self.assertEqual(outcome, ["timeout"])
            # Spinning freely for the second next() waits gives millions; with
            # the GIL held by next() this thread would only get the 5 ms
            # switch-interval slots around the poll (tens of thousands).
            self.assertGreater(spins, 500000)
            del held

    def test_release_from_another_thread_while_next_blocks(self):
        with meshload.Client(self.sidecar.sock) as c:
            held = [c.next(timeout=10) for _ in range(PREFETCH)]

            def drop_oldest():
                time.sleep(0.3)
                del held[0]  # the last reference: RELEASE from this thread
                gc.collect()

            th = threading.Thread(target=drop_oldest)
            th.start()
            t0 = time.monotonic()
            b = c.next(timeout=10)  # blocked without the GIL until the release lands
            th.join()
            self.assertEqual(b.step, PREFETCH)
            self.assertGreaterEqual(time.monotonic() - t0, 0.25)
            self.assertGreaterEqual(b.wait_seconds, 0.25)

    def test_timeout_argument(self):
        with meshload.Client(self.sidecar.sock) as c:
            b = c.next(timeout=10)
            self.assertEqual(b.step, 0)
            with self.assertRaises(ValueError):
                c.next(timeout=-1)
            with self.assertRaises(ValueError):
                c.next(timeout=float("nan"))
            # A staged batch is returned even with a zero timeout.
            deadline = time.monotonic() + 10
            while True:
                try:
                    b = c.next(timeout=0)
                    break
                except TimeoutError:
                    self.assertLess(time.monotonic(), deadline)
                    time.sleep(0.01)
            self.assertEqual(b.step, 1)
            self.assertEqual(c.next(timeout=float("inf")).step, 2)


    def test_signals_that_come_often_do_not_stretch_the_timeout(self):
        # A handler that returns (no exception) every 20 ms: next() goes on
        # waiting after each, but only for what is left of its timeout.
        with meshload.Client(self.sidecar.sock) as c:
            held = [c.next(timeout=10) for _ in range(PREFETCH)]  # every slot: nothing more comes
            ticks = [0]

            def tick(signum, frame):
                ticks[0] += 1
                if ticks[0] >= 100:  # 2 s at most, so a stretched timeout still ends
                    signal.setitimer(signal.ITIMER_REAL, 0)

            old = signal.signal(signal.SIGALRM, tick)
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
                t0 = time.monotonic()
                with self.assertRaises(TimeoutError):
                    c.next(timeout=0.3)
                elapsed = time.monotonic() - t0
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            self.assertGreaterEqual(elapsed, 0.29)
            self.assertLess(elapsed, 1.5)
            del held


class DLPackTest(SidecarTest):
    socket_name = "dlpack"

    def setUp(self):
        super().setUp()
        self.client = meshload.Client(self.sidecar.sock)
        self.batch = self.client.next(timeout=10)
        self.t = self.batch.tensors[0]

    def tearDown(self):
        del self.t, self.batch
        self.client.close()
        super().tearDown()

    def test_device(self):
        self.assertEqual(self.t.__dlpack_device__(), (1, 0))

    def test_capsule_names(self):
        self.assertEqual(capsule_name(self.t.__dlpack__()), "dltensor")
        self.assertEqual(capsule_name(self.t.__dlpack__(max_version=None)), "dltensor")
        self.assertEqual(capsule_name(self.t.__dlpack__(max_version=(0, 8))), "dltensor")
        self.assertEqual(capsule_name(self.t.__dlpack__(max_version=(1, 0))), "dltensor_versioned")
        self.assertEqual(capsule_name(self.t.__dlpack__(max_version=(1, 3))), "dltensor_versioned")
        self.assertEqual(capsule_name(self.t.__dlpack__(max_version=(2, 0))), "dltensor_versioned")

    def test_ctypes_mirrors_the_abi(self):
        self.assertEqual(ctypes.sizeof(DLTensor), 48)
        self.assertEqual(ctypes.sizeof(DLManagedTensorVersioned), 80)
        self.assertEqual(DLManagedTensorVersioned.flags.offset, 24)
        self.assertEqual(DLManagedTensorVersioned.dl_tensor.offset, 32)
        self.assertEqual(ctypes.sizeof(DLManagedTensor), 64)

    def check_dl_tensor(self, dl):
        self.assertEqual(dl.data, self.t.data_ptr)
        self.assertEqual((dl.device.device_type, dl.device.device_id), (1, 0))
        self.assertEqual(dl.ndim, 2)
        self.assertEqual([dl.shape[i] for i in range(2)], [PER_DEVICE, RECORD_BYTES])
        self.assertTrue(dl.strides)
        self.assertEqual([dl.strides[i] for i in range(2)], [RECORD_BYTES, 1])
        self.assertEqual((dl.dtype.code, dl.dtype.bits, dl.dtype.lanes), (1, 8, 1))  # kDLUInt 8
        self.assertEqual(dl.byte_offset, 0)

    def test_consume_versioned_by_hand(self):
        cap = self.t.__dlpack__(max_version=(1, 0))
        ptr, m = consume(cap, versioned=True)
        self.assertEqual(capsule_name(cap), "used_dltensor_versioned")
        self.assertEqual((m.version.major, m.version.minor), (1, 0))
        self.assertEqual(m.flags, 0)  # writable, not a copy
        self.assertTrue(m.manager_ctx)
        self.check_dl_tensor(m.dl_tensor)
        # The memory is the slot's, and writable: a byte written through the
        # export shows in another view of the same tensor.
        view = np.from_dlpack(self.t)
        before = int(view[1, 9])
        ctypes.memmove(m.dl_tensor.data + RECORD_BYTES + 9, bytes([before ^ 0xFF]), 1)
        self.assertEqual(int(view[1, 9]), before ^ 0xFF)
        ctypes.memmove(m.dl_tensor.data + RECORD_BYTES + 9, bytes([before]), 1)
        del view
        m.deleter(ptr)  # the consumer's duty once it owns the tensor
        del m, cap  # the destructor must leave a used capsule alone
        gc.collect()

    def test_consume_legacy_by_hand(self):
        cap = self.t.__dlpack__()
        ptr, m = consume(cap, versioned=False)
        self.check_dl_tensor(m.dl_tensor)
        m.deleter(ptr)
        del m, cap
        gc.collect()

    def test_numpy_consumes_legacy(self):
        a = np.from_dlpack(self.t)  # numpy 1.24 passes no max_version
        self.assertEqual(a.shape, (PER_DEVICE, RECORD_BYTES))
        self.assertEqual(a.ctypes.data, self.t.data_ptr)
        decode(self, self.t)

    @unittest.skipIf(under_asan(), "ASan's quarantine keeps freed memory resident")
    def test_unconsumed_capsules_are_freed(self):
        for versioned in (False, True):
            for _ in range(2000):  # warm up allocator caches
                self.t.__dlpack__(max_version=(1, 0) if versioned else None)
            gc.collect()
            before = rss_bytes()
            for _ in range(100000):
                cap = self.t.__dlpack__(max_version=(1, 0) if versioned else None)
                del cap
            gc.collect()
            grown = rss_bytes() - before
            # A leaked export is ~200 bytes of C++ heap: 100k would be ~20 MB.
            self.assertLess(grown, 4 << 20,
                            "versioned=%s: RSS grew by %d bytes" % (versioned, grown))

    def test_arguments(self):
        t = self.t
        with self.assertRaisesRegex(BufferError, "zero-copy"):
            t.__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            t.__dlpack__(max_version=(1, 0), copy=True)
        self.assertEqual(capsule_name(t.__dlpack__(copy=False)), "dltensor")
        with self.assertRaises(BufferError):
            t.__dlpack__(dl_device=(2, 0))
        with self.assertRaises(BufferError):
            t.__dlpack__(dl_device=(1, 1))
        self.assertEqual(capsule_name(t.__dlpack__(dl_device=(1, 0))), "dltensor")
        with self.assertRaises(BufferError):
            t.__dlpack__(stream=1)
        self.assertEqual(capsule_name(t.__dlpack__(stream=None)), "dltensor")
        self.assertEqual(capsule_name(t.__dlpack__(stream=-1)), "dltensor")
        with self.assertRaises(TypeError):
            t.__dlpack__(max_version=3)
        with self.assertRaises(TypeError):
            t.__dlpack__(max_version=("1", "0"))
        self.assertEqual(capsule_name(t.__dlpack__(max_version=[1, 0])), "dltensor_versioned")
        self.assertEqual(capsule_name(t.__dlpack__(max_version=(2 ** 70, 0))), "dltensor_versioned")
        with self.assertRaises(TypeError):
            t.__dlpack__(None)  # keyword-only


class ReleaseTest(SidecarTest):
    socket_name = "release"

    def assert_stalled(self, c):
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):
            c.next(timeout=0.5)
        elapsed = time.monotonic() - t0
        self.assertGreaterEqual(elapsed, 0.45)
        self.assertLess(elapsed, 5.0)

    def test_slots_come_back_when_everything_is_gone(self):
        with meshload.Client(self.sidecar.sock) as c:
            held = [c.next(timeout=10) for _ in range(PREFETCH)]
            self.assertEqual([b.step for b in held], [0, 1, 2])
            self.assertEqual(len({b.slot for b in held}), PREFETCH)
            arrays = [np.from_dlpack(t) for t in held[0].tensors]
            self.assert_stalled(c)  # the trainer holds every slot

            # Drop batch 0 and its arrays: its slot is restaged with step 3.
            del held[0], arrays
            gc.collect()
            b3 = c.next(timeout=10)
            self.assertEqual(b3.step, 3)
            decode(self, b3.tensors[0])
            held.append(b3)
            del b3

            # An array alone keeps the slot leased after its Batch and Tensor
            # objects are gone, and its bytes stay intact.
            a = np.from_dlpack(held[0].tensors[1])
            copy = a.copy()
            del held[0]
            gc.collect()
            self.assert_stalled(c)
            np.testing.assert_array_equal(a, copy)
            del a
            gc.collect()
            held.append(c.next(timeout=10))
            self.assertEqual(held[-1].step, 4)

            # So does an unconsumed DLPack capsule.
            cap = held[0].tensors[0].__dlpack__(max_version=(1, 0))
            del held[0]
            gc.collect()
            self.assert_stalled(c)
            del cap
            gc.collect()
            held.append(c.next(timeout=10))
            self.assertEqual(held[-1].step, 5)

            # And a single Tensor object.
            t = held[0].tensors[0]
            del held[0]
            gc.collect()
            self.assert_stalled(c)
            del t
            gc.collect()
            self.assertEqual(c.next(timeout=10).step, 6)
            del held

        # Every release above reached the sidecar.
        deadline = time.monotonic() + 5
        while True:
            m = self.sidecar.metrics()
            consumed = sum(v for k, v in m.items()
                           if k.split("{")[0] == "meshload_batches_consumed_total")
            if consumed >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(consumed, 4, "meshload_batches_consumed_total")
        self.assertIn("meshload_trainer_wait_seconds_count", {k.split("{")[0] for k in m})


class LifecycleTest(SidecarTest):
    socket_name = "lifecycle"

    def test_context_manager_closes(self):
        with meshload.Client(self.sidecar.sock) as c:
            b = c.next(timeout=10)
            before = np.from_dlpack(b.tensors[1]).copy()
            self.assertFalse(c.closed)
        self.assertTrue(c.closed)
        c.close()  # idempotent
        with self.assertRaises(meshload.MeshloadError) as cm:
            c.next(timeout=1)
        self.assertEqual(cm.exception.code, "failed_precondition")
        self.assertIn("closed", str(cm.exception))
        self.assertNotIsInstance(cm.exception, ConnectionError)
        self.assertIsInstance(cm.exception, RuntimeError)
        # A batch outlives its client: its memory stays mapped, and its
        # slot stays lent (the client told the sidecar it holds it), so its
        # bytes do not change while a new trainer streams through the other
        # slots, starting over at the sidecar's start step.
        a = np.from_dlpack(b.tensors[1])
        self.assertEqual(a.shape, (PER_DEVICE, RECORD_BYTES))
        with meshload.Client(self.sidecar.sock, max_reconnect_attempts=3) as c2:
            for step in range(4 * PREFETCH):
                nb = c2.next(timeout=10)
                self.assertEqual(nb.step, step)
                decode(self, nb.tensors[0])
                del nb
                np.testing.assert_array_equal(a, before)
        decode(self, b.tensors[1])
        del a, b
        gc.collect()

    def test_second_trainer_is_refused(self):
        with meshload.Client(self.sidecar.sock) as c:
            c.next(timeout=10)
            # The refusal must say why, every time. Repeated because losing
            # the sidecar's ERROR message is a race (see the report of
            # "peer reset the connection" in the assertion message).
            lost = []
            for _ in range(20):
                with self.assertRaises(meshload.SidecarGone) as cm:
                    meshload.Client(self.sidecar.sock, max_reconnect_attempts=0)
                if "another trainer" not in str(cm.exception):
                    lost.append(str(cm.exception))
            self.assertFalse(
                lost, "%d of 20 refused trainers did not get the sidecar's ERROR (busy) "
                "message: the sidecar closes the refused connection with the CLIENT_HELLO "
                "unread, so the client's recv fails with ECONNRESET (or its send with EPIPE) "
                "before it reads the ERROR. First: %s" % (len(lost), lost[:1]))
            self.assertEqual(c.next(timeout=10).step, 1)  # the first one is unaffected

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            meshload.Client(self.sidecar.sock, start_step=-2)
        with self.assertRaises(ValueError):
            meshload.Client(self.sidecar.sock, max_reconnect_attempts=-1)

    def test_the_socket_comes_from_meshload_socket_when_not_given(self):
        # The sidecar-injection webhook sets MESHLOAD_SOCKET in trainer containers.
        old = os.environ.pop("MESHLOAD_SOCKET", None)
        try:
            with self.assertRaises(ValueError) as cm:
                meshload.Client()
            self.assertIn("MESHLOAD_SOCKET", str(cm.exception))
            os.environ["MESHLOAD_SOCKET"] = self.sidecar.sock
            with meshload.Client() as c:
                self.assertEqual(c.socket_path, self.sidecar.sock)
                self.assertEqual(c.next(timeout=10).step, 0)
        finally:
            os.environ.pop("MESHLOAD_SOCKET", None)
            if old is not None:
                os.environ["MESHLOAD_SOCKET"] = old

    def test_no_sidecar(self):
        t0 = time.monotonic()
        with self.assertRaises(meshload.SidecarGone) as cm:
            meshload.Client(os.path.join(TMP, "nobody.sock"), max_reconnect_attempts=2)
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertEqual(cm.exception.code, "unavailable")
        self.assertIn("nobody.sock", str(cm.exception))


class ReconnectTest(SidecarTest):
    def record(self, client, steps):
        out = {}
        for step in steps:
            b = client.next(timeout=10)
            self.assertEqual(b.step, step)
            for t in b.tensors:
                decode(self, t)
            out[step] = snapshot(b)
        return out

    def reference_run(self, total):
        """Steps 0..total-1 from an uninterrupted sidecar, which is then stopped."""
        self.sidecar.start()
        with meshload.Client(self.sidecar.sock) as c:
            ref = self.record(c, range(total))
        self.sidecar.stop()
        return ref

    def assert_same(self, step, got, want):
        self.assertEqual(len(got), len(want))
        for dev, ((gsum, gbytes), (wsum, wbytes)) in enumerate(zip(got, want)):
            self.assertEqual(gsum, wsum, "step %d device %d: ids checksum" % (step, dev))
            np.testing.assert_array_equal(gbytes, wbytes, "step %d device %d" % (step, dev))

    def test_start_step(self):
        self.sidecar.start()
        with meshload.Client(self.sidecar.sock) as c:
            ref = self.record(c, range(8))
        with meshload.Client(self.sidecar.sock, start_step=5) as c:
            self.assertEqual(c.next_step, 5)
            got = self.record(c, range(5, 8))
        for step in range(5, 8):
            self.assert_same(step, got[step], ref[step])

    def test_restart_resumes_with_identical_bytes(self):
        total, k = 10, 4
        ref = self.reference_run(total)
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock)
        held = []
        for step in range(k + 1):
            del held[:-(PREFETCH - 1)]  # room for one more
            b = c.next(timeout=10)
            self.assertEqual(b.step, step)
            self.assert_same(step, snapshot(b), ref[step])
            held.append(b)
            del b
        # The trainer holds every slot, so no READY beyond step k is in
        # flight: the next call must reconnect to get step k + 1.
        self.sidecar.kill()
        del held  # RELEASE into a dead connection: nothing to do, no hang
        gc.collect()
        self.sidecar.start()
        for step in range(k + 1, total):
            b = c.next(timeout=30)
            self.assertEqual(b.step, step)
            for t in b.tensors:
                decode(self, t)
            self.assert_same(step, snapshot(b), ref[step])
            del b
        self.assertEqual(c.reconnects, 1)
        self.assertEqual(c.next_step, total)
        connected = [e for e in self.sidecar.log_lines() if e.get("msg") == "trainer connected"]
        self.assertEqual([e.get("step") for e in connected], [k + 1], self.sidecar.log_text())
        c.close()

    def test_a_sidecar_restarted_with_another_mesh_hands_out_the_new_one(self):
        # The client copies the hello once a connection, not each step: a
        # reconnect to a resized (here: renamed) mesh must still show.
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock)
        b = c.next(timeout=10)
        old = b.mesh
        self.assertEqual(old.axes, (("data", 2),))
        self.assertIs(c.next(timeout=10).mesh, old)
        del b
        gc.collect()
        self.sidecar.kill()
        with open(JOB) as f:
            original = f.read()
        try:
            with open(JOB, "w") as f:
                f.write(original.replace("{name: data, size: 2}", "{name: dp, size: 2}"))
            self.sidecar.start()
            # READYs the first sidecar had sent are still read from its
            # socket (their slots stay mapped), with its mesh.
            b = c.next(timeout=30)
            while c.reconnects == 0:
                self.assertIs(b.mesh, old)
                b = c.next(timeout=30)
            self.assertEqual(b.mesh.axes, (("dp", 2),))
            self.assertEqual(b.mesh.batch_axes, ("dp",))
            self.assertEqual(c.mesh, b.mesh)
            self.assertIsNot(b.mesh, old)
            self.assertEqual(c.reconnects, 1)
            del b
        finally:
            with open(JOB, "w") as f:
                f.write(original)
        c.close()

    def test_restart_with_batches_in_flight(self):
        # Unlike above, every batch is dropped at once, so READYs for the
        # steps after k are queued when the sidecar dies: the client hands
        # those out first (their slots live on in the dead sidecar's pool,
        # which this process still maps), then reconnects at the right step.
        total, k = 12, 3
        ref = self.reference_run(total)
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock)
        self.record(c, range(k + 1))
        time.sleep(0.2)  # let the sidecar restage and send what it can
        self.sidecar.kill()
        self.sidecar.start()
        got = self.record(c, range(k + 1, total))
        for step in range(k + 1, total):
            self.assert_same(step, got[step], ref[step])
        self.assertEqual(c.reconnects, 1)
        connected = [e.get("step") for e in self.sidecar.log_lines()
                     if e.get("msg") == "trainer connected"]
        self.assertEqual(len(connected), 1)
        self.assertGreater(connected[0], k + 1)  # READYs were in flight
        c.close()

    def test_a_signal_while_reconnecting_reaches_python(self):
        # Ctrl-C (here SIGALRM with a handler that raises) while next() waits
        # between reconnect attempts to a sidecar that is not coming back:
        # the handler runs at once, not after every attempt has failed.
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock, max_reconnect_attempts=50)
        c.next(timeout=10)
        time.sleep(0.2)  # the sidecar sends the READYs it can
        self.sidecar.kill()

        class Interrupted(Exception):
            pass

        def raise_interrupted(signum, frame):
            raise Interrupted()

        old = signal.signal(signal.SIGALRM, raise_interrupted)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            t0 = time.monotonic()
            with self.assertRaises(Interrupted):
                for _ in range(PREFETCH + 2):  # queued READYs first, then reconnecting
                    c.next()
            self.assertLess(time.monotonic() - t0, 3.0)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        c.close()

    def test_short_timeouts_still_reconnect(self):
        # A trainer polling with next(timeout=0.01) while its sidecar
        # restarts: each call returns TimeoutError, but the reconnect
        # schedule carries over between calls, so an attempt is made and
        # the stream resumes at the step it had reached.
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock, max_reconnect_attempts=50)
        for step in range(3):
            self.assertEqual(c.next(timeout=10).step, step)
        self.sidecar.kill()
        self.sidecar.start()
        t0 = time.monotonic()
        expect = 3
        last = 3 + PREFETCH + 2  # past what the old sidecar can have queued
        timeouts = 0
        while expect <= last and time.monotonic() - t0 < 30:
            try:
                b = c.next(timeout=0.01)
            except TimeoutError:
                timeouts += 1
                continue
            self.assertEqual(b.step, expect)
            for t in b.tensors:
                decode(self, t)
            del b
            expect += 1
        self.assertGreater(expect, last, "never reconnected with 10 ms timeouts (%d timeouts)" % timeouts)
        self.assertEqual(c.reconnects, 1)
        c.close()

    def test_close_from_another_thread_wakes_a_blocked_next(self):
        # A loader thread blocked in next() because the trainer holds every
        # slot: close() from the main thread returns at once, and the
        # loader's next() raises "closed" instead of waiting for ever.
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock)
        held = [c.next(timeout=10) for _ in range(PREFETCH)]
        th, outcome = next_in_a_thread(c)
        time.sleep(0.3)  # the loader is blocked in next()
        self.assertTrue(th.is_alive())
        t0 = time.monotonic()
        c.close()
        th.join(10)
        self.assertFalse(th.is_alive(), "next() still blocked after close()")
        self.assertLess(time.monotonic() - t0, 5.0)
        e = outcome.get("result")
        self.assertIsInstance(e, meshload.MeshloadError)
        self.assertEqual(e.code, "failed_precondition")
        self.assertIn("closed", str(e))
        self.assertTrue(c.closed)
        for b in held:  # held batches keep their bytes after close()
            for t in b.tensors:
                decode(self, t)
        del held

    def test_a_timed_next_behind_another_threads_next_keeps_its_timeout(self):
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock)
        held = [c.next(timeout=10) for _ in range(PREFETCH)]
        th, outcome = next_in_a_thread(c)
        # Until the other thread holds the client (a loaded machine may take
        # a while to start it), a timed next() waits for a batch itself.
        behind = None
        for _ in range(100):
            t0 = time.monotonic()
            with self.assertRaises(TimeoutError) as cm:
                c.next(timeout=0.3)
            self.assertLess(time.monotonic() - t0, 3.0)
            if "another thread" in str(cm.exception):
                behind = cm.exception
                break
        self.assertIsNotNone(behind, "never waited behind the other thread's next()")
        c.close()
        th.join(10)
        self.assertFalse(th.is_alive())
        self.assertIsInstance(outcome.get("result"), meshload.MeshloadError)  # woken by close()
        del held

    def test_signals_while_the_constructor_waits_for_the_sidecar(self):
        # The trainer starts first; a handled signal every 5 ms (a sampling
        # profiler) must neither fail the constructor nor keep it from
        # connecting once the sidecar is up.
        calls = [0]

        def count(signum, frame):
            calls[0] += 1

        # The thread that starts the sidecar lives until the test ends: the
        # sidecar dies with the thread that forked it (PR_SET_PDEATHSIG).
        done = threading.Event()

        def start_later():
            time.sleep(0.5)
            self.sidecar.start()
            done.wait(60)

        old = signal.signal(signal.SIGALRM, count)
        starter = threading.Thread(target=start_later)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.005, 0.005)
            starter.start()
            c = meshload.Client(self.sidecar.sock, max_reconnect_attempts=50)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        try:
            self.assertGreater(calls[0], 10)
            b = c.next(timeout=10)
            self.assertEqual(b.step, 0)
            for t in b.tensors:
                decode(self, t)
            del b
            c.close()
            self.sidecar.stop()
        finally:
            done.set()
            starter.join(30)

    def test_sidecar_gone_for_good(self):
        self.sidecar.start()
        c = meshload.Client(self.sidecar.sock, max_reconnect_attempts=3)
        c.next(timeout=10)
        self.sidecar.kill()
        t0 = time.monotonic()
        with self.assertRaises(meshload.SidecarGone) as cm:
            # READYs sent before the kill may still be queued; then the end.
            for _ in range(PREFETCH + 2):
                c.next(timeout=20)
        elapsed = time.monotonic() - t0
        # 3 attempts back off 50, 100, 200 ms at most.
        self.assertLess(elapsed, 5.0)
        e = cm.exception
        self.assertIsInstance(e, ConnectionError)
        self.assertEqual(e.code, "unavailable")
        self.assertIn("gave up after 4 connection attempts (max_reconnect_attempts 3)", str(e))
        self.assertIn(self.sidecar.sock, str(e))
        # It stays gone.
        with self.assertRaises(meshload.SidecarGone):
            c.next(timeout=20)
        c.close()


# ---- GPU staging (the stand-in driver) -------------------------------------------


def capsule_tensor(capsule, name):
    """The DLTensor inside a capsule, left unconsumed (its destructor frees it)."""
    ptr = _api.PyCapsule_GetPointer(capsule, name.encode())
    struct = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    return struct.from_address(ptr).dl_tensor


class GpuStagingTest(unittest.TestCase):
    """The sidecar stages in (stand-in) GPU memory: tensors are CUDA DLPack
    views with the trainer's ordinal; the stand-in's device memory is host
    memory, so these tests may read it through the pointer (on a real GPU,
    scripts/gpu-check reads it through PyTorch, JAX and CuPy instead)."""

    def setUp(self):
        if FAKE_CUDA is None:
            self.skipTest("no stand-in CUDA driver (--fake-cuda; a build without CUDA headers has none)")
        self.sidecar = Sidecar("gpu", staging="cuda").start()

    def tearDown(self):
        self.sidecar.stop()

    def test_tensors_are_cuda_dlpack_views_on_the_trainers_ordinals(self):
        with meshload.Client(self.sidecar.sock) as c:
            for _ in range(2 * STEPS_PER_EPOCH):
                b = c.next(timeout=10)
                for i, t in enumerate(b.tensors):
                    self.assertEqual(t.__dlpack_device__(), (2, i))
                    for name, kwargs in (("dltensor", {}), ("dltensor_versioned", {"max_version": (1, 0)})):
                        cap = t.__dlpack__(**kwargs)
                        dl = capsule_tensor(cap, name)
                        self.assertEqual((dl.device.device_type, dl.device.device_id), (2, i))
                        self.assertEqual(dl.data + dl.byte_offset, t.data_ptr)
                        self.assertEqual(dl.data % 256, 0)
                        self.assertEqual([dl.shape[k] for k in range(dl.ndim)], [PER_DEVICE, RECORD_BYTES])
                        del cap
                    raw = np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype="<u8").reshape(PER_DEVICE, WORDS)
                    for row in raw:
                        self.assertLess(int(row[0]), N_RECORDS)
                        np.testing.assert_array_equal(row, EXPECTED[int(row[0])])
                del b, t

    def test_the_stream_argument_follows_dlpack_and_release_waits_on_it(self):
        with meshload.Client(self.sidecar.sock) as c:
            b = c.next(timeout=10)
            t = b.tensors[0]
            with self.assertRaises(ValueError):
                t.__dlpack__(stream=0)  # ambiguous for CUDA
            with self.assertRaises(TypeError):
                t.__dlpack__(stream="default")
            t.__dlpack__(stream=-1)
            t.__dlpack__(stream=None)  # the legacy default stream: recorded for the release
            t.__dlpack__(stream=2)
            with self.assertRaises(Exception):
                np.from_dlpack(t)  # numpy cannot read GPU memory, and must not try
            consumed = self.sidecar.metrics().get("meshload_batches_consumed_total", 0)
            del b, t
            gc.collect()
            for _ in range(300):
                if self.sidecar.metrics().get("meshload_batches_consumed_total", 0) > consumed:
                    break
                time.sleep(0.01)
            self.assertGreater(self.sidecar.metrics().get("meshload_batches_consumed_total", 0), consumed)
            c.next(timeout=10)


# ---- main ----------------------------------------------------------------------


def main():
    global SIDECAR
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar", default=os.environ.get("MESHLOAD_SIDECAR"),
                        help="the meshload-sidecar binary (default: $MESHLOAD_SIDECAR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--fake-cuda", help="the stand-in libcuda (tests/testing/fake_cuda.cc) for the GPU staging tests")
    args, rest = parser.parse_known_args()
    global FAKE_CUDA
    if args.fake_cuda:
        FAKE_CUDA = os.path.abspath(args.fake_cuda)
        # For the sidecars (inherited) and this process's client alike.
        os.environ["MESHLOAD_CUDA_LIBRARY"] = FAKE_CUDA
        os.environ["MESHLOAD_FAKE_CUDA_DEVICES"] = ("GPU-aaaaaaaa-0000-4000-8000-000000000001,"
                                                    "GPU-aaaaaaaa-0000-4000-8000-000000000002")
    if not args.sidecar or not os.access(args.sidecar, os.X_OK):
        print("client_test.py: --sidecar (or MESHLOAD_SIDECAR) must name the "
              "meshload-sidecar binary", file=sys.stderr)
        return 2
    SIDECAR = os.path.abspath(args.sidecar)

    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    result = program.result
    failed = not result.wasSuccessful()
    print(harness.summary(result))
    if TMP:
        if failed or args.keep:
            print("sidecar logs and data kept in " + TMP)
            for name in sorted(os.listdir(TMP)):
                if name.endswith(".log") and failed:
                    with open(os.path.join(TMP, name), errors="replace") as f:
                        tail = f.read().splitlines()[-15:]
                    print("---- %s (last %d lines)\n%s" % (name, len(tail), "\n".join(tail)))
        else:
            shutil.rmtree(TMP, ignore_errors=True)
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
