"""`dx.nn`: layers as functions of named parameter tensors, losses, and activations.

Activations are the graph's own operators (`dx.nn.relu` is `dx.relu`) or short compositions
of them (`nn/activations.py`: elu, selu, hard_swish, ...), so a model is an ordinary graph
that the compiler fuses, chunks and differentiates.
"""

from deepx_flow.errors import no_attribute
from deepx_flow.nn.activations import (celu, elu, gelu, hard_sigmoid, hard_swish, leaky_relu,
                                       mish, prelu, selu, thresholded_relu)
from deepx_flow.nn.attention import causal_attention
from deepx_flow.nn.convolution import (avg_pool, conv, conv_transpose, global_avg_pool,
                                       global_max_pool, max_pool)
from deepx_flow.nn.functional import cross_entropy, dropout, mse, one_hot
from deepx_flow.nn.layers import Embedding, Linear, Sequential
from deepx_flow.nn.normalization import (batch_norm, batch_norm_stats, group_norm, instance_norm,
                                         layer_norm)
from deepx_flow.nn.transformer import TransformerLM
from deepx_flow.sdk.functions import erf, log_softmax, relu, sigmoid, softmax, softplus, tanh

__all__ = ["Embedding", "Linear", "Sequential", "TransformerLM", "avg_pool", "batch_norm",
           "batch_norm_stats", "causal_attention", "celu", "conv", "conv_transpose",
           "cross_entropy", "dropout", "elu", "erf", "gelu", "global_avg_pool",
           "global_max_pool", "group_norm", "hard_sigmoid", "hard_swish",
           "instance_norm", "layer_norm", "max_pool", "leaky_relu", "log_softmax",
           "mish", "mse", "one_hot", "prelu", "relu", "selu", "sigmoid", "softmax",
           "softplus", "tanh", "thresholded_relu"]


def __getattr__(name: str):
    raise no_attribute("dx.nn", name, __all__)
