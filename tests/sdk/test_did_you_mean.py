"""A misspelt name of `dx`, `dx.nn`, `dx.random`, `dx.optim` or a Tensor says which name was
meant, as one `dx.UnknownNameError`: a DeepxError, and an AttributeError, so that `hasattr`
and `getattr` with a default work as they always did."""

from __future__ import annotations

import pickle

import pytest

import deepx_flow as dx


@pytest.mark.parametrize("get, message", [
    (lambda: dx.reul, "dx has no attribute 'reul'; did you mean dx.relu?"),
    (lambda: dx.materialise, "did you mean dx.materialize?"),  # one imported on first use
    (lambda: dx.nn.lyer_norm, "dx.nn has no attribute 'lyer_norm'; did you mean "
                              "dx.nn.layer_norm?"),
    (lambda: dx.nn.leakyrelu, "did you mean dx.nn.leaky_relu?"),
    (lambda: dx.random.normall, "dx.random has no attribute 'normall'; did you mean "
                                "dx.random.normal?"),
    (lambda: dx.optim.adamw, "did you mean dx.optim.AdamW?"),
    (lambda: dx.input("x", (2, 3)).sumn, "Tensor has no attribute 'sumn'; did you mean "
                                         "Tensor.sum?"),
    (lambda: dx.input("x", (2, 3)).astpye, "did you mean Tensor.astype?"),
])
def test_a_misspelt_name_says_what_was_meant(get, message):
    with pytest.raises(dx.UnknownNameError) as info:
        get()
    assert message in str(info.value)
    assert isinstance(info.value, dx.DeepxError) and isinstance(info.value, AttributeError)
    assert info.value.exit_code == 2


def test_a_name_like_none_suggests_nothing():
    with pytest.raises(dx.UnknownNameError) as info:
        dx.xyzzy  # noqa: B018
    assert str(info.value) == "dx has no attribute 'xyzzy'"


def test_hasattr_and_getattr_with_a_default_still_work():
    t = dx.input("x", (2, 3))
    assert not hasattr(dx, "reul") and not hasattr(dx.nn, "reul")
    assert not hasattr(t, "reul") and not hasattr(t, "__dask_graph__")
    assert getattr(dx.random, "nope", 7) == 7 and getattr(t, "nope", None) is None
    assert hasattr(dx, "relu") and hasattr(t, "sum")
    # Private and special names are probes (NumPy's, Dask's, copy's): no suggestion.
    with pytest.raises(AttributeError, match=r"^Tensor has no attribute '__array_struct__'$"):
        t.__array_struct__  # noqa: B018


def test_the_error_survives_pickling():
    """Errors raised on workers travel back to the driver pickled."""
    with pytest.raises(dx.UnknownNameError) as info:
        dx.reul  # noqa: B018
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is dx.UnknownNameError and str(again) == str(info.value)
