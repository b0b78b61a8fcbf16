"""Each optimizer's parameters after 20 steps equal a NumPy float64 reference of the same
formulas (PyTorch's definitions) within 1e-10, schedules and clipping included.

The loss is a least-squares fit with a bias, whose gradient the reference computes by hand;
each deepx_flow step is one run of the graph `dx.grad` and `optimizer.update` build, fed the
previous step's parameters and state.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow import optim

STEPS = 20
RNG = np.random.default_rng(7)
X = RNG.standard_normal((16, 4))
Y = RNG.standard_normal((16, 3))
START = {"w": RNG.standard_normal((4, 3)), "c": RNG.standard_normal((3,))}


def numpy_gradients(p):
    r = X @ p["w"] + p["c"] - Y
    return {"w": X.T @ r, "c": r.sum(axis=0)}


def numpy_reference(opt, steps=STEPS):
    """The optimizer's formulas written out for NumPy, independently of its graph code."""
    p = {k: v.copy() for k, v in START.items()}
    state = {k: {n: np.zeros_like(v) for n, v in p.items()} for k in ("m", "v", "b")}
    norms = []
    for t in range(1, steps + 1):
        g = numpy_gradients(p)
        norm = math.sqrt(sum(float((v * v).sum()) for v in g.values()))
        norms.append(norm)
        if opt.clip_norm is not None:
            coef = min(1.0, opt.clip_norm / (norm + 1e-6))
            g = {k: v * coef for k, v in g.items()}
        lr = opt.lr * opt.schedule.factor(t)
        for k in p:
            gk, wd = g[k], opt.weight_decay
            if isinstance(opt, optim.SGD):
                gk = gk + wd * p[k]
                if opt.momentum:
                    state["b"][k] = opt.momentum * state["b"][k] + gk
                    gk = gk + opt.momentum * state["b"][k] if opt.nesterov else state["b"][k]
                p[k] = p[k] - lr * gk
            elif isinstance(opt, optim.Adam):
                b1, b2 = opt.betas
                if isinstance(opt, optim.AdamW):
                    p[k] = p[k] * (1 - lr * wd)
                else:
                    gk = gk + wd * p[k]
                state["m"][k] = b1 * state["m"][k] + (1 - b1) * gk
                state["v"][k] = b2 * state["v"][k] + (1 - b2) * gk * gk
                m_hat = state["m"][k] / (1 - b1 ** t)
                v_hat = state["v"][k] / (1 - b2 ** t)
                p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + opt.eps)
            else:  # RMSProp
                gk = gk + wd * p[k]
                state["v"][k] = opt.alpha * state["v"][k] + (1 - opt.alpha) * gk * gk
                d = gk / (np.sqrt(state["v"][k]) + opt.eps)
                if opt.momentum:
                    state["b"][k] = opt.momentum * state["b"][k] + d
                    d = state["b"][k]
                p[k] = p[k] - lr * d
    return p, norms


def deepx_steps(opt, steps=STEPS):
    params = {k: dx.input(k, v.shape, "float64") for k, v in START.items()}
    x, y = dx.input("x", X.shape, "float64"), dx.input("y", Y.shape, "float64")
    loss = 0.5 * ((x @ params["w"] + params["c"] - y) ** 2).sum()
    grads = dict(zip(params, dx.grad(loss, list(params.values()))))
    state0 = opt.init(params)
    state_in = {slot: {k: dx.input(f"{slot}_{k}", v.shape, "float64") for k, v in vals.items()}
                for slot, vals in state0.items()}
    scalars_in = {k: dx.input(f"s_{k}", (), "float64") for k in opt.scalars(1)}
    up = opt.update(params, grads, state_in, scalars_in)
    outs = {**{f"p_{k}": v for k, v in up.params.items()},
            **{f"{slot}_{k}": v for slot, vals in up.state.items() for k, v in vals.items()},
            "norm": up.grad_norm}
    values = {k: v.copy() for k, v in START.items()}
    state = {f"{slot}_{k}": np.zeros(START[k].shape) for slot, vals in state0.items()
             for k in vals}
    norms = []
    for t in range(1, steps + 1):
        feed = {"x": X, "y": Y, **values, **state,
                **{f"s_{k}": np.float64(v) for k, v in opt.scalars(t).items()}}
        got = dx.run(outs, inputs=feed)
        values = {k: got[f"p_{k}"] for k in START}
        state = {k: got[k] for k in state}
        norms.append(float(got["norm"]))
    return values, norms


