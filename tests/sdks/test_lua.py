"""The Lua SDK (sdks/lua): its busted tests pass with Lua 5.4, those against a real gateway
included (the gateway on loopback in this process); its conformance runner fails a case
whose graph or results differ; a table with one more operator, regenerated, gives it a
method the gateway runs; and the model trained and packaged in Python, called from Lua,
gives Python's answer."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)
from tests.helpers import toolchain
from tests.sdks.test_extra_operator import X, _want, regenerated  # noqa: F401
from tests.sdks.trained_model import trained  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdks" / "lua"


def _lua(script: str, sdk: Path, url: str) -> subprocess.CompletedProcess:
    """A Lua 5.4 script run with the SDK at `sdk` on its module path."""
    lua = toolchain("lua5.4")
    env = {**os.environ, "DEEPX_URL": url, "LUA_PATH": f"{sdk}/?.lua;{sdk}/?/init.lua;;"}
    return subprocess.run([lua, "-e", script], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.timeout(300)
def test_the_sdks_tests_pass_against_a_gateway(http):  # noqa: F811
    lua, busted = toolchain("lua5.4"), toolchain("busted")
    done = subprocess.run([lua, busted, "-o", "json"], cwd=SDK, capture_output=True, text=True,
                          timeout=240,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    counts = {k: len(v) for k, v in json.loads(done.stdout).items() if isinstance(v, list)}
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert counts["failures"] == counts["errors"] == counts["pendings"] == 0, counts
    assert counts["successes"] >= 53, counts


def test_the_runner_fails_a_case_whose_graph_or_results_differ(http, tmp_path):  # noqa: F811
    toolchain("lua5.4")
    case = json.loads((ROOT / "sdks" / "conformance" / "cases" / "op_add.json").read_text())
    (tmp_path / "right.json").write_text(json.dumps(case))
    wrong_graph = json.loads(json.dumps(case))
    wrong_graph["spec"]["nodes"][0]["op"] = "sub"
    (tmp_path / "wrong_graph.json").write_text(json.dumps(wrong_graph))
    wrong_result = json.loads(json.dumps(case))
    wrong_result["expected"]["y"]["data"][0] += 0.001
    (tmp_path / "wrong_result.json").write_text(json.dumps(wrong_result))
    # (a float the stored spec writes as an integer is another graph)
    uniform = json.loads((ROOT / "sdks" / "conformance" / "cases" /
                          "op_random_uniform.json").read_text())
    assert uniform["spec"]["nodes"][0]["attrs"]["low"] == -1.0
    uniform["spec"]["nodes"][0]["attrs"]["low"] = -1
    (tmp_path / "wrong_number.json").write_text(json.dumps(uniform))
    # (-0.0 is not 0.0 where a case is exact)
    signed = json.loads((ROOT / "sdks" / "conformance" / "cases" /
                         "dtype_float32.json").read_text())
    at = [str(v) for v in signed["expected"]["y"]["data"]].index("-0.0")
    signed["expected"]["y"]["data"][at] = 0.0
    (tmp_path / "wrong_zero.json").write_text(json.dumps(signed))
    # (a scenario whose asset reads back other values than it says)
    wrong_read = json.loads((ROOT / "sdks" / "conformance" / "scenarios" /
                             "assets.json").read_text())
    read = next(c for c in wrong_read["scenario"] if c["do"] == "read_asset")
    read["expected"]["data"][2] += 1
    (tmp_path / "wrong_read.json").write_text(json.dumps(wrong_read))
    done = subprocess.run(["bash", str(SDK / "conformance.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "lua http: 1 passed, 5 failed" in done.stdout, done.stdout
    assert "FAILED wrong_graph.json: the graph the steps build" in done.stdout
    assert "FAILED wrong_result.json: y[0]" in done.stdout
    assert "FAILED wrong_number.json: the graph the steps build" in done.stdout
    assert f"FAILED wrong_zero.json: y[{at}]: -0.0, not 0.0" in done.stdout
    assert "FAILED wrong_read.json: call 5 (read_asset): lua_http_numbers[2]" in done.stdout


def test_the_runner_says_when_lua_is_missing(tmp_path):
    bash = shutil.which("bash")
    done = subprocess.run([bash, str(SDK / "conformance.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 3
    assert done.stdout == "lua: not run (lua5.4 is not installed)\n"


def test_this_checkouts_lua_sdk_has_no_softsign():
    assert "softsign" not in (SDK / "deepx" / "generated" / "operators.lua").read_text()


@pytest.mark.timeout(300)
def test_lua_regenerated_has_it_and_the_gateway_runs_it(regenerated):  # noqa: F811
    root, server = regenerated
    done = _lua(f"""
local deepx = require("deepx")
local client = deepx.client(os.getenv("DEEPX_URL"))
client:check_server() -- (the regenerated SDK has the gateway's table)
local g = deepx.graph()
g:output(g:softsign(g:input("x", {{4}}), {{scale = 2}}), "y")
local done = client:execute(g, {{ x = deepx.tensor({{{", ".join(map(repr, X))}}}) }})
print(deepx.json.encode(done.outputs.y.data))
""", root / "sdks" / "lua", server.url)
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(json.loads(done.stdout), _want(2.0), rtol=1e-6)
    # this checkout's SDK finds the gateway's table is another one, and says how
    done = _lua("""
local deepx = require("deepx")
local client = deepx.client(os.getenv("DEEPX_URL"))
local ok, err = pcall(client.check_server, client)
print(err.kind .. ": " .. tostring(err))
""", SDK, server.url)
    assert done.stdout == (f"RemoteError: {server.url} has another operator table than this "
                           "SDK: missing none; not in this SDK softsign (upgrade one side)\n"), \
        done.stdout + done.stderr


@pytest.mark.timeout(600)
def test_the_model_trained_in_python_called_from_lua_gives_pythons_answer(trained):  # noqa: F811
    rows = ", ".join(repr(float(v)) for v in trained.x.ravel())
    done = _lua(f"""
local deepx = require("deepx")
local answer = deepx.client(os.getenv("DEEPX_URL")):infer("{trained.model}", {{
  ["{trained.input}"] = deepx.tensor({{{rows}}}, {{{trained.x.shape[0]}, {trained.x.shape[1]}}}) }})
local out = answer.outputs["{trained.output}"]
print(out.dtype .. " " .. deepx.json.encode(out.shape))
print(deepx.json.encode(out.data))
""", SDK, trained.url)
    assert done.returncode == 0, done.stderr
    said, data = done.stdout.splitlines()
    assert said == f"float32 {json.dumps(list(trained.want.shape), separators=(',', ':'))}"
    got = np.array(json.loads(data), np.float32).reshape(trained.want.shape)
    np.testing.assert_allclose(got, trained.want, rtol=1e-6)
