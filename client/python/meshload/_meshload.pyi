"""Type stubs of meshload._meshload, the C++ extension (meshload_module.cc).

The objects are documented in the extension's docstrings (``help(meshload.Client)``)
and in the package docstring (``help(meshload)``).
"""

from types import TracebackType
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type, TypedDict, Union

__version__: str

class _BuildInfo(TypedDict):
    version: str
    protocol_version: int
    gpu_import: str

build_info: _BuildInfo

class MeshloadError(RuntimeError):
    """An error from the meshload client or the sidecar; ``.code`` names its kind."""

    code: str

class SidecarGone(ConnectionError):
    """The sidecar went away and did not come back within the reconnect attempts."""

    code: str

class JobMesh:
    """The job's device mesh (spec.mesh) as the sidecar resolved it."""

    @property
    def processes(self) -> int: ...
    @property
    def devices_per_process(self) -> int: ...
    @property
    def axes(self) -> Tuple[Tuple[str, int], ...]:
        """((name, size), ...) in mesh order (row-major, last axis fastest)."""
    @property
    def batch_axes(self) -> Tuple[str, ...]:
        """The mesh axes the batch dimension is sharded over, in order."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Tensor:
    """One local device's part of a batch: a zero-copy view of the leased slot."""

    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str:
        """numpy-style dtype name, e.g. 'uint8', 'bfloat16'."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def global_device(self) -> int:
        """The device's number in the job's mesh."""
    @property
    def ids_checksum(self) -> int:
        """SampleIdsChecksum of the sample ids staged for this device."""
    @property
    def step(self) -> int: ...
    @property
    def data_ptr(self) -> int:
        """Address of the first element."""
    @property
    def device(self) -> Tuple[int, int]:
        """(DLPack device type, device id); (1, 0) is host memory, (2, n) CUDA device n."""
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule viewing this tensor ('dltensor_versioned' when max_version >= (1, 0))."""

class Ragged:
    """One local device's batch of variable-size samples: values and offsets, zero-copy."""

    @property
    def values(self) -> Tensor:
        """The samples' elements back to back (1-D)."""
    @property
    def offsets(self) -> Tensor:
        """samples + 1 int64 offsets into values, in elements."""
    @property
    def samples(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def global_device(self) -> int: ...
    @property
    def ids_checksum(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def device(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    def to_list(self) -> List[Any]:
        """One view of values per sample (meshload/ragged.py)."""
    def padded(self, length: Optional[int] = None, pad_value: Any = 0) -> Tuple[Any, Any]:
        """A dense [samples, length] copy and the lengths kept."""

class Batch:
    """One step's batch; its slot is released when it, its Tensors and every DLPack export are gone."""

    @property
    def step(self) -> int: ...
    @property
    def tensors(self) -> Union[List[Union[Tensor, Ragged]], List[Dict[str, Union[Tensor, Ragged]]]]:
        """One Tensor (a Ragged for variable-size samples) per local device, in the job's local device order;
        for a job of named fields (WebDataset, MDS, TFRecord), one dict per device from field name to its Tensor or Ragged."""
    @property
    def fields(self) -> Tuple[str, ...]:
        """The batch's field names; ('',) for the formats whose sample is one tensor."""
    def field(self, name: str) -> List[Union[Tensor, Ragged]]:
        """One field's Tensor (or Ragged) per local device; KeyError naming the fields for another name."""
    @property
    def wait_seconds(self) -> float:
        """How long next() blocked for this batch."""
    @property
    def slot(self) -> int: ...
    @property
    def mesh(self) -> JobMesh: ...
    @property
    def job(self) -> str: ...
    @property
    def process(self) -> int: ...

class Client:
    """Connects to a meshload sidecar and yields its batches in step order."""

    def __init__(
        self, socket_path: str = "", start_step: Optional[int] = None, max_reconnect_attempts: int = 8
    ) -> None: ...
    def next(self, timeout: Optional[float] = None) -> Batch:
        """The next step's Batch; TimeoutError after `timeout` seconds, SidecarGone when the sidecar does not come back."""
    def close(self) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    def __enter__(self) -> "Client": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    @property
    def next_step(self) -> int: ...
    @property
    def reconnects(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def job(self) -> str: ...
    @property
    def process(self) -> int: ...
    @property
    def devices(self) -> List[Dict[str, Union[int, str]]]:
        """[{"global_index": int, "kind": int, "uuid": str}, ...] in local device order."""
    @property
    def mesh(self) -> JobMesh: ...
    @property
    def slots(self) -> int: ...
    @property
    def steps_per_epoch(self) -> int: ...
    @property
    def global_batch(self) -> int: ...
    @property
    def socket_path(self) -> str: ...
