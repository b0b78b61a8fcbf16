"""The operator table (`deepx_flow/ops/operators.yaml`) equals Python's operators: its
primitives are the registry's (names, kinds, arity, attributes, required ones, gradients);
a default it gives is what the spec reader takes an absent attribute to mean (a spec with
the attribute left out reads as the same graph as one that writes the default); a required
one left out is refused naming it; and each composite is the Python SDK function it names,
parameter for parameter and default for default."""

import inspect
import math

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import GraphError
from deepx_flow.ops import OPS
from deepx_flow.ops.table import operator_table
from deepx_flow.spec.reader import document_to_graph

TABLE = operator_table()
PRIMITIVES = {n: op for n, op in TABLE.items() if op.kind == "primitive"}
COMPOSITES = {n: op for n, op in TABLE.items() if op.kind == "composite"}
COMPILER_ONLY = {"fused"}  # made by the compiler, never written by a user

# Operands that each primitive takes (name -> (shape, dtype)), for specs that use it.
F = ([2, 3], "float32")
OPERANDS = {
    "where": {"cond": ([2, 3], "bool"), "a": F, "b": F},
    "matmul": {"a": ([2, 3], "float32"), "b": ([3, 4], "float32")},
    "concat": {"t0": F, "t1": F},
    "take": {"x": ([4, 3], "float32"), "indices": ([2], "int64")},
    "gather_elements": {"x": F, "indices": ([2, 3], "int64")},
    "gather_nd": {"x": F, "indices": ([1, 1], "int64")},
    "scatter_elements": {"x": F, "indices": ([2, 3], "int64"), "updates": F},
    "scatter_nd": {"x": F, "indices": ([1, 1], "int64"), "updates": ([1, 3], "float32")},
    "conv": {"x": ([1, 1, 4, 4], "float32"), "w": ([2, 1, 3, 3], "float32")},
    "max_pool": {"x": ([1, 1, 4, 4], "float32")},
    "avg_pool": {"x": ([1, 1, 4, 4], "float32")},
}
# What a node must state or set for the spec to be a graph, beyond the table's defaults.
REQUIRED_VALUES = {"full": {"value": 1.5}, "random_normal": {"seed": 3},
                   "random_uniform": {"seed": 3}, "max_pool": {"kernel": [2, 2]},
                   "avg_pool": {"kernel": [2, 2]}}
STATED = {"full": ([2], "float32"), "arange": ([3], "int64"), "random_normal": ([3], "float32"),
          "random_uniform": ([3], "float32"), "reshape": ([3, 2], None),
          "cast": (None, "float64")}
UNREADABLE = {"input", "read_zarr"}  # (an input is written under `inputs`; read_zarr opens
#                                     its store when a graph is run, not when read)


def test_the_table_holds_the_registrys_primitives_and_no_name_twice():
    assert set(PRIMITIVES) == set(OPS) - COMPILER_ONLY
    assert not set(COMPOSITES) & set(OPS)  # (a composite never shadows an operator)


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
def test_a_primitive_is_declared_as_the_registry_declares_it(name):
    op, spec = PRIMITIVES[name], OPS[name]
    assert op.category == spec.kind
    if spec.arity is not None:
        assert len(op.inputs) == spec.arity and not op.variadic
    else:  # any number: one or more given, or two and the compiler's fused operands
        assert op.variadic or spec.compiler_attrs, name
    assert {a.name for a in op.attrs} == set(spec.attrs)
    required = {a.name for a in op.attrs if a.required}
    assert required <= set(spec.required_attrs)
    assert {s.name for s in op.states} == set(spec.declared)
    assert op.differentiable == (spec.vjp is not None)


def _spec(name, attrs: dict) -> dict:
    operands = OPERANDS.get(name, {given: F for given in PRIMITIVES[name].input_names()})
    node = {"id": "y", "op": name, "args": list(operands), "attrs": attrs}
    shape, dtype = STATED.get(name, (None, None))
    if shape is not None:
        node["shape"] = shape
    if dtype is not None:
        node["dtype"] = dtype
    return {"deepx": 1, "inputs": {n: {"shape": s, "dtype": d} for n, (s, d) in
                                   operands.items()},
            "nodes": [node], "outputs": ["y"]}


@pytest.mark.parametrize("name", sorted(set(PRIMITIVES) - UNREADABLE))
def test_an_absent_attribute_means_the_tables_default_and_a_required_one_is_named(name):
    op = PRIMITIVES[name]
    given = dict(REQUIRED_VALUES.get(name, {}))
    assert {a.name for a in op.attrs if a.required} <= set(given)
    bare = document_to_graph(_spec(name, given))
    for attr in op.attrs:
        if attr.required:
            without = {k: v for k, v in given.items() if k != attr.name}
            with pytest.raises(GraphError, match=attr.name):
                document_to_graph(_spec(name, without))
            continue
        written = document_to_graph(_spec(name, {**given, attr.name: attr.default}))
        assert written == bare, (name, attr.name, attr.default)


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_composite_is_the_python_function_it_names(name):
    op = COMPOSITES[name]
    module, _, function = op.python.rpartition(".")
    assert module in ("dx", "dx.nn")
    fn = getattr(dx if module == "dx" else dx.nn, function)
    params = inspect.signature(fn).parameters
    optional = set(op.optional_inputs())
    wanted = list(op.input_names()) + [a.name for a in op.attrs] + [s.name for s in op.states]
    assert sorted(params) == sorted(wanted), (name, list(params))
    for given in op.input_names():
        assert (params[given].default is None) == (given in optional), (name, given)
    for attr in op.attrs + op.states:
        default = params[attr.name].default
        if attr.required:
            assert default is inspect.Parameter.empty, (name, attr.name)
        elif default is inspect.Parameter.empty:  # (required in Python, but may be None)
            assert attr.default is None and "None" in str(params[attr.name].annotation)
        elif isinstance(default, float):
            assert math.isclose(attr.default, default, rel_tol=0, abs_tol=0), (name, attr.name)
        else:
            assert attr.default == default and type(attr.default) is type(default), \
                (name, attr.name, attr.default, default)


