"""The `deepx-flow` command, run as a separate process: results, messages and exit codes.

Runs use a Dask cluster this test starts on loopback (`--scheduler`), so each command does
not have to start its own.
"""

import logging
import subprocess
import sys

import numpy as np
import pytest
import zarr
from distributed import LocalCluster

from tests.helpers import assert_sums_close, without_run_headers

GOOD = """\
deepx: 1
inputs:
  x: {shape: [50, 8], dtype: float64}
nodes:
  - {id: w, op: random_normal, shape: [8, 4], dtype: float64, attrs: {seed: 3}}
  - {id: h, op: matmul, args: [x, w]}
  - {id: y, op: relu, args: [h]}
  - {id: s, op: sum, args: [y], attrs: {axes: [0]}}
outputs: [y, {total: s}]
"""


@pytest.fixture(scope="module")
def scheduler():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, host="127.0.0.1",
                      protocol="tcp",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        yield cluster.scheduler_address


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "g.yaml").write_text(GOOD)
    x = np.random.default_rng(0).standard_normal((50, 8))
    np.save(tmp_path / "x.npy", x)
    return tmp_path, x


def test_run_writes_named_outputs(files, scheduler):
    tmp, x = files
    res = cli("run", "g.yaml", "--input", "x=x.npy", "--output", "y=y.npy", "--output",
              "total=t.npy", "--scheduler", scheduler, cwd=tmp)
    assert res.returncode == 0, res.stderr
    import deepx_flow as dx
    w = dx.run(dx.random.normal((8, 4), seed=3, dtype="float64"))
    y = np.maximum(x @ w, 0)
    assert_sums_close(np.load(tmp / "y.npy"), y, np.abs(x) @ np.abs(w))
    assert_sums_close(np.load(tmp / "t.npy"), y.sum(axis=0), np.abs(y).sum(axis=0))
    assert "total: shape (4,)" in res.stdout


def test_explain_for_a_cluster_file_and_ops():
    res = cli("explain", "graphs/mlp_forward.yaml", "--cluster", "graphs/clusters/8xH100.yaml")
    assert res.returncode == 0, res.stderr
    assert "8xH100" in res.stdout and "compute/communication ratio" in res.stdout
    res = cli("ops")
    assert res.returncode == 0 and "matmul" in res.stdout
    # The engines listed are this machine's: CuPy's only where it is installed.
    import importlib.util
    if importlib.util.find_spec("cupy") is None:
        assert "numpy,cupy" not in res.stdout and "cupy: " in res.stdout \
            and "it is not installed here" in res.stdout
    else:
        assert "numpy,cupy" in res.stdout


BAD_GRAPHS = {
    "bad_yaml": ("deepx: 1\nnodes: [unclosed\n", "line"),
    "unknown_op": (GOOD.replace("op: relu", "op: frobnicate"), "frobnicate"),
    "cycle": (GOOD.replace("args: [x, w]", "args: [x, y]").replace("shape: [8, 4]",
                                                                     "shape: [8, 4]"), "cycle"),
    "shape_mismatch": (GOOD.replace("shape: [8, 4]", "shape: [9, 4]"), "'h'"),
    "dtype_mismatch": (GOOD.replace("{id: y, op: relu, args: [h]}",
                                    "{id: y, op: relu, args: [h], dtype: float32}"), "'y'"),
    "missing_node": (GOOD.replace("args: [h]}", "args: [hh]}"), "hh"),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_bad_graph_exits_2_with_one_line(tmp_path, case):
    text, needle = BAD_GRAPHS[case]
    (tmp_path / "g.yaml").write_text(text)
    np.save(tmp_path / "x.npy", np.zeros((50, 8)))
    res = cli("run", "g.yaml", "--input", "x=x.npy", cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "g.yaml" in res.stderr and needle in res.stderr


@pytest.mark.parametrize("args,needle", [
    (["--input", "x=nope.npy"], "nope.npy"),                # missing file
    (["--input", "x=wrong.npy"], "shape (50, 8)"),         # wrong shape
    (["--input", "x=ints.npy"], "dtype float64"),           # wrong dtype
    ([], "input 'x'"),                                      # input not given
    (["--input", "x"], "NAME=PATH"),                        # malformed option
    (["--input", "x=x.npy", "--output", "zz=z.npy"], "zz"),  # unknown output name
    (["--input", "x=x.npy", "--bogus"], "--bogus"),          # unknown option
])
def test_bad_input_exits_2(files, args, needle):
    tmp, _ = files
    np.save(tmp / "wrong.npy", np.zeros((5, 8)))
    np.save(tmp / "ints.npy", np.zeros((50, 8), dtype="int64"))
    res = cli("run", "g.yaml", *args, cwd=tmp)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_damaged_input_data_exits_2(files, scheduler):
    tmp, x = files
    store = tmp / "x.zarr"
    arr = zarr.create_array(store, shape=(50, 8), chunks=(25, 8), dtype="float64")
    arr[:] = x
    chunk_files = sorted(p for p in store.rglob("*") if p.is_file() and "c" in p.parts)
    assert chunk_files
    for p in chunk_files:
        p.write_bytes(b"not a zarr chunk")  # readable metadata, unreadable data
    res = cli("run", "g.yaml", "--input", "x=x.zarr", "--scheduler", scheduler, cwd=tmp)
    assert res.returncode == 2, (res.stdout, res.stderr)
    # The run had started (its id is printed first); its failure is one line.
    assert res.stderr.startswith("deepx_flow run ")
    assert without_run_headers(res.stderr) == [res.stderr.splitlines()[-1]]
    assert "x.zarr: chunk (0, 0) is damaged" in res.stderr and "Traceback" not in res.stderr


def test_failure_while_running_exits_1(files, scheduler):
    from distributed import Client

    from deepx_flow.kernels.faults import Fault, FaultInjection
    tmp, _ = files
    with Client(scheduler) as client:
        client.register_plugin(FaultInjection([Fault("raise", node="w")]))
        try:
            res = cli("run", "g.yaml", "--input", "x=x.npy", "--scheduler", scheduler, cwd=tmp)
        finally:
            client.unregister_worker_plugin(FaultInjection.name)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert "failed: operator random_normal (node w)" in res.stderr
    assert "RuntimeError: injected fault in a task of w" in res.stderr


def test_version_is_the_installed_distributions(tmp_path):
    from importlib import metadata
    out = cli("--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == \
        f"deepx-flow {metadata.version('deepx-flow')}"
