"""meshload: the trainer side of the meshload data loader.

A meshload sidecar next to the trainer stages each step's batch in shared
memory; this package connects to it over its Unix socket and hands the batch
over as zero-copy tensors, one per local device, through DLPack::

    import meshload, torch

    with meshload.Client("/run/meshload/sidecar.sock") as client:
        for batch in client:                        # steps 0, 1, 2, ... in order
            for dev, t in enumerate(batch.tensors):  # the job's local device order
                x = torch.from_dlpack(t)             # a view of the staged slot
                ...
            del batch, x                             # the slot goes back to the sidecar

Lifetime. A Batch, its Tensors, and every array made from them with
``from_dlpack`` share the batch's slot lease: the slot is released when the
last of them is gone. Holding ``prefetch`` batches (or arrays viewing them)
stalls the sidecar until one is dropped (for jobs with many local devices,
fewer: the sidecar's log says how many when it limits them); copy what must
outlive the step.
The arrays are writable views of memory the sidecar reuses after release.
``close()`` (and leaving the ``with`` block) gives back every slot but those
of batches still alive: they keep their slots, bytes and mapping until they
are dropped (the client tells the sidecar which it holds), so reading them
after close() or a reconnect is safe. (One exception: with legacy CUDA IPC
staging, ``--staging cuda-ipc``, batches held across a sidecar *restart*
point at memory the dead sidecar freed; see docs/life-of-a-batch.md.)

Errors. Iteration and ``Client.next()`` go on for ever. If the sidecar
restarts, the client reconnects and resumes at the next step with identical
bytes (``reconnects`` counts these). When it does not come back within
``max_reconnect_attempts`` (bounded exponential backoff, 50 ms to 2 s),
``SidecarGone`` (a ConnectionError) is raised. ``next(timeout=s)`` raises
TimeoutError when no batch is staged within ``s`` seconds (a reconnect in
progress goes on at the next call, on its own schedule). Any other problem -- a data error the
sidecar reported, a protocol violation -- raises ``MeshloadError`` (a
RuntimeError). Both meshload exceptions carry ``.code``, e.g. "data_loss".

DLPack. ``Tensor.__dlpack__`` follows the Python array API: a consumer
passing ``max_version >= (1, 0)`` gets a DLPack 1.0 "dltensor_versioned"
capsule, others (numpy < 2, older torch, JAX) a legacy "dltensor" capsule.
With host staging the memory is host memory (``__dlpack_device__() ==
(1, 0)``). With GPU staging it is the GPU the sidecar staged on, as this
process numbers it (``(2, ordinal)``, mapped by GPU UUID): the sidecar's
copies are complete before the batch is handed over, so the consumer's
stream waits on nothing; the stream passed to ``__dlpack__`` (None: the
legacy default stream; -1: none) is remembered, and the slot is released
only after the work queued on it when the batch dies is done.
``copy=True`` and other devices are refused with BufferError.
``meshload.jax.global_array(batch)`` assembles the job's global ``jax.Array``
(the mesh and PartitionSpec come from the sidecar: ``batch.mesh``);
``meshload.interop`` has helpers for PyTorch and CuPy.

Threads. ``next()`` releases the GIL while it waits; concurrent ``next()``
calls on one Client are serialized (a ``next(timeout=s)`` waiting behind
another thread's still raises TimeoutError after ``s``). ``close()`` from
another thread wakes a blocked ``next()``, which raises MeshloadError
("closed"), so a loader thread never keeps the trainer from shutting down.
A signal interrupts a blocking ``next()`` or the constructor: Python's
handlers run (Ctrl-C raises KeyboardInterrupt there), and when none raises,
the wait goes on where it was (reconnect attempts included: a profiler's
frequent signals or a polling ``next(timeout=0)`` still reconnect).

Public names:
    Client(socket_path="", start_step=None, max_reconnect_attempts=8)
        (socket_path "": $MESHLOAD_SOCKET, which the sidecar-injection webhook sets)
        .next(timeout=None) -> Batch, iteration, context manager, .close(),
        .next_step, .reconnects, .job, .process, .devices, .mesh, .slots,
        .steps_per_epoch, .global_batch, .socket_path, .closed
    Batch: .step, .tensors, .wait_seconds, .slot, .mesh, .job, .process,
        .fields, .field(name)
        (.tensors: a Tensor per local device, or a Ragged when the job's
        samples differ in size; for WebDataset, MDS, TFRecord, Parquet and packed
        rows of tokens a dict from field name to its Tensor or Ragged per
        device; .fields: the field names, ('',) for one tensor;
        .field(name): that field's tensor per local device)
    JobMesh: .processes, .devices_per_process, .axes, .batch_axes
    Tensor: .shape, .dtype, .nbytes, .ndim, .global_device, .ids_checksum,
        .device, .step, .data_ptr, __dlpack__(), __dlpack_device__()
    Ragged: .values, .offsets (Tensors), .samples, .dtype, .global_device,
        .ids_checksum, .device, .step, len(), .to_list(), .padded(length, pad_value)
        (meshload/ragged.py)
    MeshloadError, SidecarGone
    build_info: {"version", "protocol_version", "gpu_import"} of this build
    (gpu_import: "built in (CUDA 13.0 headers)" or "not built ...")
"""

from ._meshload import (  # noqa: F401  (re-exported)
    Batch,
    Client,
    JobMesh,
    MeshloadError,
    SidecarGone,
    Tensor,
    __version__,
    build_info,
)
from .ragged import Ragged  # noqa: F401  (with to_list and padded)

__all__ = [
    "Batch",
    "Client",
    "JobMesh",
    "MeshloadError",
    "Ragged",
    "SidecarGone",
    "Tensor",
    "__version__",
    "build_info",
]
