"""Where a training step's parameters and optimizer state live (issue 35): replicated,
sharded (ZeRO-3) or split along a matmul's axis (tensor parallel), chosen per parameter by
`choose.place_parameters` from the workers' memory and the cluster's links. One strategy
per file; each says what it keeps, what it gathers and which collectives a step needs."""

from deepx_flow.compiler.placing.choose import (PARAMETER_SHARE, STRATEGIES, ParameterPlacement,
                                                Placed, place_parameters)
from deepx_flow.compiler.placing.params import TrainedParameter, WeightUse, trained_parameters

__all__ = ["PARAMETER_SHARE", "STRATEGIES", "ParameterPlacement", "Placed", "TrainedParameter",
           "WeightUse", "place_parameters", "trained_parameters"]
