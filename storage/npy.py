"""Reading regions of `.npy` files with plain reads, never a memory map.

Why: a mapped file cut short while it is read (truncated, rewritten, a full disk, a network
file system) kills the process with SIGBUS at the first page past its new end, which no
`try` catches; a worker that read `.npy` inputs through `np.load(mmap_mode="r")` died that
way. A read returns fewer bytes instead, which is a DataError naming the file (as Zarr
chunks are read: `direct.py`).

The header is parsed with NumPy's own reader (`numpy.lib.format`: format versions 1 and
2), and the file must be as long as the header says, and the same (size, modification and
change times) after the region is read as before: a file changed while it is read may give
bytes of neither version, and is a DataError too (a change is seen as far as the file
system's clock tells two times apart: a truncation and rewrite within one tick of it, both
during the read, is not). A region ((start, stop) per axis) is
read with `readinto` straight into the block returned:

- one read when it is one contiguous run of the file: it spans whole trailing axes, and
  a single index of every axis before the first it takes several of (whole rows, the
  common case);
- otherwise either one read per contiguous run, or reads of the whole rows (along the
  first axis the region takes several indices of) that hold it, in pieces of at most
  `SPAN_PIECE_BYTES`, copied out. The rows are read when their bytes are no more than the
  region's plus `READ_COST_BYTES` per run that per-run reads would make (a read costs
  about what copying that many bytes does).

Files in Fortran order are read as the C-order array of the reversed shape, then
transposed; big-endian files are byte-swapped, so blocks come back in native order.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from deepx_flow.errors import DataError, InputError
from deepx_flow.kernels import recycled

READ_COST_BYTES = 16 << 10  # the bytes one read call costs as much time as copying
SPAN_PIECE_BYTES = 16 << 20  # rows read at once when a region is cut out of whole rows
ZIP_MAGIC = b"PK\x03\x04"  # a .npz archive (np.savez): a zip file


class NotNpy(ValueError):
    """The file is not a `.npy` array this reader can read; the message says why."""


@dataclass(frozen=True)
class Header:
    """What a `.npy` header says: the array's shape and dtype (as stored, byte order
    included), its order, and where its data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int

    @property
    def nbytes(self) -> int:
        """The bytes of data the file must hold after the header."""
        return math.prod(self.shape) * self.dtype.itemsize

    def length_problem(self, size: int) -> str | None:
        """What is wrong with a file of `size` bytes for this header (None when none is)."""
        if size < self.offset + self.nbytes:
            return (f"is {size:,} bytes, the header says {self.offset + self.nbytes:,} "
                    f"({self.offset:,} of header and {self.nbytes:,} of "
                    f"{self.dtype.name} data of shape {self.shape}): cut short")
        return None


def read_header(file) -> Header:
    """The header of the open `.npy` file `file` (its position left at the data); NotNpy
    when it is not one."""
    from numpy.lib import format as npy_format
    magic = file.read(len(ZIP_MAGIC))
    if magic == ZIP_MAGIC:
        raise NotNpy("is a .npz archive of arrays, not a .npy array; save the array with "
                     "np.save, or give np.load(path)[name]")
    file.seek(0)
    try:
        version = npy_format.read_magic(file)
        reader = {(1, 0): npy_format.read_array_header_1_0,
                  (2, 0): npy_format.read_array_header_2_0}.get(version)
        if reader is None:  # 3.0: field names in UTF-8, a structured dtype
            raise ValueError(f"format version {version[0]}.{version[1]}, which is written "
                             "for structured dtypes only")
        shape, fortran_order, dtype = reader(file)
    except (ValueError, EOFError, OSError, SyntaxError) as err:
        raise NotNpy(f"cannot be read as a .npy array: {err}") from None
    if dtype.hasobject:
        raise NotNpy(f"holds Python objects ({dtype}), which are read only by unpickling; "
                     "save an array of numbers")
    return Header(tuple(int(s) for s in shape), dtype, bool(fortran_order), file.tell())


