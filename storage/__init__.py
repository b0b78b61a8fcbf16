"""Storage engines: where chunked tensors are read from and written to (Zarr through fsspec)."""
