"""The activations of `dx.nn` (nn/activations.py) beyond their values on ordinary numbers
(tests/runtime/test_operators.py has those, under three chunk grids): NaN stays NaN in each,
infinities go where the formulas send them, float16 computes as NumPy does, and arguments
that are not numbers are GraphErrors."""

from __future__ import annotations

import numpy as np
import pytest

import deepx_flow as dx

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -3.0, 4.0], np.float32)
# each activation with its value at +inf and -inf
LIMITS = {
    "elu": (dx.nn.elu, np.inf, -1.0), "selu": (dx.nn.selu, np.inf, None),
    "celu": (dx.nn.celu, np.inf, -1.0), "thresholded_relu": (dx.nn.thresholded_relu, np.inf, 0.0),
    "hard_sigmoid": (dx.nn.hard_sigmoid, 1.0, 0.0), "hard_swish": (dx.nn.hard_swish, np.inf,
                                                                    None),
    "mish": (dx.nn.mish, np.inf, None), "leaky_relu": (dx.nn.leaky_relu, np.inf, -np.inf),
    "prelu": (lambda x: dx.nn.prelu(x, np.float32(0.25)), np.inf, -np.inf),
}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_nan_stays_nan_and_infinities_go_to_the_limits(client, name):
    fn, at_inf, at_minus_inf = LIMITS[name]
    x = dx.input("x", SPECIAL.shape, "float32")
    got = dx.run(fn(x), inputs={"x": SPECIAL}, client=client)
    assert got.dtype == np.float32
    assert np.isnan(got[0]), f"{name}(NaN) = {got[0]}"
    assert got[1] == at_inf, f"{name}(inf) = {got[1]}"
    if at_minus_inf is not None:
        assert got[2] == at_minus_inf, f"{name}(-inf) = {got[2]}"
    assert np.all(np.isfinite(got[3:]))


@pytest.mark.parametrize("name", ["elu", "selu", "celu", "hard_sigmoid", "hard_swish", "mish"])
def test_float16_follows_numpys_float16_within_its_rounding(client, name):
    fn = LIMITS[name][0]
    data = np.linspace(-6, 6, 49).astype(np.float16)
    x = dx.input("x", data.shape, "float16")
    got = dx.run(fn(x), inputs={"x": data}, client=client)
    want = dx.run(fn(dx.input("w", data.shape, "float64")), inputs={"w": data.astype(float)},
                  client=client)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(float), want, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.1", None, True])
def test_a_constant_that_is_not_a_finite_number_is_refused(bad):
    x = dx.input("x", (3,), "float32")
    with pytest.raises(dx.GraphError, match="must be a (positive )?finite number"):
        dx.nn.elu(x, bad)
    with pytest.raises(dx.GraphError, match="must be a (positive )?finite number"):
        dx.nn.hard_sigmoid(x, 0.2, bad)
    with pytest.raises(dx.GraphError, match="alpha must be a positive finite number"):
        dx.nn.celu(x, 0.0)


def test_integer_tensors_are_refused_where_the_formula_needs_floats():
    with pytest.raises(dx.GraphError, match="applies to floating-point tensors"):
        dx.nn.elu(dx.input("i", (3,), "int32"))