def test_every_attribute_has_a_type_an_sdk_can_write():
    for op in TABLE.values():
        for attr in op.attrs:
            if attr.default is not None and attr.type in ("int", "float", "number"):
                assert isinstance(attr.default, (int, float)) and \
                    not isinstance(attr.default, bool), (op.name, attr.name)
            if attr.default is not None and attr.type == "bool":
                assert isinstance(attr.default, bool), (op.name, attr.name)
        assert op.since == "0.1.0" or tuple(map(int, op.since.split("."))) > (0, 1, 0)


@pytest.mark.parametrize("name", sorted(n for n, op in COMPOSITES.items()
                                        if op.differentiable))
def test_a_differentiable_composite_passes_a_gradient_to_its_first_input(name):
    """Built by its Python function on float operands, the gradient of its sum with respect
    to its first input is a tensor of that input's shape, and runs to finite values."""
    op = COMPOSITES[name]
    shapes = {"x": (2, 3, 4, 4), "w": (3, 3, 2, 2), "logits": (4, 5), "predictions": (4, 5),
              "targets": (4, 5), "slope": (1,), "scale": (3,), "bias": (3,), "mean": (3,),
              "var": (3,)}
    rng = np.random.default_rng(0)
    args = {}
    for given in op.input_names():
        if given in op.optional_inputs():
            continue
        if given in ("indices", "labels"):
            continue
        data = rng.uniform(0.5, 1.5, shapes.get(given, (2, 3, 4, 4))).astype(np.float32)
        args[given] = dx.input(given, data.shape, "float32")
    attrs = {"cross_entropy": {}, "dropout": {"rate": 0.5, "seed": 1, "step": 0},
             "pad": {"widths": [[0, 0], [0, 0], [1, 1], [1, 1]]},
             "group_norm": {"groups": 1}, "clip": {"lo": 0.7, "hi": 1.2},
             "take_along_axis": {}, "scatter": {}, "scatter_add": {}}.get(name, {})
    module, _, function = op.python.rpartition(".")
    fn = getattr(dx if module == "dx" else dx.nn, function)
    extra = {}
    if name == "cross_entropy":
        extra["labels"] = dx.input("labels", (4,), "int64")
    if name in ("take_along_axis", "scatter", "scatter_add"):
        extra["indices"] = dx.input("indices", (2, 3, 4, 4), "int64")
    y = fn(**args, **extra, **attrs)
    first = next(iter(args.values()))
    gradient = dx.grad(dx.sum(dx.cast(y, "float32")), first)
    assert gradient.shape == first.shape


EXTRA = """version: 1
operators:
  - name: {name}
    kind: composite
    python: "{python}"
    inputs: [{inputs}]
    attrs: {{}}
    states: {{}}
    dtype: same
    differentiable: true
    since: "0.2.0"
    doc: "an extra"
"""


@pytest.mark.parametrize("name, python, inputs, says", [
    ("relu", "m:f", "x", "is already in the table"),
    ("op", "m:f", "x", "is a member of the SDKs' Graph"),
    ("Soft-Sign", "m:f", "x", "is not a lower-case identifier"),
    ("softsign", "m.f", "x", "is not named package.module:function"),
    ("softsign", "m:f", "var", "has an input named as a keyword"),
])
def test_an_extra_table_is_refused_with_its_reason(tmp_path, monkeypatch, name, python,
                                                   inputs, says):
    from deepx_flow.errors import SettingsError
    path = tmp_path / "extra.yaml"
    path.write_text(EXTRA.format(name=name, python=python, inputs=inputs))
    monkeypatch.setenv("DEEPX_EXTRA_OPERATORS", str(path))
    with pytest.raises(SettingsError, match=f"DEEPX_EXTRA_OPERATORS: .*{says}"):
        operator_table()
    path.with_name("broken.yaml").write_text("version: [")
    monkeypatch.setenv("DEEPX_EXTRA_OPERATORS", str(path.with_name("broken.yaml")))
    with pytest.raises(SettingsError, match="cannot be read as an operator table"):
        operator_table()


@pytest.mark.parametrize("body, says", [
    ("    raise KeyError('scale')", "KeyError: 'scale'"),
    ("    return 3", "gave int, not one tensor"),
])
def test_an_extra_function_that_fails_is_a_graph_error_naming_it(tmp_path, monkeypatch, body,
                                                                 says):
    (tmp_path / f"extra_fail_{len(body)}.py").write_text(f"def f(x):\n{body}\n")
    path = tmp_path / "extra.yaml"
    path.write_text(EXTRA.format(name="softsign", python=f"extra_fail_{len(body)}:f",
                                 inputs="x"))
    monkeypatch.setenv("DEEPX_EXTRA_OPERATORS", str(path))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "softsign", "args": ["x"]}], "outputs": ["y"]}
    with pytest.raises(GraphError, match=says) as caught:
        document_to_graph(spec)
    assert caught.value.node == "y"
