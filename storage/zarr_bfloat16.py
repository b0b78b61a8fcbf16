"""bfloat16 in Zarr v3: the extension data type "bfloat16", for zarr-python.

Zarr v3 names bfloat16 as an extension data type (`"data_type": "bfloat16"`; the Rust
implementation zarrs reads and writes it): two bytes per element, little-endian by default
through the `bytes` codec as float16 is, a fill value written as a JSON number, "NaN",
"Infinity", "-Infinity", or the element's bits in hex ("0x7fc0"). zarr-python 3.1 has no
such type: given an ml_dtypes bfloat16 array it says "No Zarr data type found".

This module defines it (`BFloat16`, a zarr-python `ZDType` over ml_dtypes' bfloat16) and adds
it to zarr-python's registry when imported. deepx_flow's storage imports zarr from here
(`from deepx_flow.storage.zarr_bfloat16 import zarr`, inside the functions that use it: zarr
takes a quarter of a second to import), so `dx.read_zarr`, `dx.persist` to Zarr and asset
versions read and write bfloat16 as it is, two bytes an element, in arrays other Zarr v3
implementations can read. Other zarr-python programs read them after
`import deepx_flow.storage.zarr_bfloat16`, or by themselves where deepx_flow is installed:
pyproject.toml declares the type under zarr-python's entry-point group `zarr.data_type`.
Zarr v2 has no name for bfloat16: writing one as Zarr v2 is refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import zarr
from zarr.dtype import Float16, data_type_registry

from deepx_flow.ir.dtypes import BFLOAT16


@dataclass(frozen=True, kw_only=True)
class BFloat16(Float16):
    """The Zarr v3 data type "bfloat16" over ml_dtypes' NumPy bfloat16.

    Float16's JSON and scalar handling fits, since both are 16-bit IEEE-style floats, except a
    hexadecimal fill value, which holds bfloat16's own bits.
    """

    dtype_cls = type(BFLOAT16)
    _zarr_v3_name = "bfloat16"
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()  # Zarr v2 has no bfloat16

    def to_json(self, zarr_format):
        if zarr_format == 2:
            raise ValueError("Zarr v2 has no bfloat16 data type; write the array as Zarr v3")
        return super().to_json(zarr_format)

    def from_json_scalar(self, data, *, zarr_format):
        if zarr_format == 3 and isinstance(data, str) and data.startswith("0x") \
                and len(data) == 6:
            bits = struct.unpack(">H", bytes.fromhex(data[2:]))[0]
            return np.array(bits, dtype=np.uint16).view(BFLOAT16)[()]
        return super().from_json_scalar(data, zarr_format=zarr_format)


def register() -> None:
    """Add `BFloat16` to zarr-python's data types (idempotent, cheap)."""
    data_type_registry.register(BFloat16._zarr_v3_name, BFloat16)


register()

__all__ = ["BFloat16", "register", "zarr"]
