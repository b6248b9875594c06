"""meshload.interop: a batch's tensors in PyTorch, JAX and CuPy, zero-copy.

Each function takes a ``meshload.Batch`` and returns one array per local
device, in the job's local device order, viewing the staged slot (host
memory, or the GPU the sidecar staged it on, with this process's ordinal for
it). The frameworks are imported on first use; meshload depends on none.

    import meshload
    from meshload import interop

    with meshload.Client(sock) as client:
        for batch in client:
            xs = interop.torch_tensors(batch)          # [torch.Tensor per device]
            ...

Lifetime: every array keeps the batch's slot leased (see ``meshload``); the
slot goes back when the batch and all arrays made from it are gone. For GPU
batches the frameworks pass their stream to ``__dlpack__``; the slot is
released only after the work queued on those streams when the last array
dies has finished, so a kernel still reading the batch never sees it
restaged.

JAX: ``jax_global_array`` assembles the process's per-device arrays into
one global ``jax.Array`` sharded over the job's batch axes
(``jax.make_array_from_single_device_arrays``). The JAX mesh must list the
devices in the job's global device order (``mesh.devices.flat[g]`` is the
job's device ``g``), which it checks.
"""

import math

__all__ = ["torch_tensors", "cupy_arrays", "jax_arrays", "jax_global_array"]


def torch_tensors(batch):
    """``torch.from_dlpack`` of every tensor (CPU or CUDA tensors)."""
    import torch

    return [torch.from_dlpack(t) for t in batch.tensors]


def cupy_arrays(batch):
    """``cupy.from_dlpack`` of every tensor (GPU batches only: CuPy arrays
    live on a GPU)."""
    for t in batch.tensors:
        if t.__dlpack_device__()[0] != 2:
            raise ValueError("CuPy arrays live on a GPU; this batch is in host memory (the sidecar stages on "
                             "the host: see its staging_reason)")
    import cupy

    return [cupy.from_dlpack(t) for t in batch.tensors]


def jax_arrays(batch):
    """One single-device ``jax.Array`` per tensor, on the device it was staged on."""
    import jax
    import jax.dlpack

    out = []
    for t in batch.tensors:
        try:
            # JAX >= 0.4.27 takes any object with __dlpack__ ...
            out.append(jax.dlpack.from_dlpack(t))
        except TypeError:
            # ... older ones only a legacy (unversioned) capsule. It says
            # nothing of the stream XLA will read on (not the legacy default
            # stream): stream=-1, so the slot goes back only after a device
            # synchronization.
            out.append(jax.dlpack.from_dlpack(t.__dlpack__(stream=-1)))
    return out


def _jax_device_of(array):
    devices = array.devices() if callable(getattr(array, "devices", None)) else {array.device()}
    (device,) = devices
    return device


def jax_global_array(batch, mesh, batch_axes):
    """The process's part of the global batch as one ``jax.Array``.

    ``mesh``: a ``jax.sharding.Mesh`` whose devices are in the job's global
    device order; ``batch_axes``: the job's ``spec.mesh.batchAxes`` (the mesh
    axes the batch dimension is sharded over, in order). Devices along the
    other axes hold replicas. Every process calls it with its own batch.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    arrays = jax_arrays(batch)
    flat = list(mesh.devices.flat)
    for t, a in zip(batch.tensors, arrays):
        want = flat[t.global_device]
        got = _jax_device_of(a)
        if got != want:
            raise ValueError(
                "the JAX mesh lists %s as the job's device %d, but the sidecar staged that device's shard on %s: "
                "build the mesh in the job's global device order" % (want, t.global_device, got))
    shards = math.prod(mesh.shape[a] for a in batch_axes)
    per_device = arrays[0].shape
    global_shape = (per_device[0] * shards,) + tuple(per_device[1:])
    sharding = NamedSharding(mesh, PartitionSpec(tuple(batch_axes)))
    return jax.make_array_from_single_device_arrays(global_shape, sharding, arrays)
