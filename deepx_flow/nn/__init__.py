"""`dx.nn`: layers as functions of named parameter tensors, losses, and activations.

Activations are the graph's own operators (`dx.nn.relu` is `dx.relu`), so a model is an
ordinary graph that the compiler fuses, chunks and differentiates.
"""

from deepx_flow.errors import no_attribute
from deepx_flow.nn.convolution import (avg_pool, conv, conv_transpose, global_avg_pool,
                                       global_max_pool, max_pool)
from deepx_flow.nn.functional import cross_entropy, dropout, gelu, leaky_relu, mse, one_hot
from deepx_flow.nn.layers import Embedding, Linear, Sequential
from deepx_flow.nn.normalization import (batch_norm, batch_norm_stats, group_norm, instance_norm,
                                         layer_norm)
from deepx_flow.sdk.functions import erf, log_softmax, relu, sigmoid, softmax, softplus, tanh

__all__ = ["Embedding", "Linear", "Sequential", "avg_pool", "batch_norm", "batch_norm_stats",
           "conv", "conv_transpose", "cross_entropy", "dropout", "erf", "gelu", "global_avg_pool",
           "global_max_pool", "group_norm", "instance_norm", "layer_norm", "max_pool",
           "leaky_relu", "log_softmax", "mse", "one_hot", "relu", "sigmoid", "softmax",
           "softplus", "tanh"]


def __getattr__(name: str):
    raise no_attribute("dx.nn", name, __all__)
