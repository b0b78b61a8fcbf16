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
    """The chunk shape of the Zarr array at `path` (None for `.npy` files, which have no
    chunks)."""
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
    version the array is, for that message. A `.npy` file that is not the array it was
    (shorter than its header says, or cut short while it is read) raises DataError too."""
    if _is_zarr(path):
        return verify.read_region(path, region, missing, origin)
    return npy.read_region(path, region)
