#!/usr/bin/env python3
"""GPU batches into PyTorch, JAX and CuPy through DLPack, checked byte for byte.

    PYTHONPATH=<dir holding the meshload package> python3 scripts/gpu_dlpack_check.py \
        --meshload BIN/meshload --sidecar BIN/meshload-sidecar [--steps N] [--allow-missing]

Two sidecars serve the same job and process: one stages on the GPUs
(--staging cuda), one in host memory (--staging host, the reference). For
each framework a trainer takes the same steps from both and checks that the
framework's array is on the GPU the sidecar staged on (by UUID, as this
process numbers it), is the slot itself (its device pointer is the
tensor's: zero-copy) and holds exactly the reference bytes. For JAX it also
builds the global jax.Array for the job's mesh (meshload.interop).
Run by scripts/gpu-check; prints "frameworks: ..." and exits non-zero on any
mismatch, or on a framework that is not installed (unless --allow-missing).
With the stand-in driver (tests/testing/fake_cuda.cc, for a smoke test on a
machine without a GPU) the GPU memory is host memory and is also compared
raw.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import meshload
from meshload import interop

RECORD = 4096


def job_yaml(data, devices):
    return f"""apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {{name: dlpack-check}}
spec:
  mesh:
    processes: 1
    devicesPerProcess: {devices}
    axes: [{{name: data, size: {devices}}}]
    batchAxes: [data]
  strategy: PerProcess
  dataset: {{uri: {data}, format: FixedRecord, recordBytes: {RECORD}}}
  batch: {{globalBatchSize: {8 * devices}, prefetch: 3}}
  shuffle: {{mode: Global, seed: 17}}
