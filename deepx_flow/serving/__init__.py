"""Serving models over the Open Inference Protocol (KServe v2): a repository of models in
Triton's layout, each loaded, checked and kept resident, answered by `deepx-flow serve`
(`docs/serving.md`)."""

from deepx_flow.serving.package import package

__all__ = ["package"]
