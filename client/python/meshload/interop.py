"""meshload.interop: a batch's tensors in PyTorch, JAX and CuPy, zero-copy.

Each function takes a ``meshload.Batch`` and returns one array per local
device, in the job's local device order, viewing the staged slot (host
memory, or the GPU the sidecar staged it on, with this process's ordinal for
it); for a ragged batch (``meshload.Ragged``, variable-size samples) one
``(values, offsets)`` pair of arrays per device. The frameworks are imported
on first use; meshload depends on none.

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

JAX: ``meshload.jax`` (``global_array``, ``local_arrays``, ``mesh``) is the
JAX interface; ``jax_arrays`` and ``jax_global_array`` here call it.
"""

__all__ = ["torch_tensors", "cupy_arrays", "jax_arrays", "jax_global_array"]


def _each(batch, from_dlpack):
    from . import Ragged

    return [(from_dlpack(t.values), from_dlpack(t.offsets)) if isinstance(t, Ragged) else from_dlpack(t)
            for t in batch.tensors]


def torch_tensors(batch):
    """``torch.from_dlpack`` of every tensor (CPU or CUDA tensors); a
    ``(values, offsets)`` pair for each device of a ragged batch."""
    import torch

    return _each(batch, torch.from_dlpack)


def cupy_arrays(batch):
    """``cupy.from_dlpack`` of every tensor (GPU batches only: CuPy arrays
    live on a GPU); a ``(values, offsets)`` pair for each device of a ragged
    batch."""
    for t in batch.tensors:
        if t.device[0] != 2:
            raise ValueError("CuPy arrays live on a GPU; this batch is in host memory (the sidecar stages on "
                             "the host: see its staging_reason)")
    import cupy

    return _each(batch, cupy.from_dlpack)


def jax_arrays(batch):
    """One single-device ``jax.Array`` per tensor, on the JAX device it belongs
    on: ``meshload.jax.local_arrays``."""
    from . import jax as mjax

    return mjax.local_arrays(batch)


def jax_global_array(batch, mesh, batch_axes):
    """``meshload.jax.global_array(batch, mesh)``, for callers that pass the
    job's batch axes themselves: they must be the job's (``batch.mesh``)."""
    from . import jax as mjax

    if tuple(batch_axes) != tuple(batch.mesh.batch_axes):
        raise mjax.MeshMismatch("batch axes %s given, but job %r shards the batch over %s" %
                                (tuple(batch_axes), batch.job, tuple(batch.mesh.batch_axes)))
    return mjax.global_array(batch, mesh=mesh)
