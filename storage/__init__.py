"""Storage engines: where chunked tensors are read from and written to.

`readers` reads `.npy` (`npy`) and Zarr inputs on the workers, and `tokens` names the data at
a path for the task keys; `zarr_store` writes tensors held on the cluster to new Zarr v3
arrays (local paths or any fsspec URL), one task per chunk; `verify` checks stored chunks as
they are read (present, checksum) and whole versions; `engines` puts Zarr, cluster memory
and third-party engines (entry-point group `deepx_flow.storage`) behind one protocol for
assets.
"""
