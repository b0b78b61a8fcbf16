"""`dx.pad` against `np.pad` for every mode, random widths and shapes (hypothesis), through
the engine; bad widths and modes are named errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pad_matches_numpy(client, data):
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    mode = data.draw(st.sampled_from(["constant", "edge", "reflect", "wrap"]))
    limit = {"reflect": lambda n: n - 1, "wrap": lambda n: n}.get(mode, lambda n: 6)
    widths = [(data.draw(st.integers(0, limit(n))), data.draw(st.integers(0, limit(n))))
              for n in shape]
    if mode == "reflect" and any(n == 1 and (a or b) for n, (a, b) in zip(shape, widths)):
        widths = [(0, 0) if n == 1 else w for n, w in zip(shape, widths)]
    array = np.random.default_rng(data.draw(st.integers(0, 9))).standard_normal(shape)
    x = dx.input("x", shape, "float64")
    if mode == "constant":
        got = dx.run(dx.pad(x, widths, value=-2.5), inputs={"x": array}, client=client)
        want = np.pad(array, widths, constant_values=-2.5)
    else:
        got = dx.run(dx.pad(x, widths, mode=mode), inputs={"x": array}, client=client)
        want = np.pad(array, widths, mode=mode)
    np.testing.assert_array_equal(got, want)


def test_bad_pads_are_named():
    x = dx.input("x", (3, 4), "float32")
    with pytest.raises(dx.GraphError, match="mode 'mirror' is not one of"):
        dx.pad(x, 1, mode="mirror")
    with pytest.raises(dx.GraphError, match="non-negative integers for each of the 2 axes"):
        dx.pad(x, [(1, -1), (0, 0)])
    with pytest.raises(dx.GraphError, match="mode reflect needs 2 or more elements along axis 0"):
        dx.pad(dx.input("y", (1, 4), "float32"), [(1, 0), (0, 0)], mode="reflect")
