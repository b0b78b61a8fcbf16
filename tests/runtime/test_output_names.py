"""Asking for one tensor several times works; different tensors of one name stay an error.

`dx.run([x, x])` on a named input once failed with "output name 'x' is used twice".
"""

import numpy as np
import pytest

import deepx_flow as dx

X = np.arange(12.0).reshape(4, 3)


def test_a_named_input_asked_for_twice(client):
    x = dx.input("x", X.shape, "float64")
    a, b = dx.run([x, x], inputs={"x": X}, client=client)
    np.testing.assert_array_equal(a, X)
    np.testing.assert_array_equal(b, X)
    assert a is not b  # two arrays, not one shared twice


def test_one_tensor_under_two_names_and_between_others(client):
    x = dx.input("x", X.shape, "float64")
    y = dx.exp(x) - 1.0
    want = np.exp(X) - 1.0
    got = dx.run({"a": y, "b": y}, inputs={"x": X}, client=client)
    assert sorted(got) == ["a", "b"]
    np.testing.assert_allclose(got["a"], want, rtol=1e-12)
    np.testing.assert_array_equal(got["a"], got["b"])
    first, double, again = dx.run([y, y * 2, y], inputs={"x": X}, client=client)
    np.testing.assert_allclose(first, want, rtol=1e-12)
    np.testing.assert_allclose(double, 2 * want, rtol=1e-12)
    np.testing.assert_array_equal(again, first)
    persisted = dx.persist([x, y, x], inputs={"x": X}, client=client)
    np.testing.assert_array_equal(persisted[2].to_numpy(), X)


def test_names_given_by_position_do_not_collide():
    x = dx.input("x", X.shape, "float64")
    other = dx.input("out1", (2,), "float64")  # a tensor that is itself called out1
    y = x + 1.0
    graph = dx.build_graph([x, x, other, y])
    assert graph.outputs == (("x", "x"), ("out1_1", "x"), ("out1", "out1"),
                             ("out3", y.node.id))
    # and the spec of such a graph reads back as the same graph
    assert dx.from_yaml(dx.to_yaml([x, x, other, y])) == graph


def test_two_different_tensors_of_one_name_are_still_an_error():
    a = (dx.input("x", X.shape, "float64") + 1.0).named("h")
    b = (dx.input("x", X.shape, "float64") * 2.0).named("h")
    with pytest.raises(dx.GraphError, match="output name 'h' is used twice"):
        dx.compile([a, b])
