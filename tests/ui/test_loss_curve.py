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


def test_a_curve_without_points_is_not_in_the_legend():
    from deepx_flow.ui.loss_curve import HELD_OUT, TRAIN, figure, legend, show
    no_eval = curves({"loss": [(1, 2.0), (2, 1.0)]})
    assert legend(*no_eval) == {TRAIN: True, HELD_OUT: False}
    one_eval = curves({"loss": [(1, 2.0), (2, 1.0)], "eval_loss": [(2, 1.5)]})
    assert legend(*one_eval) == {TRAIN: True, HELD_OUT: True}
    assert legend(*curves({"eval_loss": [(2, -1.0)]})) == {TRAIN: False, HELD_OUT: False}
    fig = figure(*no_eval)

    def listed():
        return {i.label["value"]: (i.visible, {r.visible for r in i.renderers})
                for i in fig.legend[0].items}
    assert listed() == {TRAIN: (True, {True}), HELD_OUT: (False, {False})}
    show(fig, *one_eval)  # a live page's next reading has an evaluation
    assert listed() == {TRAIN: (True, {True}), HELD_OUT: (True, {True})}
