"""`deepx-flow serve` as users start it: a real process on loopback, called from this one;
refused on another address without credentials; a wrong token is 401; SIGTERM stops it."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.gateway.graphs import graph_of

SPEC = {"deepx": 1, "inputs": {"x": {"shape": [5, 3], "dtype": "float64"}},
        "nodes": [{"id": "y", "op": "tanh", "args": ["x"]},
                  {"id": "m", "op": "max", "args": ["y"], "attrs": {"axes": [1]}}],
        "outputs": ["m"]}


class Served:
    """`deepx-flow serve` started with `args` in `folder`, its HTTP port read from its
    first line."""

    def __init__(self, folder, *args, env=None):
        environ = {**os.environ, "DEEPX_DB_URL": f"sqlite:///{folder / 'gw.db'}", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "serve", "--http-port", "0",
             "--results", str(folder / "results"), *args],
            cwd=folder, env=environ, stderr=subprocess.PIPE, text=True)
        deadline, line = time.monotonic() + 120, ""
        while "HTTP on" not in line:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}")
            assert time.monotonic() < deadline, "serve did not start"
        self.url = "http://" + re.search(r"HTTP on (\S+)", line).group(1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.timeout(300)
def test_a_served_graph_gives_dx_runs_results_and_sigterm_stops_the_server(tmp_path, client):
    served = Served(tmp_path)
    try:
        x = np.random.default_rng(3).standard_normal((5, 3))
        body = {"graph": SPEC, "inputs": [{"name": "x", "shape": [5, 3], "datatype": "FP64",
                                           "data": x.ravel().tolist()}]}
        answer = httpx.post(served.url + "/v1/graphs:execute", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        [m] = answer.json()["outputs"]
        # another cluster and database (its own measured speeds may pick another engine
        # for tanh): equal to within tanh's rounding, not to the bit
        want = dx.run(graph_of(SPEC, 10), inputs={"x": x}, client=client)["m"]
        np.testing.assert_allclose(np.array(m["data"]), want, rtol=4e-16, atol=0)
        np.testing.assert_allclose(want, np.tanh(x).max(axis=1), rtol=4e-16, atol=0)
    finally:
        assert served.stop() == 0


def test_another_address_without_credentials_is_refused_at_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "serve",
                           "--address", "0.0.0.0", "--http-port", "0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items()
                               if k != "DEEPX_GATEWAY_TOKEN"})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "without authentication" in done.stderr


@pytest.mark.timeout(300)
def test_a_token_is_required_once_set(tmp_path):
    served = Served(tmp_path, env={"DEEPX_GATEWAY_TOKEN": "s3cret"})
    try:
        url = served.url + "/v1/capabilities"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    finally:
        assert served.stop() == 0
