"""The loss curve's columns: step order kept, values a log axis cannot show left out."""

import math

import numpy as np

from deepx_flow.ui.loss_curve import curves


def test_curves_keep_step_order_and_drop_what_a_log_axis_cannot_show():
    train, held = curves({"loss": [(1, 2.0), (2, math.nan), (3, 0.5), (4, 0.0)],
                          "eval_loss": [(2, 1.5)], "lr": [(1, 0.1)]})
    np.testing.assert_array_equal(train["step"], [1, 3])
    np.testing.assert_array_equal(train["loss"], [2.0, 0.5])
    np.testing.assert_array_equal(held["step"], [2])
    empty, none = curves({})
    assert len(empty["step"]) == len(none["loss"]) == 0