def array_info(path: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of the `.npy` file at `path`, from its header: InputError naming
    it when it is not a `.npy` array, DataError when it is shorter than its header says."""
    try:
        with open(path, "rb") as file:
            head = read_header(file)
            size = os.fstat(file.fileno()).st_size
    except NotNpy as err:
        raise InputError(f"{path} {err}") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err}") from None
    problem = head.length_problem(size)
    if problem:
        raise DataError(f"{path} {problem}; write the file again", uri=path, problem=problem)
    return head.shape, head.dtype.name


def read_region(path: str, region) -> np.ndarray:
    """The block `region` ((start, stop) per axis) of the `.npy` file at `path`, as a
    C-contiguous array in native byte order. DataError naming the file when it is not the
    array the region was planned on (another header, shorter than its header says, or cut
    short or changed while it is read)."""
    region = tuple((int(lo), int(hi)) for lo, hi in region)
    with open(path, "rb", buffering=0) as file:
        before = _version(file)
        try:
            head = read_header(file)
        except NotNpy as err:
            raise _damaged(path, str(err)) from None
        problem = head.length_problem(before[0])
        if problem:
            raise _damaged(path, problem)
        if len(region) != len(head.shape) or any(
                not 0 <= lo <= hi <= n for (lo, hi), n in zip(region, head.shape)):
            raise _damaged(path, f"holds shape {head.shape} now, which has no region "
                                 f"{region}: it was replaced since the run was planned")
        shape, stored_region = head.shape, region
        if head.fortran_order:  # the C-order array of the reversed shape, transposed
            shape, stored_region = shape[::-1], region[::-1]
        out = recycled.empty(tuple(hi - lo for lo, hi in stored_region), head.dtype)
        if out.size:
            _read_into(file, path, head.offset, shape, stored_region, out)
        if _version(file) != before:
            raise _damaged(path, "changed while it was read")
    if head.fortran_order:
        out = np.ascontiguousarray(out.T)
    if not head.dtype.isnative:
        out.byteswap(inplace=True)
        out = out.view(head.dtype.newbyteorder("="))
    return out


def _version(file) -> tuple[int, int, int]:
    """The size and modification and change times of the open file: a read whose bytes may
    mix two versions of the file (one truncated meanwhile has the tail of its last page
    zeroed, which a read copying that page may take) ends with other ones."""
    stat = os.fstat(file.fileno())
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _read_into(file, path: str, offset: int, shape, region, out: np.ndarray) -> None:
    """Read `region` of the C-order array of `shape` stored from `offset` into `out`."""
    itemsize = out.dtype.itemsize
    strides = [itemsize * math.prod(shape[i + 1:]) for i in range(len(shape))]
    ext = [hi - lo for lo, hi in region]
    start = offset + sum(lo * s for (lo, _), s in zip(region, strides))
    # k: the last axis the region does not span whole; from it on, one index of each axis
    # before it is one contiguous run of the file
    k = max((i for i, ((lo, hi), n) in enumerate(zip(region, shape)) if (lo, hi) != (0, n)),
            default=-1)
    flat = out.reshape(-1).view(np.uint8)
    if all(e == 1 for e in ext[:max(k, 0)]):  # one run: whole rows, or the whole array
        _read_exact(file, path, start, flat)
        return
    j = next(i for i in range(k) if ext[i] > 1)  # the first axis of several indices
    runs = math.prod(ext[:k])
    if ext[j] * strides[j] <= out.nbytes + runs * READ_COST_BYTES:
        rows_at = offset + sum(lo * s for (lo, _), s in zip(region[:j + 1], strides))
        _read_rows(file, path, rows_at, shape, region, j, out)
        return
    run_bytes, data = flat.size // runs, memoryview(flat)
    runs_at = start + sum(np.ix_(*[np.arange(e) * s for e, s in zip(ext[:k], strides)]))
    fd, pread = file.fileno(), getattr(os, "preadv", None)
    for r, at in enumerate(np.ravel(runs_at).tolist()):
        part = data[r * run_bytes:(r + 1) * run_bytes]
        # (the loop is the cost of these reads: one call each where it can)
        if pread is None or pread(fd, [part], at) != run_bytes:
            _read_exact(file, path, at, part)  # the rest, or DataError if the file ended


def _read_rows(file, path: str, at: int, shape, region, j: int, out: np.ndarray) -> None:
    """Read the whole rows along axis `j` (an index of it and all that follows) that hold
    `region`, the first at `at`, a piece at a time, and copy the region out of them."""
    row_shape = tuple(shape[j + 1:])
    row_bytes = math.prod(row_shape) * out.dtype.itemsize
    (lo, hi), inner = region[j], tuple(slice(a, b) for a, b in region[j + 1:])
    rows = min(hi - lo, max(1, SPAN_PIECE_BYTES // max(row_bytes, 1)))
    buffer = np.empty((rows, *row_shape), out.dtype)
    target = out.reshape(out.shape[j:])  # (the axes before j have one index each)
    for first in range(lo, hi, rows):
        n = min(rows, hi - first)
        piece = buffer[:n]
        _read_exact(file, path, at + (first - lo) * row_bytes, piece.reshape(-1).view(np.uint8))
        target[first - lo:first - lo + n] = piece[(slice(None), *inner)]


def _read_exact(file, path: str, at: int, view) -> None:
    """Fill the bytes `view` (an array or memoryview of bytes) from position `at`: DataError
    if the file ends first (it was cut short while it was read). A read returns at most
    about 2 GiB, so large ones take several."""
    data, want, done = memoryview(view), len(view), 0
    while done < want:
        got = _pread(file, data[done:], at + done)
        if not got:
            raise _damaged(path, f"was cut short while it was read (it ended {want - done:,} "
                                 f"bytes before the {want:,} read from byte {at:,})")
        done += got


def _pread(file, data: memoryview, at: int) -> int:
    """Read into `data` from position `at` (one call); the bytes read."""
    if hasattr(os, "preadv"):  # one system call, where a seek and a read are two
        return os.preadv(file.fileno(), [data], at)
    file.seek(at)
    return file.readinto(data)


def _damaged(path: str, problem: str) -> DataError:
    return DataError(f".npy file {path} {problem}; write the file again or restore it from "
                     f"a copy", uri=path, problem=problem)


__all__ = ["Header", "NotNpy", "read_header", "array_info", "read_region"]