OPTIMIZERS = [
    optim.SGD(lr=0.01),
    optim.SGD(lr=0.01, momentum=0.9, weight_decay=0.01),
    optim.SGD(lr=0.01, momentum=0.8, nesterov=True),
    optim.SGD(lr=0.05, schedule=optim.Warmup(5, then=optim.Cosine(15, floor=0.1))),
    optim.SGD(lr=0.05, momentum=0.5, schedule=optim.StepDecay(every=7, gamma=0.5)),
    optim.Adam(lr=0.05),
    optim.Adam(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    optim.AdamW(lr=0.05, weight_decay=0.1),
    optim.Adam(lr=0.05, clip_norm=1.0, schedule=optim.Cosine(20)),
    optim.RMSProp(lr=0.01),
    optim.RMSProp(lr=0.01, alpha=0.9, momentum=0.5, weight_decay=0.05),
    optim.SGD(lr=0.01, clip_norm=0.5),
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_twenty_steps_equal_the_numpy_reference(client, opt):
    expected, expected_norms = numpy_reference(opt)
    got, norms = deepx_steps(opt)
    for k in START:
        scale = 1.0 + np.abs(expected[k]).max()
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-10, atol=1e-10 * scale,
                                   err_msg=k)
        # The steps moved the parameters well past the tolerance.
        assert np.abs(expected[k] - START[k]).max() > 1e-3
    np.testing.assert_allclose(norms, expected_norms, rtol=1e-10)


def test_clipping_took_effect_in_the_clipped_cases():
    _, norms = numpy_reference(optim.SGD(lr=0.01))
    assert norms[0] > 1.0  # so clip_norm=1.0 and 0.5 above scale every early step


def test_schedules():
    cos = optim.Cosine(10, floor=0.2)
    assert cos.factor(1) == 1.0 and math.isclose(cos.factor(11), 0.2)
    assert math.isclose(cos.factor(6), 0.2 + 0.8 * 0.5)
    assert [optim.StepDecay(2, 0.5).factor(t) for t in range(1, 6)] == [1, 1, 0.5, 0.5, 0.25]
    w = optim.Warmup(4, then=optim.StepDecay(1, 0.5))
    assert [w.factor(t) for t in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 0.5]


@pytest.mark.parametrize("make,match", [
    (lambda: optim.SGD(lr=-1), "lr must be a finite number >= 0, got -1"),
    (lambda: optim.SGD(nesterov=True), "Nesterov momentum needs momentum"),
    (lambda: optim.Adam(betas=(1.0, 0.9)), r"betas\[0\] must be a finite number in \[0, 1\)"),
    (lambda: optim.Adam(clip_norm=0), r"clip_norm \(or None\) must be a finite number > 0"),
    (lambda: optim.Cosine(0), "total must be a positive integer"),
    (lambda: optim.SGD(schedule=0.5), "schedule must be a schedule"),
    # issue 30, item 6: taken before, and then NaN or inf in every parameter
    (lambda: optim.SGD(lr=float("nan")), "SGD: lr must be a finite number >= 0, got nan"),
    (lambda: optim.Adam(eps=float("inf")), "Adam: eps must be a finite number >= 0, got inf"),
    (lambda: optim.RMSProp(alpha=2), r"RMSProp: alpha must be a finite number in \[0, 1\]"),
    (lambda: optim.SGD(momentum=-0.5), "SGD: momentum must be a finite number >= 0"),
    (lambda: optim.SGD(momentum=0.9, nesterov="yes"), "SGD: nesterov must be True or False"),
    (lambda: optim.Adam(betas=0.9), r"Adam: betas must be a pair \(b1, b2\), got 0.9"),
    (lambda: optim.AdamW(weight_decay=10**400), "AdamW: weight_decay must be a finite number"),
    (lambda: optim.StepDecay(2, float("nan")), "StepDecay: gamma must be a finite number"),
    (lambda: optim.Cosine(10, floor=-1.0), "Cosine: floor must be a finite number >= 0"),
])
def test_bad_settings_are_refused_by_name(make, match):
    with pytest.raises(dx.GraphError, match=match):
        make()
