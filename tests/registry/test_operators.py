"""Operator registration: built-ins plus operators found through real entry points.

Each test writes a tiny installed distribution (a `*.dist-info` folder with METADATA and
entry_points.txt, and its module) into tmp_path and puts tmp_path on sys.path, where
importlib.metadata finds it as it would any installed package.
"""

import sys
import warnings

import pytest
from sqlmodel import select

from deepx_flow.cli.main import main
from deepx_flow.meta.models import Operator
from deepx_flow.ops import OPS
from deepx_flow.registry.operators import (operator_table, register_operators,
                                           registered_operators)

MODULE = """\
from deepx_flow.ops import ELEMENTWISE, OpSpec


def same_as_input(node, inputs):
    return inputs[0].shape, inputs[0].dtype


def operators():
    return [OpSpec("{op}", ELEMENTWISE, 1, same_as_input, engines=("demo",),
                   flops_per_element=4, temp_bytes_per_element=8, doc="log(1 + exp(x))")]


NOT_SPECS = ["not an OpSpec"]
CLASHES = [OpSpec("matmul", ELEMENTWISE, 1, same_as_input)]
"""


@pytest.fixture(autouse=True)
def forget_test_modules():
    """Each test imports its own copy of the test distributions' modules."""
    yield
    for name in [m for m in sys.modules if m.startswith(("deepx_demo_", "deepx_broken_"))]:
        del sys.modules[name]


def install(tmp_path, monkeypatch, dist: str, entry_points: dict[str, str], op: str) -> str:
    """Write distribution `dist` (module `dist` with underscores) declaring `entry_points`
    in the deepx_flow.kernels group; return the module name."""
    module = dist.replace("-", "_")
    (tmp_path / f"{module}.py").write_text(MODULE.format(op=op))
    info = tmp_path / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[deepx_flow.kernels]\n{lines}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def test_builtins_only(sqlite_db):
    registered = register_operators(sqlite_db)
    assert {r.spec.name for r in registered} == set(OPS)
    with sqlite_db.session() as session:
        rows = session.exec(select(Operator)).all()
    assert {r.name: r.source for r in rows} == {name: "builtin" for name in OPS}
    matmul = next(r for r in rows if r.name == "matmul")
    assert (matmul.kind, matmul.engines, matmul.fusable) == ("matmul", "numpy,cupy", False)


def test_entry_point_operators_are_registered_and_listed(tmp_path, monkeypatch, sqlite_db,
                                                          capsys):
    module = install(tmp_path, monkeypatch, "deepx-demo-ops", {"demo": "deepx_demo_ops:operators"},
                     "demo_softplus")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good entry point warns about nothing
        found = {r.spec.name: r for r in registered_operators()}
    assert module == "deepx_demo_ops"
    assert found["demo_softplus"].source == "deepx-demo-ops"
    assert found["demo_softplus"].spec.engines == ("demo",)
    assert found["matmul"].source == "builtin"

    register_operators(sqlite_db)
    with sqlite_db.session() as session:
        row = session.get(Operator, "demo_softplus")
    assert (row.source, row.kind, row.engines, row.flops_per_element,
            row.temp_bytes_per_element, row.doc) == \
        ("deepx-demo-ops", "elementwise", "demo", 4.0, 8.0, "log(1 + exp(x))")

    assert main(["ops"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "demo_softplus" in ln]
    assert "deepx-demo-ops" in line and "demo" in line


@pytest.mark.parametrize("value, problem", [
    ("deepx_broken_missing:operators", "failed to load: ModuleNotFoundError"),
    ("deepx_broken_ops:no_such_name", "failed to load: AttributeError"),
    ("deepx_broken_ops:NOT_SPECS", "gave str where deepx_flow.ops.OpSpec was expected"),
    ("deepx_broken_ops:CLASHES", "operator 'matmul' is already registered"),
])
def test_a_broken_entry_point_warns_once_and_adds_nothing(tmp_path, monkeypatch, value,
                                                         problem):
    install(tmp_path, monkeypatch, "deepx-broken-ops",
            {"broken": value, "fine": "deepx_broken_ops:operators"}, "fine_op")
    with pytest.warns(RuntimeWarning) as caught:
        found = {r.spec.name: r for r in registered_operators()}
    messages = [str(w.message) for w in caught if "deepx_flow.kernels" in str(w.message)]
    assert len(messages) == 1, messages
    assert f"'broken = {value}'" in messages[0] and "deepx-broken-ops" in messages[0]
    assert problem in messages[0]
    # The other entry point of the same distribution and the built-ins are unaffected.
    assert found["fine_op"].source == "deepx-broken-ops"
    assert found["matmul"].source == "builtin" and set(OPS) <= set(found)
    assert "fine_op" in operator_table(list(found.values()))


def test_the_table_lists_only_engines_this_machine_has():
    """Without CuPy no operator lists it: one line says which engine is missing."""
    without = operator_table(installed={"numpy"}).splitlines()
    rows = [line for line in without[2:] if line.split()[0] in {"exp", "matmul", "sum"}]
    assert len(rows) == 3 and all(line.split()[2] == "numpy" for line in rows)
    assert "cupy" not in "\n".join(without[:-1])
    assert without[-1].startswith("cupy: ") and "not installed here" in without[-1]
    with_gpu = operator_table(installed={"numpy", "cupy"}).splitlines()
    assert any(line.split()[:3] == ["exp", "elementwise", "numpy,cupy"] for line in with_gpu)
    assert not any("not installed" in line for line in with_gpu)


def test_deepx_flow_ops_says_what_is_installed(capsys):
    import importlib.util

    from deepx_flow.cli.main import main
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    has_cupy = importlib.util.find_spec("cupy") is not None
    assert ("cupy: " in out and "not installed here" in out) is not has_cupy
    exp = next(line for line in out.splitlines() if line.startswith("exp "))
    assert exp.split()[2] == ("numpy,cupy" if has_cupy else "numpy")
