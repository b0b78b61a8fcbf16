"""Read regions of arrays kept in files: `.npy` (memory-mapped) and Zarr (any fsspec URL).

Tasks call these on workers, so a run reads each chunk where it is computed and the driver
never holds the whole input. `array_info` lets the driver check shape and dtype up front.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deepx_flow.errors import InputError
from deepx_flow.storage import verify


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
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        raise InputError(f"cannot read {path} as a .npy array: {err}") from None
    if not isinstance(arr, np.ndarray):  # np.load opens a .npz archive whatever its name
        arr.close()
        raise InputError(f"{path} is a .npz archive of arrays, not a .npy array; save the "
                         "array with np.save, or give np.load(path)[name]")
    return tuple(arr.shape), arr.dtype.name


def zarr_info(uri: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of the Zarr array at `uri` (a path or fsspec URL, whatever its name),
    from its metadata only; InputError naming it when it cannot be opened as one."""
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        arr = zarr.open_array(uri, mode="r")
        dtype = np.dtype(arr.dtype).name
    except Exception as err:  # zarr and fsspec raise many types for a missing or bad store
        reason = " ".join(str(err).split()) or type(err).__name__
        reason = reason if len(reason) <= 160 else reason[:157] + "..."
        raise InputError(f"cannot open Zarr array {uri}: {reason}") from None
    return tuple(int(s) for s in arr.shape), dtype


def storage_chunks(path: str) -> tuple[int, ...] | None:
    """The chunk shape of the Zarr array at `path` (None for `.npy` files, which are read
    by memory map and have no chunks)."""
    if not _is_zarr(path):
        return None
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        return tuple(int(c) for c in zarr.open_array(path, mode="r").chunks)
    except Exception:  # array_info has already reported a bad store
        return None


def read_region(path: str, region, missing: str = "error", origin: dict | None = None
                ) -> np.ndarray:
    """The block `region` ((start, stop) per axis) of the array at `path`, as a NumPy array.
    Zarr chunks are checked as they are read (`storage/verify.py`): one that is missing
    (unless `missing="fill"`) or damaged raises DataError; `origin` names the stored asset
    version the array is, for that message."""
    if _is_zarr(path):
        return verify.read_region(path, region, missing, origin)
    index = tuple(slice(lo, hi) for lo, hi in region)
    return np.array(np.load(path, mmap_mode="r", allow_pickle=False)[index])
