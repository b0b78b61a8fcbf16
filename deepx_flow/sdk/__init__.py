"""The Python SDK: the Tensor handle, operator functions, random tensors, graph building."""
