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
from tests.sdks.wrong_cases import unsaid, write_wrong_cases

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
    said = write_wrong_cases(tmp_path)
    done = subprocess.run(["bash", str(SDK / "conformance.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"lua http: 1 passed, {len(said)} failed" in done.stdout, done.stdout
    assert unsaid(done.stdout, said) == [], done.stdout


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
