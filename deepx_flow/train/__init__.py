"""Training: the step graph, the data order and the data-parallel loop (`dx.train`)."""

from deepx_flow.train.loop import Fit, train

__all__ = ["Fit", "train"]