"""


def start_sidecar(binary, job, sock, staging, log):
    proc = subprocess.Popen([binary, "--job", job, "--process", "0", "--socket", sock, "--staging", staging],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    for _ in range(500):
        if os.path.exists(sock):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise SystemExit("sidecar (%s) did not start:\n%s" % (staging, open(log).read()))


def reference(host_batch):
    return [np.from_dlpack(t).copy() for t in host_batch.tensors]


def check_framework(name, convert, to_numpy, device_index, pointer, gpu_sock, host_sock, steps, start):
    with meshload.Client(gpu_sock, start_step=start) as g, meshload.Client(host_sock, start_step=start) as h:
        for _ in range(steps):
            gb, hb = g.next(timeout=30), h.next(timeout=30)
            assert gb.step == hb.step
            want = reference(hb)
            arrays = convert(gb)
            for i, (a, t) in enumerate(zip(arrays, gb.tensors)):
                if device_index(a) != t.device[1]:
                    raise AssertionError("%s: device %d's array is on GPU %s, the batch on %s"
                                         % (name, i, device_index(a), t.device[1]))
                if pointer(a) != t.data_ptr:  # zero-copy: the framework reads the slot itself
                    raise AssertionError("%s: step %d device %d: the array is at 0x%x, the slot at 0x%x (a copy)"
                                         % (name, gb.step, i, pointer(a), t.data_ptr))
                got = to_numpy(a)
                if got.shape != want[i].shape or not np.array_equal(got, want[i]):
                    raise AssertionError("%s: step %d device %d: bytes differ from the host-staged batch"
                                         % (name, gb.step, i))
            del arrays, gb, hb
    return "%s ok (zero-copy)" % name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meshload", required=True)
    ap.add_argument("--sidecar", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--devices", type=int, default=0, help="local devices (default: min(GPUs, 2))")
    ap.add_argument("--allow-missing", action="store_true")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="mldl-")
    data = os.path.join(tmp, "records.bin")
    rng = np.random.default_rng(5)
    rng.integers(0, 256, size=(4096, RECORD), dtype=np.uint8).tofile(data)
    devices = args.devices
    if not devices:
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
            devices = max(1, min(2, len(out.strip().splitlines())))
        except OSError:
            devices = 2  # the stand-in driver's
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write(job_yaml(data, devices))
    gpu_sock, host_sock = os.path.join(tmp, "gpu.sock"), os.path.join(tmp, "host.sock")
    gpu = start_sidecar(args.sidecar, job, gpu_sock, "cuda", os.path.join(tmp, "gpu.log"))
    host = start_sidecar(args.sidecar, job, host_sock, "host", os.path.join(tmp, "host.log"))
    results, failed = [], False
    try:
        checks = []
        try:
            import torch

            checks.append(("torch", interop.torch_tensors, lambda a: a.cpu().numpy(), lambda a: a.device.index,
                           lambda a: a.data_ptr()))
        except ImportError:
            results.append("torch missing")
        try:
            import cupy

            checks.append(("cupy", interop.cupy_arrays, cupy.asnumpy, lambda a: a.device.id, lambda a: a.data.ptr))
        except ImportError:
            results.append("cupy missing")
        try:
            import jax

            def jax_index(a):
                (d,) = a.devices()
                return d.local_hardware_id

            checks.append(("jax", interop.jax_arrays, np.asarray, jax_index, lambda a: a.unsafe_buffer_pointer()))
        except ImportError:
            results.append("jax missing")
        if "fake" in os.environ.get("MESHLOAD_CUDA_LIBRARY", ""):
            # Stand-in GPU memory is host memory: compare it raw.
            def raw(batch):
                return [np.frombuffer(ctypes.string_at(t.data_ptr, t.nbytes), dtype=np.uint8).reshape(t.shape)
                        for t in batch.tensors]

            checks.append(("raw (stand-in driver)", raw, lambda a: a, lambda a: None, None))
        start = 0
        for name, convert, to_numpy, index, pointer in checks:
            try:
                if name.startswith("raw"):
                    results.append(check_raw(convert, gpu_sock, host_sock, args.steps, start))
                else:
                    results.append(check_framework(name, convert, to_numpy, index, pointer, gpu_sock, host_sock,
                                                   args.steps, start))
            except Exception as e:  # noqa: BLE001 (report every framework)
                failed = True
                results.append("%s FAILED (%s: %s)" % (name, type(e).__name__, e))
            start += args.steps
        if any(r.startswith("jax ok") for r in results):
            try:
                results.append(check_jax_global(gpu_sock, host_sock, devices, start))
            except Exception as e:  # noqa: BLE001
                failed = True
                results.append("jax global array FAILED (%s: %s)" % (type(e).__name__, e))
    finally:
        for p in (gpu, host):
            p.terminate()
            p.wait(10)
    missing = [r for r in results if r.endswith("missing")]
    print("frameworks: " + ", ".join(results))
    if failed or (missing and not args.allow_missing):
        print("logs in " + tmp)
        return 1
    return 0


def check_raw(convert, gpu_sock, host_sock, steps, start):
    with meshload.Client(gpu_sock, start_step=start) as g, meshload.Client(host_sock, start_step=start) as h:
        for _ in range(steps):
            gb, hb = g.next(timeout=30), h.next(timeout=30)
            if not all(t.device[0] == 2 for t in gb.tensors):
                raise AssertionError("the GPU sidecar handed over tensors that are not CUDA tensors")
            for got, want in zip(convert(gb), reference(hb)):
                if not np.array_equal(got, want):
                    raise AssertionError("step %d: bytes differ from the host-staged batch" % gb.step)
            del gb, hb
    return "raw (stand-in driver) ok"


def check_jax_global(gpu_sock, host_sock, devices, start):
    import jax
    from jax.sharding import Mesh

    local = sorted(jax.local_devices(), key=lambda d: d.local_hardware_id)[:devices]
    mesh = Mesh(np.array(local), ("data",))
    with meshload.Client(gpu_sock, start_step=start) as g, meshload.Client(host_sock, start_step=start) as h:
        gb, hb = g.next(timeout=30), h.next(timeout=30)
        arr = interop.jax_global_array(gb, mesh, ["data"])
        want = np.concatenate(reference(hb))
        if arr.shape != want.shape or not np.array_equal(np.asarray(arr), want):
            raise AssertionError("the global array differs from the host-staged batch")
        del arr, gb, hb
    return "jax global array ok"


if __name__ == "__main__":
    sys.exit(main())
