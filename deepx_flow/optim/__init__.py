"""`dx.optim`: optimizers as update graphs, and learning-rate schedules."""

from deepx_flow.optim.optimizers import (SGD, Adam, AdamW, Optimizer, RMSProp, Update, clip,
                                         global_norm)
from deepx_flow.optim.schedules import Constant, Cosine, StepDecay, Warmup

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "RMSProp", "Update", "clip", "global_norm",
           "Constant", "Cosine", "StepDecay", "Warmup"]
