"""meshload.jax: each step's batch as the job's global ``jax.Array``.

The sidecar knows the job's device mesh and the batch's PartitionSpec
(``spec.mesh``), and tells the client in its hello; this module turns a
process's per-device tensors into the global array the training step takes,
the scenario of JAX's distributed data loading guide done for the user::

    import jax
    import meshload
    import meshload.jax

    jax.distributed.initialize()          # multi-process jobs, as usual
    with meshload.Client() as client:     # $MESHLOAD_SOCKET
        for batch in client:
            x = meshload.jax.global_array(batch)   # NamedSharding(mesh, P(batch_axes))
            state = train_step(state, x)

Devices. The job's global device ``g`` (``mesh.devices.flat[g]``, row-major
over ``spec.mesh.axes``) is local device ``g % devicesPerProcess`` of the
meshload process ``g // devicesPerProcess``. In this process, local device
``i`` is the JAX device the tensor ``batch.tensors[i]`` lives on: the GPU the
sidecar staged it on (found by UUID), or, for batches in host memory under
JAX's CPU backend, the ``i``-th local CPU device (run JAX with
``jax_num_cpu_devices`` = devicesPerProcess). Under a GPU backend with host
staging, each tensor is copied to the ``i``-th local device (the sidecar's
log says why it staged on the host). The other processes' devices are learnt
once per job with one ``process_allgather`` (every process calls
``global_array`` for the same step, as it calls the training step), which
also checks that every JAX process serves a different meshload process of
the same job. Nothing is assumed: a JAX process count, a local device count
or a mesh that disagrees with the job raises ``MeshMismatch`` naming both
sides.

Zero-copy. Host tensors are imported with ``jax.dlpack.from_dlpack(...,
copy=False)``: the JAX array is a view of the staged slot (the staging layout
aligns every tensor to 256 bytes, beyond XLA's 64), and JAX raising is the
only alternative to a silent copy. The arrays keep the slot leased until JAX
frees them (see ``meshload``).

Ragged batches (variable-size samples, ``meshload.Ragged``) become dense
global arrays by padding: ``global_array(batch, pad_to=L)`` returns the
``(global batch, L)`` array of the samples, each cut to ``L`` elements or
filled with ``pad_value``, and the ``(global batch,)`` int64 array of the
lengths they keep, both sharded like a dense batch. Padding is a copy on
each device (``Ragged.padded``); ``L`` is the caller's, the same in every
process, so the global shape is known without a collective.

Fields. A WebDataset, MDS or TFRecord job's batch has named fields (``batch.fields``);
``global_array(batch)`` then returns a dict from field name to its global
array (a ragged field padded to ``pad_to`` as above, a dense one as is), and
``global_array(batch, field=name)`` one field's. A job that skips samples
without a field (``missingField: Skip``) can leave devices with fewer rows:
a dense field's global array needs every device to hold as many, which is
checked (pad such fields yourself from ``batch.field(name)``).

JAX is imported on first use; ``import meshload`` works without it.
"""

import math
import threading

__all__ = [
    "MeshMismatch",
    "global_array",
    "local_arrays",
    "mesh",
    "partition_spec",
    "sharding",
]


class MeshMismatch(ValueError):
    """The JAX side (processes, devices, mesh) disagrees with the job the sidecar serves."""


def _jax():
    import jax  # noqa: PLC0415 (lazy: meshload works without JAX)
    import jax.dlpack  # noqa: F401,PLC0415

    return jax


def _describe(job_mesh):
    axes = ", ".join("%s=%d" % (n, s) for n, s in job_mesh.axes)
    return "(%s), batch axes (%s)" % (axes, ", ".join(job_mesh.batch_axes))


def partition_spec(batch):
    """The batch's ``PartitionSpec``: dimension 0 sharded over the job's batch
    axes in order (none: every device holds the whole batch)."""
    from jax.sharding import PartitionSpec  # noqa: PLC0415

    axes = tuple(batch.mesh.batch_axes)
    return PartitionSpec(axes) if axes else PartitionSpec()


