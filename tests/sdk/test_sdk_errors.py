"""Mistakes made in Python raise one GraphError at the line that made them: never a silently
changed shape, and never a raw TypeError, ValueError or AttributeError from inside."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.errors import DeepxError, GraphError


@pytest.mark.parametrize("shape", [(2.9, 3), (2, 3.0), ("2", 3), (None,), 2.5, "23", (True, 3),
                                   (np.float64(2), 3)])
def test_shapes_must_be_integers(shape):
    with pytest.raises(GraphError, match="shape"):
        dx.input("x", shape=shape)
    with pytest.raises(GraphError, match="shape"):
        dx.full(shape, 1.0)
    with pytest.raises(GraphError, match="shape"):
        dx.random.normal(shape)


def test_numpy_integers_are_integers():
    x = dx.input("x", shape=(np.int64(2), np.int32(3)))
    assert x.shape == (2, 3) and all(type(s) is int for s in x.shape)
    assert dx.zeros(np.int16(4)).shape == (4,)


def test_full_value_must_fit():
    with pytest.raises(GraphError, match="int8"):
        dx.full((3,), 1000, dtype="int8")
    with pytest.raises(GraphError, match="int32"):
        dx.full((3,), 1.5, dtype="int32")


@pytest.fixture
def x():
    return dx.input("x", (4, 5))


@pytest.mark.parametrize("index", [
    np.s_[::0], np.s_[1:3, ::0], np.s_[1.5], np.s_[[0, 1]], np.s_["a"],
    np.s_[np.array([True, False, True, False])], np.s_[..., ...], np.s_[0, 0, 0],
    np.s_[0:2.5], np.s_[None, 7], np.s_[{1: 2}],
])
def test_unsupported_or_bad_indices_raise_graph_error(x, index):
    with pytest.raises(GraphError):
        x[index]


def test_a_tensor_as_index_is_refused_with_a_hint(x):
    with pytest.raises(GraphError, match="dx.where"):
        x[x > 0]


@st.composite
def basic_index(draw, ndim):
    items = []
    for _ in range(draw(st.integers(0, ndim))):
        kind = draw(st.sampled_from(["int", "slice", "none"]))
        if kind == "int":
            items.append(draw(st.integers(-4, 3)))
        elif kind == "slice":
            bound = st.none() | st.integers(-7, 7)
            items.append(slice(draw(bound), draw(bound), draw(st.none() | st.integers(1, 4))))
        else:
            items.append(None)
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    return tuple(items)


@settings(max_examples=150, deadline=None)
@given(index=basic_index(2))
def test_indexing_gives_numpy_s_shape_or_graph_error(index):
    a = np.arange(20.0).reshape(4, 5)
    t = dx.input("x", (4, 5), "float64")
    try:
        want = a[index].shape
    except (IndexError, ValueError, TypeError):
        with pytest.raises(GraphError):
            t[index]
        return
    assert t[index].shape == want


@pytest.mark.parametrize("outputs", [5, None, "abc", b"x", [1, 2], {"a": 3}, 2.5,
                                     np.zeros(3)])
def test_run_of_what_is_not_a_tensor_is_a_graph_error(outputs):
    # Refused before any cluster starts: no client is given, and none is made.
    with pytest.raises(GraphError, match="dx.Tensor"):
        dx.run(outputs)
    with pytest.raises(GraphError, match="dx.Tensor"):
        dx.compile(outputs, cluster="graphs/clusters/8xH100.yaml")


def test_run_of_a_mixed_list_names_the_bad_entry(x):
    with pytest.raises(GraphError, match="output 'out1' is a int"):
        dx.run([x, 7])


@pytest.mark.parametrize("axis", [1.5, "a", [0.0], (0, "b"), True])
def test_reduction_axes_must_be_integers(x, axis):
    with pytest.raises(GraphError, match="integer"):
        x.sum(axis=axis)


@pytest.mark.parametrize("args", [("a",), (0, float("nan")), (0, float("inf")), (0, 5, 0),
                                  (0, 3, float("nan")), (None,), (0, "5")])
def test_arange_arguments_are_checked(args):
    with pytest.raises(GraphError, match="arange"):
        dx.arange(*args)


def test_arange_matches_numpy():
    for args in [(5,), (2, 9, 3), (0.5, 3.0, 0.5), (10, 0, -3), (3, 3)]:
        got = dx.arange(*args)
        assert got.shape == np.arange(*args).shape and got.dtype == np.arange(*args).dtype.name


@pytest.mark.parametrize("bad", [5, None, "ab", [1, 2]])
def test_concat_of_non_tensors_is_refused(bad):
    with pytest.raises(GraphError):
        dx.concat(bad)


@pytest.mark.parametrize("bad", [object(), "x", [1, 2]])
def test_non_tensor_operands_are_refused(x, bad):
    with pytest.raises(DeepxError):
        x + bad
