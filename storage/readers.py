"""Read regions of arrays kept in files: `.npy` (`npy.py`: plain reads, no memory map) and Zarr
(any fsspec URL).

Tasks call these on workers, so a run reads each chunk where it is computed and the driver
never holds the whole input. `array_info` lets the driver check shape and dtype up front.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deepx_flow.errors import InputError
from deepx_flow.storage import npy, verify


def _is_zarr(path: str) -> bool:
    return path.rstrip("/").endswith(".zarr") or "://" in path and not path.endswith(".npy")


def array_info(path: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the array at `path`, or InputError naming the file."""
    if _is_zarr(path):
        return zarr_info(path)
    if not Path(path).exists():
        raise InputError(f"input file {path} does not exist")
    if not Path(path).is_file():
        what = "a folder" if Path(path).is_dir() else "a device or other special file"
        raise InputError(f"input file {path} is not a regular file ({what}); give a .npy "
                         "file, or a Zarr array by its path")
    return npy.array_info(path)


def zarr_info(uri: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the Zarr array at `uri` (a path or fsspec URL, whatever its name),
    from its metadata only; InputError naming it when it cannot be opened as one."""
    shape, dtype, _ = _zarr_metadata(uri)
    return shape, dtype


def storage_chunks(path: str) -> tuple[int, ...] | None:
    """The chunk shape of the Zarr array at `path` (None for `.npy` files, which have no
    chunks)."""
    if not _is_zarr(path):
        return None
    try:
        return _zarr_metadata(path)[2]
    except InputError:  # array_info has already reported a bad store
        return None


# A local array's metadata, by its metadata file's bytes: a run reads it twice (building the
# graph, checking it before the run), and opening it through zarr took about 2 ms each time,
# reading the file 20 us. A rewritten array has other bytes, so it is opened again.
_METADATA_FILES = ("zarr.json", ".zarray")
_metadata: dict = {}


def _chunks(arr) -> tuple[int, ...] | None:
    try:
        return tuple(int(c) for c in arr.chunks)
    except Exception:  # an array zarr cannot give one chunk shape for (sharded ones)
        return None


def _zarr_metadata(uri: str) -> tuple[tuple[int, ...], str, tuple[int, ...] | None]:
    """(shape, dtype, chunk shape or None) of the Zarr array at `uri`; InputError naming it
    when it cannot be opened as one."""
    stamp = None
    if "://" not in uri:
        for name in _METADATA_FILES:
            try:
                stamp = (name, (Path(uri) / name).read_bytes())
                break
            except (OSError, ValueError):  # none there (ValueError: a NUL in the path)
                continue
    found = _metadata.get(uri) if stamp is not None else None
    if found is not None and found[0] == stamp:
        return found[1]
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        arr = zarr.open_array(uri, mode="r")
        info = (tuple(int(s) for s in arr.shape), np.dtype(arr.dtype).name, _chunks(arr))
    except Exception as err:  # zarr and fsspec raise many types for a missing or bad store
        reason = " ".join(str(err).split()) or type(err).__name__
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise InputError(f"cannot open Zarr array {uri}: {reason}") from None
    if stamp is not None:
        if len(_metadata) > 1024:
            _metadata.clear()
        _metadata[uri] = (stamp, info)
    return info


def read_region(path: str, region, missing: str = "error", origin: dict | None = None
                ) -> np.ndarray:
    """The block `region` ((start, stop) per axis) of the array at `path`, as a NumPy array.
    Zarr chunks are checked as they are read (`storage/verify.py`): one that is missing
    (unless `missing="fill"`) or damaged raises DataError; `origin` names the stored asset
    version the array is, for that message. A `.npy` file that is not the array it was
    (shorter than its header says, or cut short while it is read) raises DataError too."""
    if _is_zarr(path):
        return verify.read_region(path, region, missing, origin)
    return npy.read_region(path, region)