def _local_targets(batch):
    """The JAX device each of this process's tensors belongs on, in local order."""
    jax = _jax()
    kinds = {t.device[0] for t in batch.tensors}
    if kinds == {2}:
        gpus = {d.local_hardware_id: d for d in jax.local_devices(backend="gpu")}
        out = []
        for t in batch.tensors:
            ordinal = t.device[1]
            if ordinal not in gpus:
                raise MeshMismatch(
                    "the sidecar staged global device %d on this process's GPU %d, which JAX does not see "
                    "(JAX's local GPUs: %s)" % (t.global_device, ordinal, sorted(gpus)))
            out.append(gpus[ordinal])
        return out
    if kinds != {1}:
        raise MeshMismatch("a batch whose tensors are on DLPack devices %s; expected CPU (1) or CUDA (2)" % sorted(kinds))
    local = jax.local_devices()
    if len(local) != len(batch.tensors):
        raise MeshMismatch(
            "job %r gives each process %d devices (spec.mesh.devicesPerProcess), but JAX has %d local %s devices "
            "in this process%s" % (batch.job, len(batch.tensors), len(local), local[0].platform.upper(),
                                   " (set jax_num_cpu_devices=%d)" % len(batch.tensors)
                                   if local[0].platform == "cpu" else ""))
    return list(local)


def local_arrays(batch):
    """One single-device ``jax.Array`` per tensor of ``batch``, in local device
    order, each on the JAX device it belongs on (see the module docstring).
    GPU batches and host batches under the CPU backend are zero-copy views of
    the staged slot; host batches under a GPU backend are copied there."""
    jax = _jax()
    targets = _local_targets(batch)
    out = []
    for t, device in zip(batch.tensors, targets):
        if t.device[0] == 2 or device.platform == "cpu":
            src = t if t.device[0] == 2 else _OnCpuDevice(t, device.local_hardware_id)
            a = _from_dlpack(jax, src)
            if device not in a.devices():
                raise MeshMismatch("global device %d was imported onto %s, not %s" % (t.global_device, a.devices(), device))
        else:
            # Host staging under a GPU backend: one host-to-device copy.
            a = jax.device_put(_from_dlpack(jax, t), device)
        out.append(a)
    return out


def _from_dlpack(jax, src):
    try:
        return jax.dlpack.from_dlpack(src, copy=False)
    except TypeError:
        # JAX before 0.4.31 has no `copy` and takes only a legacy capsule; it
        # says nothing of the stream XLA reads on: stream=-1, so a GPU slot
        # goes back only after a device synchronization.
        return jax.dlpack.from_dlpack(src.__dlpack__(stream=-1))


class _OnCpuDevice:
    """A host tensor presented as living on JAX's CPU device ``hardware_id``
    (DLPack's CPU device number), so JAX imports it there without a copy.
    The capsule is the tensor's own: it keeps the slot leased."""

    __slots__ = ("_tensor", "_id")

    def __init__(self, tensor, hardware_id):
        self._tensor = tensor
        self._id = hardware_id

    def __dlpack_device__(self):
        return (1, self._id)

    def __dlpack__(self, **kwargs):
        kwargs.pop("dl_device", None)  # ours: the tensor's own device is (1, 0)
        return self._tensor.__dlpack__(**kwargs)


# (job, job mesh, meshload process, local JAX device ids) -> jax.sharding.Mesh
_meshes = {}
_meshes_lock = threading.Lock()


def mesh(batch):
    """The job's mesh as a ``jax.sharding.Mesh`` over every process's devices:
    ``mesh.devices.flat[g]`` is the job's global device ``g``. The first call
    for a job is a collective in multi-process runs (every process makes it).
    A batch of named fields has one mesh for all of them."""
    if _named_fields(batch):
        batch = _FieldView(batch, batch.fields[0])
    return _mesh_of(batch)


def _mesh_of(batch):
    jax = _jax()
    job_mesh = batch.mesh
    local = _local_targets(batch)
    key = (batch.job, job_mesh, batch.process, tuple(d.id for d in local))
    with _meshes_lock:
        if key in _meshes:
            return _meshes[key]
    built = _build_mesh(jax, batch, job_mesh, local)
    with _meshes_lock:
        _meshes[key] = built
    return built


