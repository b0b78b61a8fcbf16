"""What a Dask worker imports to run deepx_flow's kernels: not the metadata database's
libraries (SQLAlchemy and SQLModel took a third of a second of a fresh worker's first task),
and the package's public names all still resolve, the database-backed ones on first use.
Each in a fresh Python process, as a new worker starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_fresh(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_kernel_modules_import_without_the_database_libraries():
    out = run_fresh("""
        import importlib, sys
        for name in ["deepx_flow.kernels.tasks", "deepx_flow.kernels.grouped",
                     "deepx_flow.kernels.attempt", "deepx_flow.kernels.fused_cpu",
                     "deepx_flow.storage.readers", "deepx_flow.train.sources",
                     "deepx_flow.train.data"]:
            importlib.import_module(name)
        print(sorted(m for m in ("sqlalchemy", "sqlmodel", "panel") if m in sys.modules))
    """)
    assert out.split() == ["[]"]


def test_every_public_name_resolves_to_what_it_names():
    out = run_fresh("""
        import inspect, types
        import deepx_flow as dx
        assert "sqlalchemy" not in __import__("sys").modules
        for name in dx.__all__:
            value = getattr(dx, name)
            assert name in dir(dx), name
            if name in ("checks", "nn", "optim", "random"):
                assert isinstance(value, types.ModuleType), name
            else:
                assert not isinstance(value, types.ModuleType), (name, value)
        assert dx.run is __import__("deepx_flow.sdk.run", fromlist=["run"]).run
        assert dx.materialize is __import__("deepx_flow.assets", fromlist=["x"]).materialize
        # importing the training package's modules first leaves dx.train the function
        import deepx_flow.train.data
        assert callable(dx.train) and inspect.isfunction(dx.train)
        try:
            dx.no_such_name
        except AttributeError as err:
            print(err)
    """)
    assert out.strip() == "dx has no attribute 'no_such_name'"
