"""`dx.optim`: optimizers as update graphs, and learning-rate schedules."""

from deepx_flow.errors import no_attribute
from deepx_flow.optim.optimizers import (SGD, Adam, AdamW, Optimizer, RMSProp, Update, clip,
                                         global_norm)
from deepx_flow.optim.schedules import Constant, Cosine, StepDecay, Warmup

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "RMSProp", "Update", "clip", "global_norm",
           "Constant", "Cosine", "StepDecay", "Warmup"]


def __getattr__(name: str):
    raise no_attribute("dx.optim", name, __all__)
