"""meshload.Ragged: one local device's batch of variable-size samples.

A job whose samples differ in size (``spec.dataset.format: MegatronIndexed``)
stages each device's batch as a *ragged* tensor: the samples' elements back
to back (``values``, 1-D) and ``samples + 1`` int64 offsets into them
(``offsets``, in elements): sample ``k`` is ``values[offsets[k]:offsets[k+1]]``.
Both are zero-copy DLPack Tensors in the leased slot (host memory, or the
GPU the sidecar staged on), so any framework takes them as they are::

    for r in batch.tensors:                 # a meshload.Ragged per device
        v = torch.from_dlpack(r.values)     # no copy
        o = torch.from_dlpack(r.offsets)
        docs = r.to_list()                  # one view per sample
        x, lengths = r.padded(2048, pad_value=0)   # dense [samples, 2048] (a copy)

``to_list`` and ``padded`` work on the values' own device: NumPy for host
memory; CuPy, else PyTorch, for GPU memory (the offsets are read to the host
once per call).
"""

from ._meshload import Ragged


def _modules(device_type):
    """("numpy" | "cupy" | "torch", the module) for memory of DLPack device
    type `device_type` (1: host, 2: CUDA)."""
    if device_type == 1:
        import numpy as np

        return "numpy", np
    try:
        import cupy

        return "cupy", cupy
    except ImportError:
        pass
    try:
        import torch

        return "torch", torch
    except ImportError:
        raise RuntimeError(
            "this Ragged batch is in GPU memory: to_list() and padded() need CuPy or PyTorch "
            "(or take .values and .offsets with your framework's from_dlpack)"
        ) from None


def _arrays(r):
    kind, xp = _modules(r.device[0])
    values = xp.from_dlpack(r.values)
    offsets = xp.from_dlpack(r.offsets)
    if kind == "numpy":
        host = offsets.tolist()
    elif kind == "cupy":
        host = offsets.get().tolist()
    else:
        host = offsets.cpu().tolist()
    return kind, xp, values, host


def to_list(self):
    """One view of ``values`` per sample (no copy): NumPy arrays for host
    memory, CuPy arrays or PyTorch tensors for GPU memory."""
    _, _, values, offsets = _arrays(self)
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def padded(self, length=None, pad_value=0):
    """A dense ``[samples, length]`` array of the samples, each cut to
    ``length`` elements or filled up with ``pad_value``, and the lengths
    they keep (``min(len(sample), length)``, int64). ``length`` defaults to
    the longest sample. A copy, on the values' device."""
    kind, xp, values, offsets = _arrays(self)
    n = len(offsets) - 1
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    if length is None:
        length = max(lengths) if lengths else 0
    if length < 0:
        raise ValueError("length must be >= 0, got %d" % length)
    kept = [min(x, length) for x in lengths]
    if kind == "torch":
        out = xp.full((n, length), pad_value, dtype=values.dtype, device=values.device)
        for k in range(n):
            if kept[k]:
                out[k, : kept[k]] = values[offsets[k] : offsets[k] + kept[k]]
        return out, xp.tensor(kept, dtype=xp.int64, device=values.device)
    out = xp.full((n, length), pad_value, dtype=values.dtype)
    if n and length and values.size:
        # Every kept element at once: row k takes values[offsets[k] + j] for j < kept[k].
        starts = xp.asarray(offsets[:-1], dtype=xp.int64)[:, None]
        cols = xp.arange(length, dtype=xp.int64)[None, :]
        mask = cols < xp.asarray(kept, dtype=xp.int64)[:, None]
        idx = xp.where(mask, starts + cols, 0)
        out[mask] = values[idx[mask]]
    return out, xp.asarray(kept, dtype=xp.int64)


Ragged.to_list = to_list
Ragged.padded = padded

__all__ = ["Ragged"]
