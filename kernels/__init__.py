"""Operator engines: per-chunk kernels on NumPy (CPU) and CuPy (GPU), and fused kernels.

Kernels are pure functions of chunks. The device is chosen in one place,
`deepx_flow.kernels.dispatch`; CuPy is imported lazily there, so this package imports on
machines without CuPy or a GPU.
"""