def _build_mesh(jax, batch, job_mesh, local):
    import numpy as np  # noqa: PLC0415 (JAX depends on it)
    from jax.sharding import Mesh  # noqa: PLC0415

    L = job_mesh.devices_per_process
    P = job_mesh.processes
    if jax.process_count() != P:
        raise MeshMismatch(
            "job %r has %d processes (spec.mesh.processes), but JAX runs %d%s" %
            (batch.job, P, jax.process_count(),
             " (call jax.distributed.initialize in every trainer)" if jax.process_count() == 1 else ""))
    for t, d in zip(batch.tensors, local):
        if t.global_device // L != batch.process:
            raise MeshMismatch("the sidecar of process %d staged global device %d, which the job gives to process %d" %
                               (batch.process, t.global_device, t.global_device // L))
    # Row i: JAX process i's meshload process, a digest of the job, and the
    # ids of its JAX devices for local devices 0..L-1.
    job_digest = _digest("%s|%s" % (batch.job, _describe(job_mesh)))
    # int32: JAX without jax_enable_x64 gathers 64-bit integers as 32-bit.
    mine = np.array([batch.process, job_digest] + [d.id for d in local], dtype=np.int32)
    if P == 1:
        rows = mine[None, :]
    else:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        rows = np.asarray(multihost_utils.process_allgather(mine))
    by_process = {}
    for jax_process, row in enumerate(rows):
        if int(row[1]) != job_digest:
            raise MeshMismatch(
                "JAX process %d is fed by a sidecar of another job (or another mesh) than this process's job %r, "
                "mesh %s" % (jax_process, batch.job, _describe(job_mesh)))
        p = int(row[0])
        if p in by_process:
            raise MeshMismatch("JAX processes %d and %d are both fed by the sidecar of meshload process %d" %
                               (by_process[p][0], jax_process, p))
        by_process[p] = (jax_process, [int(x) for x in row[2:]])
    devices_by_id = {d.id: d for d in jax.devices()}
    flat = []
    for p in range(P):
        _, ids = by_process[p]
        flat.extend(devices_by_id[i] for i in ids)
    names = tuple(n for n, _ in job_mesh.axes)
    shape = tuple(s for _, s in job_mesh.axes)
    return Mesh(np.array(flat, dtype=object).reshape(shape), names)


def _digest(text):
    import hashlib  # noqa: PLC0415

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def sharding(batch, mesh_=None):
    """``NamedSharding(mesh, partition_spec(batch))``."""
    from jax.sharding import NamedSharding  # noqa: PLC0415

    return NamedSharding(mesh_ if mesh_ is not None else _mesh_of(batch), partition_spec(batch))


def _check_user_mesh(batch, user_mesh, local):
    job_mesh = batch.mesh
    want = tuple(job_mesh.axes)
    got = tuple(zip(user_mesh.axis_names, user_mesh.devices.shape))
    if got != want:
        raise MeshMismatch("the given mesh has axes %s, but job %r's mesh is %s" %
                           (", ".join("%s=%d" % a for a in got), batch.job, _describe(job_mesh)))
    flat = list(user_mesh.devices.flat)
    for t, d in zip(batch.tensors, local):
        if flat[t.global_device] != d:
            raise MeshMismatch(
                "the given mesh puts the job's global device %d on %s, but its data is on %s: build the mesh in the "
                "job's global device order (or leave it out: meshload.jax.mesh(batch))" %
                (t.global_device, flat[t.global_device], d))


def _is_ragged(batch):
    from . import Ragged  # noqa: PLC0415

    kinds = {isinstance(t, Ragged) for t in batch.tensors}
    return kinds == {True}


def _padded_local_arrays(batch, pad_to, pad_value):
    """Each device's Ragged padded to ``pad_to`` and its lengths, as
    single-device ``jax.Array`` pairs on the device the batch belongs on."""
    jax = _jax()
    targets = _local_targets(batch)
    values, lengths = [], []
    for r, device in zip(batch.tensors, targets):
        x, kept = r.padded(pad_to, pad_value)
        if r.device[0] == 2:
            # On the GPU already (CuPy or PyTorch arrays): imported in place.
            values.append(jax.dlpack.from_dlpack(x))
            lengths.append(jax.dlpack.from_dlpack(kept))
        else:
            values.append(jax.device_put(x, device))
            lengths.append(jax.device_put(kept, device))
    return values, lengths


class _FieldView:
    """One field of a batch of named fields, seen as a batch of that field
    alone (its tensors; every other attribute the batch's)."""

    fields = ("",)

    def __init__(self, batch, name):
        self._batch = batch
        self.field = name
        self.tensors = batch.field(name)

    def __getattr__(self, attr):
        return getattr(self._batch, attr)


def _named_fields(batch):
    return tuple(getattr(batch, "fields", ("",))) != ("",)


def global_array(batch, mesh=None, pad_to=None, pad_value=0, field=None):  # noqa: A002 (the JAX word)
    """The step's global batch as one ``jax.Array`` of shape
    ``(global batch, *sample shape)`` sharded ``NamedSharding(mesh,
    P(batch_axes))``; replicas along the other axes share their shard.

    ``mesh``: a ``jax.sharding.Mesh`` to use instead of the job's
    (``meshload.jax.mesh(batch)``); its axes must be the job's and its
    devices in the job's global device order, which is checked.
    Every process calls it with its own batch of the same step.

    A ragged batch (``meshload.Ragged`` tensors) needs ``pad_to``: the
    result is then ``(values, lengths)``, the samples padded (or cut) to
    ``(global batch, pad_to)`` with ``pad_value``, and their kept lengths,
    ``(global batch,)`` int64 (int32 without ``jax_enable_x64``).

    A batch of named fields (WebDataset, MDS, TFRecord): a dict from field name to
    its global array (``pad_to`` applies to its ragged fields), or with
    ``field`` that field's alone.
    """
    if _named_fields(batch):
        if field is not None:
            return global_array(_FieldView(batch, field), mesh, pad_to, pad_value)
        out = {}
        for name in batch.fields:
            view = _FieldView(batch, name)
            out[name] = global_array(view, mesh, pad_to if _is_ragged(view) else None, pad_value)
        return out
    if field is not None:
        raise ValueError("job %r's batches have no named fields; leave field out" % batch.job)
    jax = _jax()
    if _is_ragged(batch):
        if pad_to is None:
            raise ValueError("batch %d of job %r holds variable-size samples (meshload.Ragged): give pad_to, the "
                             "length every sample is padded or cut to" % (batch.step, batch.job))
        values, lengths = _padded_local_arrays(batch, pad_to, pad_value)
        the_mesh = _checked_mesh(batch, mesh, [next(iter(a.devices())) for a in values])
        shards = _shards(batch)
        rows = values[0].shape[0] * shards
        sh = sharding(batch, the_mesh)
        return (jax.make_array_from_single_device_arrays((rows, pad_to), sh, values),
                jax.make_array_from_single_device_arrays((rows,), sh, lengths))
    if pad_to is not None:
        raise ValueError("pad_to is for ragged batches; job %r's samples all have one shape" % batch.job)
    arrays = local_arrays(batch)
    the_mesh = _checked_mesh(batch, mesh, [next(iter(a.devices())) for a in arrays])
    per_device = arrays[0].shape
    rows = sorted({a.shape[0] for a in arrays})
    if len(rows) > 1:
        raise ValueError("step %d of job %r: field %r holds %s rows on this process's devices (samples without a "
                         "field were skipped, missingField: Skip); a global array needs as many on every device"
                         % (batch.step, batch.job, getattr(batch, "field", ""), rows))
    global_shape = (per_device[0] * _shards(batch),) + tuple(per_device[1:])
    return jax.make_array_from_single_device_arrays(global_shape, sharding(batch, the_mesh), arrays)


def _shards(batch):
    sizes = dict(batch.mesh.axes)
    return math.prod(sizes[a] for a in batch.mesh.batch_axes)


def _checked_mesh(batch, mesh, local):  # noqa: A002
    if mesh is None:
        return _mesh_of(batch)
    _check_user_mesh(batch, mesh, local)
    return mesh

